"""Shards: `fae run --shard I/N` on any backend, `fae merge`, and the deal they share."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import demo_verifier
import pytest
from fae_helpers import write_checkcovid
from hypothesis import given, settings, strategies as st
from openai_server import LocalOpenAIServer, spawn

from data_prep.records import load_records
from fae.ablation import runio
from fae.ablation.shards import deal, parse_shard, prompt_chars
from fae.cli import main
from real_fae_core.errors import UserError
from real_fae_core.runlock import RunLock

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def records(shared_data, tmp_path_factory):
    return write_checkcovid(shared_data, tmp_path_factory.mktemp("cc") / "checkcovid.jsonl", n=20)


@pytest.fixture(scope="module")
def server():
    with LocalOpenAIServer() as srv:
        yield srv


def fae_args(records, out, base_url, *extra, model="verifier", rounds=3):
    return ["run", "--backend", "openai", "--model", model, "--base-url", base_url, "--records", str(records),
            "--output", str(out), "--rounds", str(rounds), "--no-progress", *extra]


@pytest.fixture(scope="module")
def one_process(records, server, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    assert main(fae_args(records, out, server.base_url)) == 0
    return out


def shard_all(records, out, base_url, n, *extra):
    for i in range(n):
        assert main(fae_args(records, out, base_url, "--shard", f"{i}/{n}", *extra)) == 0


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


# -- the deal ---------------------------------------------------------------------


class Rec:
    def __init__(self, k, n_chars):
        self.id, self.claim, self.sentences = str(k), "x" * n_chars, []


@given(st.lists(st.integers(0, 5000), max_size=60), st.integers(1, 9))
@settings(max_examples=200, deadline=None)
def test_the_deal_partitions_in_record_order_and_balances_prompt_text(sizes, n):
    recs = [Rec(k, s) for k, s in enumerate(sizes)]
    shards = deal(recs, n)
    assert len(shards) == n
    assert sorted(k for s in shards for k in s) == list(range(len(recs)))  # each claim exactly once
    assert all(s == sorted(s) for s in shards)
    assert deal(list(recs), n) == shards  # the same deal on every machine
    loads = [sum(prompt_chars(recs[k]) for k in s) for s in shards]
    if recs:  # longest-first greedy: no shard exceeds another by more than one claim's prompt
        assert max(loads) - min(loads) <= max(prompt_chars(r) for r in recs)


def test_the_deal_beats_a_round_robin_on_skewed_lengths():
    recs = [Rec(k, 1000 if k % 2 == 0 else 10) for k in range(20)]
    loads = [sum(prompt_chars(recs[k]) for k in s) for s in deal(recs, 2)]
    robin = [sum(prompt_chars(r) for r in recs[i::2]) for i in range(2)]
    assert max(loads) - min(loads) < max(robin) - min(robin)


@pytest.mark.parametrize("text", ["2/2", "0/0", "a/b", "1", "-1/2", "3/2", ""])
def test_bad_shard_specs_are_refused(text):
    with pytest.raises(UserError, match="--shard"):
        parse_shard(text)
    assert parse_shard(" 1 / 3 ") == (1, 3)


@pytest.mark.parametrize("argv", [["--shard", "2/2"], ["--shard", "0/0"], ["--shard", "a/b"],
                                  ["--shards", "2"], ["--executor", "spark"]])
def test_bad_shard_flags_exit_2_with_one_line_and_write_nothing(argv, records, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(fae_args(records, out, "http://127.0.0.1:9/v1", *argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fae run: error:"), err
    assert not out.exists()


# -- shards of a real run ---------------------------------------------------------


def test_two_shards_merged_equal_one_process(records, server, one_process, tmp_path, capsys):
    out = tmp_path / "run"
    shard_all(records, out, server.base_url, 2)
    assert "when all 2 shards are: fae merge" in capsys.readouterr().err
    assert not (out / "claims.jsonl").exists()
    with pytest.raises(UserError, match="fae merge"):
        runio.load_run(out / "shards" / "0-of-2")
    ids = [lines(out / "shards" / f"{i}-of-2" / "claims.jsonl") for i in (0, 1)]
    assert ids[0] and ids[1] and not {c["id"] for c in ids[0]} & {c["id"] for c in ids[1]}
    assert main(["merge", str(out)]) == 0
    assert lines(out / "claims.jsonl") == lines(one_process / "claims.jsonl")  # record order, same rounds
    # the test server's verifier answers every round-1 pool (SUPPORT citing what is left, or NEI)
    demo_verifier.assert_ablated_rounds_generated(lines(out / "claims.jsonl"), per_claim=1, control_per_claim=0)
    got, want = (json.loads((d / "metrics.json").read_text()) for d in (out, one_process))
    assert {k: v for k, v in got.items() if k != "computed_from"} == \
        {k: v for k, v in want.items() if k != "computed_from"}
    run = runio.load_run(out)  # the merged directory is one finished run for every reader
    assert run.config["shards"]["count"] == 2 and len(run.claims) == 20
    assert main(["merge", str(out)]) == 0  # merging again is harmless
    assert lines(out / "claims.jsonl") == lines(one_process / "claims.jsonl")


def test_merge_refuses_a_missing_partial_or_foreign_shard(records, server, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(fae_args(records, out, server.base_url, "--shard", "0/3")) == 0
    capsys.readouterr()

    def refused(pattern):
        capsys.readouterr()
        assert main(["merge", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and pattern in err[0], err
        assert not (out / "claims.jsonl").exists() and not (out / "metrics.json").exists()

    refused("shard 1/3 is missing")
    assert main(fae_args(records, out, server.base_url, "--shard", "1/3", "--limit", "20")) == 0
    # a shard run under other settings: another model answers, so it is another run
    assert main(fae_args(records, out, server.base_url, "--shard", "2/3", model="other")) == 0
    refused("shard 2/3 is from a different run than shard 0/3 (model 'verifier' vs 'other')")
    shutil_rm(out / "shards" / "2-of-3")
    assert main(fae_args(records, out, server.base_url, "--shard", "2/3")) == 0
    part = out / "shards" / "1-of-3" / "claims.jsonl"
    kept = part.read_text().splitlines(keepends=True)
    part.write_text("".join(kept[:-2]))  # as if killed two claims before its end
    refused(f"shard 1/3 is partial ({len(kept) - 2} of {len(kept)} claims); finish it with: fae run")
    assert main(fae_args(records, out, server.base_url, "--shard", "1/3", "--limit", "20")) == 0
    assert main(["merge", str(out)]) == 0
    assert len(lines(out / "claims.jsonl")) == 20


def shutil_rm(path):
    import shutil

    shutil.rmtree(path)


def test_a_shard_of_another_split_or_settings_is_refused_on_resume(records, server, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(fae_args(records, out, server.base_url, "--shard", "0/2")) == 0
    assert main(fae_args(records, out, server.base_url, "--shard", "0/2", rounds=2)) == 2
    assert "rounds: 3 -> 2" in capsys.readouterr().err
    assert main(fae_args(records, out, server.base_url, "--shard", "0/3")) == 0
    assert main(["merge", str(out)]) == 2
    assert "shards of different splits (of 2, of 3)" in capsys.readouterr().err
    # a plain run into the directory takes the finished shard claims of the same run as done
    assert main(fae_args(records, out, server.base_url)) == 0
    assert len(lines(out / "claims.jsonl")) == 20
    assert "claims to do (" in capsys.readouterr().err


def test_two_processes_writing_one_shard(records, server, tmp_path, capsys):
    out = tmp_path / "run"
    with RunLock(out / "shards" / "1-of-2", "fae run --shard 1/2", is_dir=True):
        assert main(fae_args(records, out, server.base_url, "--shard", "1/2")) == 2
        err = capsys.readouterr().err
        assert "1-of-2 is in use by fae run --shard 1/2" in err
        assert not (out / "shards" / "1-of-2" / "claims.jsonl").exists()
        # another shard of the same run is free to run meanwhile
        assert main(fae_args(records, out, server.base_url, "--shard", "0/2")) == 0


@pytest.mark.slow
def test_a_shard_killed_mid_run_resumes_alone(records, tmp_path, one_process):
    """SIGKILL one shard's process mid-run; rerunning that shard alone completes the run unchanged."""
    srv, base_url = spawn("--latency", "0.05", "--role", "verifier")
    try:
        out = tmp_path / "run"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        assert main(fae_args(records, out, base_url, "--shard", "0/2")) == 0
        cmd = [sys.executable, "-m", "fae.cli", *fae_args(records, out, base_url, "--shard", "1/2",
                                                          "--concurrency", "1")]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
        part = out / "shards" / "1-of-2" / "claims.jsonl"
        deadline = time.time() + 120
        while not (part.exists() and part.read_text().count("\n") >= 2):
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stderr.close()
        n_killed = len(runio.read_claims(part))
        mine = json.loads((out / "shards" / "1-of-2" / "config.json").read_text())["shard"]["claim_ids"]
        assert 2 <= n_killed < len(mine)
        res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        assert f"[shard 1/2] {len(mine) - n_killed} claims to do" in res.stderr
        assert main(["merge", str(out)]) == 0
        assert lines(out / "claims.jsonl") == lines(one_process / "claims.jsonl")
    finally:
        srv.terminate()
        srv.wait(timeout=30)


@pytest.fixture(scope="module")
def demo_records(tmp_path_factory):
    return demo_verifier.write_records(tmp_path_factory.mktemp("demo") / "records.jsonl", 12)


@pytest.mark.slow
def test_hf_shards_merged_equal_one_process(demo_records, tmp_path):
    """The deal is backend-free: the same split for hf gives the one-process answers, round by round. The
    verifier is the demo's base model (tests/demo_verifier.py): valid at round 0 and finding another copy
    of its line at each round, so the rounds compared were generated on ablated pools, not copied."""
    def args(out, *extra):
        return demo_verifier.fae_run_args(demo_records, out, "--batch-size", "4", *extra)

    assert main(args(tmp_path / "one")) == 0
    for i in range(2):
        assert main(args(tmp_path / "sharded", "--shard", f"{i}/2")) == 0
    parts = [lines(tmp_path / "sharded" / "shards" / f"{i}-of-2" / "claims.jsonl") for i in (0, 1)]
    assert main(["merge", str(tmp_path / "sharded")]) == 0
    got, want = lines(tmp_path / "sharded" / "claims.jsonl"), lines(tmp_path / "one" / "claims.jsonl")
    assert got == want  # labels, cited ids, raw outputs, control and gold-only answers of every round
    assert [c["id"] for c in got] == [r.id for r in load_records(demo_records)]
    merged, one = ({k: v for k, v in json.loads((tmp_path / d / "metrics.json").read_text()).items()
                    if k != "computed_from"} for d in ("sharded", "one"))
    assert merged == one
    demo_verifier.assert_ablated_rounds_generated(want)
    for part in parts:  # each shard generated ablated rounds of its own claims
        demo_verifier.assert_ablated_rounds_generated(part)


# -- fae merge as a function, and two merge defects --------------------------------


def test_fae_merge_as_a_function_merges_like_the_command_line(records, server, tmp_path, capsys):
    import shutil

    from fae.ablation.merge import MergeConfig, run

    out = tmp_path / "run"
    shard_all(records, out, server.base_url, 2)
    shutil.copytree(out, tmp_path / "copy")
    assert main(["merge", str(out)]) == 0
    res = run(MergeConfig(run_dir=tmp_path / "copy", shards=2))
    assert res.ok and res.outputs["claims"] == str(tmp_path / "copy" / "claims.jsonl")
    assert lines(tmp_path / "copy" / "claims.jsonl") == lines(out / "claims.jsonl")
    metrics = json.loads((out / "metrics.json").read_text())
    assert res.summary["shards"] == 2 and res.summary["n_claims"] == 20
    assert res.summary["metrics"]["IS"] == metrics["IS"] and res.summary["metrics"]["n_claims"] == 20
    with pytest.raises(UserError, match=r"^MergeConfig: shards: must be >= 1, got 0$"):
        MergeConfig(run_dir=out, shards=0)


def test_merge_reads_each_claims_file_once(records, server, tmp_path, monkeypatch, capsys):
    from collections import Counter

    from fae.ablation import shards

    out = tmp_path / "run"
    shard_all(records, out, server.base_url, 2)
    reads = Counter()
    read_claims = runio.read_claims

    def counting(path, **kw):
        reads[Path(path).relative_to(out).as_posix()] += 1
        return read_claims(path, **kw)

    monkeypatch.setattr(runio, "read_claims", counting)
    config, claims = shards.merge(out, command="fae merge")
    assert len(claims) == 20 == len(config["claim_ids"])
    assert reads == {"claims.jsonl": 1, "shards/0-of-2/claims.jsonl": 1, "shards/1-of-2/claims.jsonl": 1}
    monkeypatch.undo()
    assert lines(out / "claims.jsonl") == claims  # record order, each claim once


def test_merge_names_a_shard_whose_run_was_refused_before_it_started(records, server, one_process, tmp_path,
                                                                     capsys):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(one_process, out)  # a finished single-process run of the same records
    assert main(fae_args(records, out, server.base_url, "--shard", "0/2")) == 0  # its claims count as done
    # another setting: refused against the run's own claims, after the shard's directory was made
    assert main(fae_args(records, out, server.base_url, "--shard", "1/2", rounds=2)) == 2
    assert "rounds" in capsys.readouterr().err
    empty = out / "shards" / "1-of-2"
    assert empty.is_dir() and not (empty / "config.json").exists()
    assert main(["merge", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no config.json" not in err[0], err
    assert f"{empty}: shard 1/2 never started" in err[0], err
    command = err[0].split("; run it with: ")[1]
    assert "--shard 1/2" in command and "--rounds 3" in command, err  # shard 0's settings, not the refused ones
    # running that command completes the split
    assert main(fae_args(records, out, server.base_url, "--shard", "1/2")) == 0
    assert main(["merge", str(out)]) == 0
    assert lines(out / "claims.jsonl") == lines(one_process / "claims.jsonl")
