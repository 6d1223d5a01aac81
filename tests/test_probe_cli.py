"""`fae run` -> `fae probe` -> `fae probe-report` end to end on tiny models.

The main chain uses the real `fae run`: once with a scripted verifier served
by the local OpenAI-compatible server (so pools really shrink round by round)
and once with the hf backend on the tiny model itself (a random model cites
nothing, so every DirK is undefined: the degenerate path end to end). Error
tests use hand-built run directories that follow the same contract.
"""

import json

import numpy as np
import pytest
from openai_server import LocalOpenAIServer, claim_of, pool_lines
from probe_data import make_lora_adapter, make_records, make_run_dir, write_jsonl

from fae.cli import main
from fae.probes.runner import load_states

SILENT_CLAIM = "Grass is green."  # claim of record c4: the scripted verifier never cites


def scripted_verifier(body: dict) -> str:
    """Cites the first two lines still in the pool; NEI once the pool is empty."""
    ids = sorted(pool_lines(body))[:2]
    if not ids or claim_of(body) == SILENT_CLAIM:
        return json.dumps({"label": "NOT_ENOUGH_INFO", "evidence": []})
    return json.dumps({"label": "SUPPORT", "evidence": ids})


def _probe(run, model, out, *extra):
    rc = main(["probe", str(run), "--model", str(model), "--output", str(out),
               "--bootstrap", "500", "--batch-size", "3", *extra])
    assert rc == 0
    return json.loads((out / "dirk.json").read_text())


@pytest.mark.slow
def test_fae_run_then_probe_then_report(tiny_llama, tmp_path, capsys):
    recs = make_records(5)
    records = write_jsonl(tmp_path / "eval.jsonl", recs)
    run_dir = tmp_path / "run"
    with LocalOpenAIServer(responder=scripted_verifier) as srv:
        assert main(["run", "--backend", "openai", "--base-url", srv.base_url, "--model", "verifier",
                     "--records", str(records), "--output", str(run_dir), "--rounds", "3",
                     "--no-progress"]) == 0
    adapter = make_lora_adapter(tiny_llama, tmp_path / "lora")
    base = _probe(run_dir, tiny_llama, tmp_path / "p_base")
    lora = _probe(run_dir, tiny_llama, tmp_path / "p_lora", "--adapter", str(adapter))
    out = tmp_path / "p_base"
    assert {p.name for p in out.iterdir()} == {"dirk.json", "dirk_claims.jsonl",
                                              "states.safetensors", ".lock",  # .lock: the writer lock
                                              ".real-fae-output"}  # the output guard's marker

    # Summary: rounds 1..3; the silent claim c4 never changes its pool -> undefined.
    assert [r["round"] for r in base["rounds"]] == [1, 2, 3]
    assert all(r["n"] == 4 and r["n_undefined"] == 1 for r in base["rounds"])
    assert base["n_claims"] == 5 and base["n_unique_prompts"] < base["n_prompts"]
    for r in base["rounds"]:
        assert -1 <= r["ci_low"] <= r["mean"] <= r["ci_high"] <= 1

    # Per-claim file agrees with the run and with the summary.
    run_claims = {json.loads(x)["id"]: json.loads(x)
                  for x in (run_dir / "claims.jsonl").read_text().splitlines()}
    claims = [json.loads(x) for x in (out / "dirk_claims.jsonl").read_text().splitlines()]
    by_id = {c["id"]: c for c in claims}
    assert by_id["c4"]["dirk"] == [None] * 4 and by_id["c4"]["undefined_rounds"] == [1, 2, 3]
    for c in claims:
        assert c["pool_sizes"] == [len(r["pool_ids"]) for r in run_claims[c["id"]]["rounds"]]
    assert by_id["c0"]["pool_sizes"] == [3, 1, 0, 0]  # the run really ablated
    for r in base["rounds"]:
        vals = [c["dirk"][r["round"]] for c in claims if c["dirk"][r["round"]] is not None]
        assert r["mean"] == pytest.approx(np.mean(vals))

    # The saved float16 states reproduce every per-claim value.
    st = load_states(out / "states.safetensors")
    assert st["ids"] == [c["id"] for c in claims] and st["hr"].shape[:2] == (5, 4)
    for i, c in enumerate(claims):
        h0, hK = st["hr"][i, 0], st["hK"][i]
        for r in range(1, 4):
            d = st["hr"][i, r] - h0
            if c["dirk"][r] is None:
                assert np.allclose(d, 0)
                continue
            k = hK - h0
            assert d @ k / np.linalg.norm(d) / np.linalg.norm(k) == pytest.approx(
                c["dirk"][r], abs=5e-3)

    # The adapter changes the states, hence DirK.
    assert lora["adapter"] == str(adapter)
    assert lora["rounds"][0]["mean"] != pytest.approx(base["rounds"][0]["mean"], abs=1e-6)

    capsys.readouterr()
    rep = tmp_path / "report"
    assert main(["probe-report", str(tmp_path / "p_base"), str(tmp_path / "p_lora"),
                 "--names", "base", "REAL", "--output", str(rep)]) == 0
    png = (rep / "dirk.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    md = (rep / "dirk.md").read_text()
    assert "| round | base | REAL |" in md
    for probe in (base, lora):
        for r in probe["rounds"]:
            assert f"{r['mean']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" in md
    # the same probes read on one common subset: here both ran on the same run, so the subset is every
    # claim defined in both, and each column's n is that subset's size
    common = json.loads((rep / "dirk_common.json").read_text())
    assert "## On one common subset" in md and common["labels"] == ["base", "REAL"]
    for r in common["rounds"]:
        assert {c["n"] for c in r["cells"]} == {r["n"]}
        assert r["n"] <= min(next(x["n"] for x in p["rounds"] if x["round"] == r["round"]) for p in (base, lora))


@pytest.mark.slow
def test_fae_run_hf_backend_then_probe(tiny_qwen, tmp_path, capsys):
    """The probed model is the verifier itself; pools that never change give nulls, not NaN."""
    records = write_jsonl(tmp_path / "eval.jsonl", make_records(2))
    run_dir = tmp_path / "run"
    assert main(["run", "--records", str(records), "--output", str(run_dir), "--model",
                 str(tiny_qwen), "--rounds", "2", "--max-new-tokens", "8", "--no-progress"]) == 0
    res = _probe(run_dir, tiny_qwen, tmp_path / "p")
    run_claims = [json.loads(x) for x in (run_dir / "claims.jsonl").read_text().splitlines()]
    unchanged = sum(rd["pool_ids"] == c["rounds"][0]["pool_ids"]
                    for c in run_claims for rd in c["rounds"][1:2])
    r1 = res["rounds"][0]
    assert r1["n_undefined"] == unchanged and r1["n"] == 2 - unchanged
    assert "NaN" not in (tmp_path / "p" / "dirk.json").read_text()
    assert main(["probe-report", str(tmp_path / "p"), "--output", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "dirk.png").is_file()


@pytest.fixture
def run_dir(tmp_path):
    """A hand-built run directory (same contract as `fae run`) for the error tests."""
    recs = make_records(4)
    records = write_jsonl(tmp_path / "eval.jsonl", recs)
    return make_run_dir(tmp_path / "run", records, recs, rounds=3, silent=("c3",))


def test_probe_checks_records_and_pools(run_dir, tiny_qwen, tmp_path, capsys):
    records = tmp_path / "eval.jsonl"
    # A different records file than the run read: sha256 mismatch, one clear line.
    other = write_jsonl(tmp_path / "other.jsonl", make_records(5))
    assert main(["probe", str(run_dir), "--model", str(tiny_qwen), "--records",
                 str(other), "--output", str(tmp_path / "o")]) == 2
    assert "does not match records_sha256" in capsys.readouterr().err

    # A pool id the record does not have: error names claims.jsonl line and field.
    lines = (run_dir / "claims.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["rounds"][2]["pool_ids"] = [999]
    lines[1] = json.dumps(row)
    (run_dir / "claims.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["probe", str(run_dir), "--model", str(tiny_qwen),
                 "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "claims.jsonl:2" in err and "rounds[2].pool_ids" in err and "999" in err

    # A claim missing from the records file.
    records.write_text("".join(x + "\n" for x in records.read_text().splitlines()[1:]))
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg.pop("records_sha256")
    (run_dir / "config.json").write_text(json.dumps(cfg))
    assert main(["probe", str(run_dir), "--model", str(tiny_qwen),
                 "--output", str(tmp_path / "o")]) == 2
    assert "claim 'c0' is not in the records file" in capsys.readouterr().err


def test_probe_report_rejects_bad_input(tmp_path, capsys):
    (tmp_path / "p").mkdir()
    assert main(["probe-report", str(tmp_path / "p"), "--output", str(tmp_path / "r")]) == 2
    assert "dirk.json: not found" in capsys.readouterr().err


def test_probe_and_probe_report_as_python_functions_give_what_the_command_lines_give(run_dir, tiny_llama,
                                                                                       tmp_path):
    """run(ProbeConfig(...)) and run(ProbeReportConfig(...)) write the same files as `fae probe` and
    `fae probe-report`, and return the numbers they wrote."""
    from fae.probes import report, runner as probe
    from real_fae_core.command import CommandResult

    args = ["--bootstrap", "50", "--batch-size", "3", "--knowledge-max-new-tokens", "4"]
    assert main(["probe", str(run_dir), "--model", str(tiny_llama), "--output", str(tmp_path / "cli"), *args]) == 0
    res = probe.run(probe.ProbeConfig(run_dir=run_dir, model=tiny_llama, output=tmp_path / "py", bootstrap=50,
                                      batch_size=3, knowledge_max_new_tokens=4))
    assert isinstance(res, CommandResult) and res.ok
    assert res.outputs == {"dirk": str(tmp_path / "py" / "dirk.json"),
                           "claims": str(tmp_path / "py" / "dirk_claims.jsonl"),
                           "states": str(tmp_path / "py" / "states.safetensors")}
    for name in ("dirk.json", "dirk_claims.jsonl"):
        assert (tmp_path / "py" / name).read_text() == (tmp_path / "cli" / name).read_text(), name
    assert res.summary == json.loads((tmp_path / "py" / "dirk.json").read_text())
    a, b = load_states(tmp_path / "py" / "states.safetensors"), load_states(tmp_path / "cli" / "states.safetensors")
    assert (a["hK"] == b["hK"]).all() and (a["hr"] == b["hr"]).all()

    dirs = [str(tmp_path / "cli"), str(tmp_path / "py")]
    assert main(["probe-report", *dirs, "--names", "a", "b", "--output", str(tmp_path / "rep-cli")]) == 0
    res = report.run(report.ProbeReportConfig(dirs=dirs, names=["a", "b"], output=tmp_path / "rep-py"))
    assert sorted(res.outputs) == ["common", "plot", "report"]
    for name in ("dirk.md", "dirk_common.json"):
        assert (tmp_path / "rep-py" / name).read_text() == (tmp_path / "rep-cli" / name).read_text(), name
    assert res.summary["labels"] == ["a", "b"]
    assert res.summary["rounds"][0] == json.loads((tmp_path / "cli" / "dirk.json").read_text())["rounds"]
    common = json.loads((tmp_path / "rep-py" / "dirk_common.json").read_text())["rounds"]
    assert json.loads(json.dumps(res.summary["common_subset"])) == common


def test_probe_checks_hold_for_a_python_caller(run_dir, tmp_path):
    from fae.probes import report, runner as probe
    from real_fae_core.errors import UserError

    with pytest.raises(UserError, match="^ProbeConfig: bootstrap: must be >= 0, got -1$"):
        probe.ProbeConfig(run_dir=run_dir, model="m", output=tmp_path / "o", bootstrap=-1)
    with pytest.raises(UserError, match="--knowledge-reference must be one of"):
        probe.run(probe.ProbeConfig(run_dir=run_dir, model="m", output=tmp_path / "o", knowledge_reference="other"))
    with pytest.raises(UserError, match="--states-dtype must be one of float16, float32, got 'int8'"):
        probe.run(probe.ProbeConfig(run_dir=run_dir, model="m", output=tmp_path / "o", states_dtype="int8"))
    with pytest.raises(UserError, match="--names has 1 names for 2 directories"):
        report.run(report.ProbeReportConfig(dirs=["a", "b"], names=["x"], output=tmp_path / "r"))
