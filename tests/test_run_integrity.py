"""Run integrity: every number `fae report` / `fae compare` / `fae probe` shows belongs to
the run directory it reads (issue #11 items 1-4, #12 `fae run` inputs, #13 items 4 and 6).

Real parts only: `fae run` in real subprocesses against a real local OpenAI-compatible
server, a tiny model built in code, Check-COVID records from the shared data.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fae_helpers import write_checkcovid
from openai_server import LocalOpenAIServer

from fae.ablation import runio
from fae.ablation.engine import RoundProgress
from fae.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def records_file(shared_data, tmp_path_factory):
    return write_checkcovid(shared_data, tmp_path_factory.mktemp("cc") / "cc.jsonl", n=6)


@pytest.fixture(scope="module")
def server():
    with LocalOpenAIServer() as srv:
        yield srv


def openai_args(records, out, base_url, *extra):
    return ["run", "--backend", "openai", "--model", "verifier", "--base-url", base_url,
            "--records", str(records), "--output", str(out), "--rounds", "2", "--concurrency", "2",
            "--request-timeout", "5", "--backoff-base", "0.01", "--no-progress", *extra]


def env():
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def one_error_line(err: str, fragment: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err, err
    hits = [x for x in lines if fragment in x]
    assert len(hits) == 1, err
    return hits[0]


# ---------------------------------------------------------------------------
# 1. one writer per run directory
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_second_writer_stops_at_once_and_a_killed_holder_is_taken_over(records_file, tmp_path):
    out = tmp_path / "run"
    with LocalOpenAIServer(latency=0.4) as slow:
        first = subprocess.Popen([sys.executable, "-m", "fae.cli", *openai_args(records_file, out, slow.base_url,
                                                                                "--concurrency", "1")],
                                 cwd=REPO, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 60
            while time.time() < deadline:  # the lock file names its holder once it is held
                lock = out / ".lock"
                if lock.is_file() and f'"pid": {first.pid}' in lock.read_text():
                    break
                assert first.poll() is None
                time.sleep(0.02)
            t = time.time()
            # another adapter / model into the same directory: the case of issue #11 item 1
            second = subprocess.run([sys.executable, "-m", "fae.cli",
                                     *openai_args(records_file, out, slow.base_url, "--model", "other")],
                                    cwd=REPO, env=env(), capture_output=True, text=True, timeout=60)
            assert second.returncode == 2
            assert time.time() - t < 30  # at once: no waiting for the holder
            line = one_error_line(second.stderr, "is in use by fae run")
            assert f"(pid {first.pid} on host " in line and ", since " in line
            assert first.poll() is None, "the first run must still be running when the second is refused"
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            assert json.loads((out / "config.json").read_text())["model"] == "verifier"
            kept = len(runio.read_claims(out / "claims.jsonl"))
            assert kept < 6
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        third = subprocess.run([sys.executable, "-m", "fae.cli", *openai_args(records_file, out, slow.base_url)],
                               cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr
    assert f"{6 - kept} claims to do ({kept} already in" in third.stderr
    assert runio.load_run(out).metrics["computed_from"]["n_claims"] == 6


# ---------------------------------------------------------------------------
# 2. the fingerprint
# ---------------------------------------------------------------------------


def test_orphan_answers_are_refused(records_file, server, tmp_path, capsys):
    ref = tmp_path / "ref"
    assert main(openai_args(records_file, ref, server.base_url)) == 0
    orphan = tmp_path / "orphan"
    orphan.mkdir()
    (orphan / "claims.jsonl").write_bytes((ref / "claims.jsonl").read_bytes())
    capsys.readouterr()
    assert main(openai_args(records_file, orphan, server.base_url)) == 2
    one_error_line(capsys.readouterr().err, "holds finished claims but no config.json")
    assert not (orphan / "config.json").exists()
    for cmd in (["report", str(orphan), "--output", str(tmp_path / "rep")],
                ["compare", str(ref), str(orphan), "--output", str(tmp_path / "cmp")]):
        assert main(cmd) == 2
        one_error_line(capsys.readouterr().err, "claims without a config.json")


def test_a_directory_with_config_but_no_finished_claim_restarts_freely(records_file, server, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model": "typo", "rounds": 9}))
    assert main(openai_args(records_file, out, server.base_url)) == 0
    assert json.loads((out / "config.json").read_text())["model"] == "verifier"


def test_each_differing_setting_is_named(records_file, server, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(openai_args(records_file, out, server.base_url)) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name not in ("runs.jsonl", ".lock")}
    capsys.readouterr()
    assert main(openai_args(records_file, out, server.base_url, "--rounds", "3", "--max-new-tokens", "9")) == 2
    line = one_error_line(capsys.readouterr().err, "holds a run with different settings")
    assert "rounds: 2 -> 3" in line and "decoding:" in line and "max_new_tokens" in line
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name not in ("runs.jsonl", ".lock")}
    assert after == before  # a refused run touches nothing


def test_adapter_content_is_part_of_the_fingerprint(tmp_path):
    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    (adapter / "adapter_model.safetensors").write_bytes(b"weights-1")
    (adapter / "README.md").write_text("model card")
    first = runio.adapter_sha256(adapter)
    (adapter / "README.md").write_text("edited model card")
    assert runio.adapter_sha256(adapter) == first  # only weights and config count
    (adapter / "adapter_model.safetensors").write_bytes(b"weights-2")  # retrained at the same path
    second = runio.adapter_sha256(adapter)
    assert second != first
    cfg = {"records_sha256": "x", "backend": "hf", "model": "m", "adapter": str(adapter),
           "adapter_sha256": first, "rounds": 4, "decoding": {}, "prompt_format_version": 1,
           **runio.claim_set(["a"])}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runio.write_json_atomic(run_dir / "config.json", cfg)
    with pytest.raises(runio.UserError, match="adapter content: .*lora"):
        runio.check_resume(run_dir, dict(cfg, adapter_sha256=second))
    moved = dict(cfg, adapter="/elsewhere/lora")  # same content under another path resumes
    assert runio.check_resume(run_dir, moved)


# ---------------------------------------------------------------------------
# 3 + 4. derived files and the claim set
# ---------------------------------------------------------------------------


def test_limit_smaller_is_refused_larger_extends_and_readers_agree(records_file, server, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(openai_args(records_file, out, server.base_url, "--limit", "4")) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_claims"] == 4
    capsys.readouterr()
    # a smaller claim set over a finished run: refused (before: 4 claims kept, metrics over 2)
    assert main(openai_args(records_file, out, server.base_url, "--limit", "2")) == 2
    one_error_line(capsys.readouterr().err, "claim set: 4 claims -> 2 claims")
    assert json.loads((out / "metrics.json").read_text()) == metrics
    # a larger one keeps the 4 finished claims and adds 2
    assert main(openai_args(records_file, out, server.base_url)) == 0
    assert "2 claims to do (4 already in" in capsys.readouterr().err
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["n_claims"] == 6 and len(cfg["claim_ids"]) == 6
    assert json.loads((out / "metrics.json").read_text())["n_claims"] == 6
    assert main(["compare", str(out), str(out), "--output", str(tmp_path / "cmp"), "--bootstrap", "50"]) == 0
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text())["n_claims"] == 6
    assert main(["report", str(out), "--output", str(tmp_path / "rep"), "--names", "R"]) == 0
    assert "| R | 6 |" in (tmp_path / "rep" / "report.md").read_text()


def test_a_killed_rerun_leaves_no_old_numbers_and_readers_refuse(records_file, tmp_path, capsys):
    """The old run's metrics.json must not survive into a run that did not finish."""
    out = tmp_path / "run"
    with LocalOpenAIServer() as srv:
        assert main(openai_args(records_file, out, srv.base_url, "--limit", "3")) == 0
    assert (out / "metrics.json").is_file() and (out / "report.md").is_file()
    from openai_server import claim_of

    from data_prep.records import load_records

    doomed = " ".join(load_records(records_file)[4].claim.split())
    with LocalOpenAIServer(faults=lambda body, attempt: "500" if claim_of(body) == doomed else None) as srv:
        assert main(openai_args(records_file, out, srv.base_url, "--max-retries", "0")) == 1
    for name in runio.DERIVED:
        assert not (out / name).exists(), name
    capsys.readouterr()
    for cmd in (["report", str(out), "--output", str(tmp_path / "rep")],
                ["compare", str(out), str(out), "--output", str(tmp_path / "cmp")],
                ["probe", str(out), "--model", "unused", "--output", str(tmp_path / "probe")]):
        assert main(cmd) == 2, cmd
        line = one_error_line(capsys.readouterr().err, "unfinished run")
        assert "claims missing" in line and "rerun `fae run" in line


def test_metrics_that_do_not_match_the_claims_are_refused(records_file, server, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(openai_args(records_file, out, server.base_url)) == 0
    lines = (out / "claims.jsonl").read_text().splitlines(keepends=True)
    claim = json.loads(lines[0])
    claim["rounds"][0]["label"] = "REFUTE" if claim["rounds"][0]["label"] != "REFUTE" else "SUPPORT"
    (out / "claims.jsonl").write_text(json.dumps(claim) + "\n" + "".join(lines[1:]))
    capsys.readouterr()
    for cmd in (["report", str(out), "--output", str(tmp_path / "rep")],
                ["compare", str(out), str(out), "--output", str(tmp_path / "cmp")]):
        assert main(cmd) == 2
        line = one_error_line(capsys.readouterr().err, "metrics.json does not match claims.jsonl")
        assert "rerun `fae run " in line


# ---------------------------------------------------------------------------
# 5 + 6. flush per batch, SIGTERM, plain progress lines
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_keeps_every_finished_batch_logs_the_run_and_says_how_to_resume(shared_data, noisy_llama,
                                                                                tmp_path):
    records = write_checkcovid(shared_data, tmp_path / "cc.jsonl", n=12)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fae.cli", "run", "--records", str(records), "--output", str(out),
           "--model", str(noisy_llama), "--rounds", "2", "--batch-size", "1", "--max-new-tokens", "16"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    claims_file = out / "claims.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:  # claims appear as they finish, not after 256 of them
        if claims_file.exists() and claims_file.read_bytes().count(b"\n") >= 2:
            break
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == 143, err
    kept = len(runio.read_claims(claims_file))
    assert 2 <= kept < 12
    line = one_error_line(err, "fae run: terminated")
    assert f"; {kept} of 12 claims kept in {out}; resume with: fae run --records" in line
    assert "\r" not in err  # stderr is a pipe: plain progress lines, no redrawn bars
    log = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert log[-1]["error"] == "terminated (SIGTERM)" and log[-1]["claims"] == kept
    kept_rounds = [rd for c in runio.read_claims(claims_file) for rd in c["rounds"]]
    assert log[-1]["model_calls"] == sum(not rd["reused"] for rd in kept_rounds) > 0  # counts of what was kept
    assert log[-1]["model_calls"] + log[-1]["reused_calls"] == len(kept_rounds)
    resume = line.split("resume with: ", 1)[1]
    assert resume.startswith("fae run ")
    res = subprocess.run([sys.executable, "-m", "fae.cli", *resume.split()[1:]], cwd=REPO, env=env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"{12 - kept} claims to do ({kept} already in" in res.stderr
    assert f"round 0: {12 - kept}/{12 - kept} claims (100%)" in res.stderr  # plain lines, named rounds
    assert runio.load_run(out).metrics["computed_from"]["n_claims"] == 12


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_non_tty_progress_is_one_plain_line_per_round_every_few_seconds():
    stream, clock = io.StringIO(), _Clock()
    bars = RoundProgress(10, 2, stream=stream, interval=5.0, clock=clock)
    bars.update(0, 4)
    assert stream.getvalue() == ""  # not before the interval
    clock.t = 6.0
    bars.update(1, 2)
    assert stream.getvalue().splitlines() == [
        "round 0: 4/10 claims (40%), 0.67 claims/s, ETA 9s",
        "round 1: 2/10 claims (20%), 0.33 claims/s, ETA 24s",
    ]
    clock.t = 7.0
    bars.update(0, 6)  # within the interval: nothing yet
    assert len(stream.getvalue().splitlines()) == 2
    bars.close()  # a last line for every round that moved
    assert stream.getvalue().splitlines()[2:] == ["round 0: 10/10 claims (100%), 1.43 claims/s, done"]
    assert "\r" not in stream.getvalue()


def test_tty_progress_keeps_tqdm_bars_named_by_round():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    bars = RoundProgress(4, 1, stream=stream)
    bars.update(1, 2)
    bars.close()
    assert "\r" in stream.getvalue() and "round 1" in stream.getvalue()


# ---------------------------------------------------------------------------
# 7. bad `fae run` inputs: one line, exit 2, no traceback
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def foreign_adapter(tmp_path_factory):
    """A LoRA adapter trained (saved) on a tiny Llama with hidden size 32, not the fixture's 64."""
    from probe_data import make_lora_adapter
    from tiny_models import build_tiny_model

    root = tmp_path_factory.mktemp("foreign")
    base = build_tiny_model(root / "base32", "llama", hidden_size=32, intermediate_size=64)
    return make_lora_adapter(Path(base), root / "lora")


BAD_INPUTS = [
    # (name, extra args / setup, exit code, message fragment)
    ("device", ["--device", "tpu9"], 2, "--device 'tpu9' is not a device"),
    ("config-dir", ["--config", "{tmp}"], 2, "is a directory, not a YAML file"),
    ("config-duplicate-key", ["--config", "{dup}"], 2, "key 'rounds' is given twice (lines 1 and 2)"),
    ("output-file", ["--output", "{file}"], 2, "is a file; give a run directory"),
    ("records-dir", ["--records", "{tmp}"], 2, "is a directory; give the records .jsonl file"),
    ("adapter-other-base", ["--adapter", "{adapter}"], 2, "does not fit model"),
]


@pytest.mark.parametrize("name,extra,code,fragment", BAD_INPUTS, ids=[r[0] for r in BAD_INPUTS])
def test_bad_run_inputs_are_one_line(name, extra, code, fragment, records_file, tiny_llama, tmp_path, capsys,
                                     request):
    dup = tmp_path / "dup.yaml"
    dup.write_text("rounds: 2\nrounds: 5\n")
    file = tmp_path / "a-file"
    file.write_text("x")
    subs = {"{tmp}": str(tmp_path), "{dup}": str(dup), "{file}": str(file)}
    if name == "adapter-other-base":
        subs["{adapter}"] = str(request.getfixturevalue("foreign_adapter"))
    argv = ["run", "--records", str(records_file), "--output", str(tmp_path / "run"), "--model", str(tiny_llama),
            "--rounds", "1", "--max-new-tokens", "4", "--no-progress"]
    for a in extra:
        argv.append(subs.get(a, a))
    assert main(argv) == code
    line = one_error_line(capsys.readouterr().err, fragment)
    assert line.startswith("fae run: error: ")
    if name == "adapter-other-base":
        assert "base32" in line  # names the base model the adapter was trained on
    assert not (tmp_path / "run" / "claims.jsonl").exists()


# ---------------------------------------------------------------------------
# 5. the engine writes each claim as soon as it is done (no waiting for a chunk)
# ---------------------------------------------------------------------------


def test_a_finished_claim_is_written_after_one_backend_call_not_after_its_chunk():
    # "quick" answers garbage once: its pool never changes, rounds 1..3 are reused -> done after 1 call.
    # Every other claim cites one line per round: 4 calls each.
    from dataclasses import replace

    from fae_helpers import Scripted, rec

    from fae.ablation.engine import run_ablation

    gen = Scripted({"Quick claim.": lambda ids: "no idea"})
    recs = [replace(rec("quick"), claim="Quick claim."), rec("slow-1"), rec("slow-2"), rec("slow-3")]
    calls_at_write, sizes = [], []

    def generate(prompts, callback=None):
        sizes.append(len(prompts))
        return gen(prompts, callback)

    written = []

    def write(claims):
        calls_at_write.append(len(sizes))
        written.extend(c["id"] for c in claims)

    stats = run_ablation(recs, generate, 3, write, chunk_size=2, progress=False)
    assert calls_at_write[0] == 1  # written after its first round call, not after all 4
    assert max(sizes) <= 2  # never more than chunk_size claims in flight
    assert written == ["quick", "slow-1", "slow-2", "slow-3"]
    assert stats["claims"] == 4 and stats["model_calls"] == 1 + 3 * 4


# ---------------------------------------------------------------------------
# 1. pave, probe and neurons hold the lock on their output too
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["pave", "probe", "neurons"])
def test_every_writer_command_stops_when_its_output_is_locked(command, records_file, tmp_path, capsys):
    from probe_data import make_records, make_run_dir, write_jsonl

    from real_fae_core.runlock import RunLock

    toy = write_jsonl(tmp_path / "toy.jsonl", make_records(4))
    run_dir = make_run_dir(tmp_path / "fae-run", toy, make_records(4))
    out = tmp_path / "out"
    argv = {
        "pave": ["pave", "--records", str(records_file), "--model", "m", "--output", str(out)],
        "probe": ["probe", str(run_dir), "--model", "m", "--output", str(out)],
        "neurons": ["neurons", "--records", str(toy), "--model", "m", "--output", str(out)],
    }[command]
    with RunLock(out, "fae run --output out", is_dir=True):  # another writer holds it (own open file)
        assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err, "is in use by fae run --output out")
    assert line.startswith(f"fae {command}: error: ") and f"(pid {os.getpid()} on host " in line
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # nothing else written


# ---------------------------------------------------------------------------
# the run reader never crashes: a clear error or a run
# ---------------------------------------------------------------------------


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_GOOD = {"id": "a", "gold_label": "SUPPORT", "gold_groups": [[0]], "rounds": [{"round": 0, "pool_ids": [0]}]}


@settings(derandomize=True, max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(claims=st.one_of(st.binary(max_size=300),
                        st.lists(st.sampled_from([json.dumps(_GOOD), "[" * 5000, '{"id": [1], "rounds": 3}',
                                                  '{"id": "b", "rounds": []}', "\udcff", "null", "\xff"]),
                                 max_size=4).map(lambda xs: "\n".join(xs).encode("utf-8", "surrogateescape"))),
       config=st.sampled_from(['{"claim_ids": ["a"]}', '{"claim_ids": "a"}', "[]", "{", '{"claim_ids": [["a"]]}']),
       metrics=st.sampled_from([None, "{}", '{"computed_from": 3}', "\xff", '{"computed_from": {"n_claims": 1}}']))
def test_run_reader_gives_a_run_or_one_clear_error(tmp_path, claims, config, metrics):
    d = tmp_path / "run"
    d.mkdir(exist_ok=True)
    (d / "claims.jsonl").write_bytes(claims)
    (d / "config.json").write_bytes(config.encode("utf-8", "surrogateescape"))
    (d / "metrics.json").unlink(missing_ok=True)
    if metrics is not None:
        (d / "metrics.json").write_bytes(metrics.encode("latin-1"))
    try:
        run = runio.load_run(d)
    except runio.UserError as exc:
        assert "\n" not in str(exc) and str(d) in str(exc)
    else:
        assert [c["id"] for c in run.claims] == ["a"]
