"""`inspect eval real_fae/fae` and `fae from-inspect` (docs/inspect.md).

Inspect's own ``mockllm`` provider plays a scripted verifier; the same script drives `fae run`'s
engine (:func:`fae.ablation.engine.run_ablation`), so every question Inspect asks must be the
question `fae run` asks: ablation order, invalid and NEI answers, reused rounds, hallucinated
and already-removed ids, an answer cut off at the token cap, and with `fae run`'s default arms
each round's control pool and the gold-only pool (and renumbered line ids on request). A question
whose generate fails
leaves its claim incomplete: not scored, and refused (or left out on request) on the way back
to a run directory. The slow test runs real weights through both.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import demo_verifier
import pytest
from helpers import make_record_dict

inspect_ai = pytest.importorskip("inspect_ai", reason="Inspect AI is the optional extra [inspect]")

from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.model import ModelOutput, ModelUsage, get_model  # noqa: E402

from real_fae_core.errors import UserError  # noqa: E402
from data_prep.records import ClaimRecord, save_records  # noqa: E402
from fae.ablation.engine import ABLATION_ONLY, Arms, call_counts_of, run_ablation  # noqa: E402
from fae.ablation.metrics import compute_metrics  # noqa: E402
from fae.ablation.runio import load_run  # noqa: E402
from fae.backends import Generation  # noqa: E402
from fae.cli import main as fae_main  # noqa: E402
from fae.harness.inspect_task import (ARM_METRIC_NAMES, CLAIM_KEY, METRIC_NAMES, STORE_KEY, TASK_NAME,  # noqa: E402
                                      arms_args)
from fae.harness.logrun import log_to_run  # noqa: E402

BIN = Path(sys.executable).parent
NEI = "NOT_ENOUGH_INFO"


def answer(label, ids=()):
    return json.dumps({"label": label, "evidence": list(ids)})


def ideal(ids):  # cites the gold line while it is shown, then abstains
    return answer("SUPPORT", [1]) if 1 in ids else answer(NEI)


def reversed_pairs(ids):  # cites two lines, later one first: the pool keeps reading order
    return answer("REFUTE", [ids[1], ids[0]]) if len(ids) >= 2 else answer(NEI)


def stale(ids):  # cites line 0 again after it was removed: hallucinated, the pool stays, reused
    return answer("SUPPORT", [0])


# claim -> (gold label, gold groups, pool size, verifier); "cut" answers past the token cap
SCRIPT = {
    "ideal": ("SUPPORT", [[1]], 3, ideal),
    "order": ("REFUTE", [[0, 2]], 5, reversed_pairs),
    "prose": ("SUPPORT", [[0]], 3, lambda ids: "The evidence supports the claim."),
    "invented": ("REFUTE", [[1]], 3, lambda ids: answer("REFUTE", [99])),
    "stale": ("SUPPORT", [[0]], 3, stale),
    "cut": ("SUPPORT", [[0]], 3, lambda ids: '{"label": "SUPP'),
}
ROUNDS = 3


def make_records(path: Path, names=tuple(SCRIPT), nei: bool = True) -> Path:
    recs = [make_record_dict(id=name, claim=f"claim {name}", label=SCRIPT[name][0], evidence=SCRIPT[name][1],
                             sentences=[{"id": i, "text": f"sentence {i} of {name}"} for i in range(SCRIPT[name][2])])
            for name in names]
    if nei:
        recs.append(make_record_dict(id="nei", claim="claim nei", label=NEI, evidence=[]))
    save_records([ClaimRecord.from_dict(r) for r in recs], path)
    return path


def parse_prompt(user_text: str) -> tuple[str, list[int]]:
    claim = re.search(r"^Claim: claim (\S+)$", user_text, re.M).group(1)
    return claim, [int(i) for i in re.findall(r"^line(\d+):", user_text, re.M)]


def scripted_text(claim: str, ids: list[int]) -> tuple[str, str]:
    """(answer text, why it stopped): the one script both sides answer with."""
    text = SCRIPT[claim][3](ids)
    return text, ("length" if claim == "cut" else "stop")


class MockVerifier:
    """mockllm's custom_outputs: the script's answer, Inspect's stop reason; a claim in ``fail`` raises
    at the rounds whose pool it names."""

    def __init__(self, fail: dict[str, int] | None = None):
        self.calls: dict[str, int] = {}
        self.fail = fail or {}

    def __call__(self, input, tools, tool_choice, config):
        claim, ids = parse_prompt(input[-1].text)
        n = self.calls[claim] = self.calls.get(claim, 0) + 1
        if claim in self.fail and n > self.fail[claim]:
            raise ConnectionError(f"provider unreachable for {claim}")
        text, why = scripted_text(claim, ids)
        out = ModelOutput.from_content("mockllm", text, stop_reason="max_tokens" if why == "length" else "stop")
        out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)  # no tokenizer download
        return out


def fae_run_claims(records: Path, rounds: int, arms: Arms = Arms()) -> dict[str, dict]:
    """What `fae run`'s engine makes of the same script (its claims.jsonl entries by id), by default with
    `fae run`'s default arms (control, gold-only, original line ids)."""
    from data_prep.records import load_records
    from fae.ablation.population import fae_claims

    recs, _ = fae_claims(load_records(records))

    def generate(prompts, callback=None):
        return [Generation(*scripted_text(*parse_prompt(m[-1]["content"]))) for m in prompts]

    out: list[dict] = []
    run_ablation(recs, generate, rounds, out.extend, chunk_size=2, progress=False, arms=arms)
    return {c["id"]: c for c in out}


def run_inspect(records: Path, log_dir: Path, verifier: MockVerifier, rounds: int = ROUNDS,
                arms: Arms | None = None, **kw):
    """The task with its default arms, or ``arms`` given as task options (-T)."""
    task_args = {"records": str(records), "rounds": rounds, **(arms_args(arms) if arms else {})}
    [log] = inspect_eval(TASK_NAME, task_args=task_args,
                         model=get_model("mockllm/model", custom_outputs=verifier),
                         log_dir=str(log_dir), display="none", **kw)
    return log


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """One Inspect run over every scripted claim, and its log written back as a run directory."""
    tmp = tmp_path_factory.mktemp("inspect")
    records = make_records(tmp / "records.jsonl")
    verifier = MockVerifier()
    log = run_inspect(records, tmp / "logs", verifier)
    run_dir = tmp / "run"
    assert fae_main(["from-inspect", log.location, "--output", str(run_dir)]) == 0
    return {"records": records, "log": log, "verifier": verifier, "run": run_dir, "tmp": tmp}


def test_every_round_is_the_round_fae_run_records(scripted):
    log = scripted["log"]
    assert log.status == "success"
    expected = fae_run_claims(scripted["records"], ROUNDS)
    got = {s.id: s.scores["fae_scorer"].metadata[CLAIM_KEY] for s in log.samples}
    assert set(got) == set(SCRIPT)  # the NEI-gold record is left out, as fae run leaves it out
    for cid in SCRIPT:
        assert got[cid] == expected[cid], cid
    # the schedule itself, spelled out for two claims
    order = [(r["pool_ids"], r["cited"], r["reused"]) for r in got["order"]["rounds"]]
    assert order == [([0, 1, 2, 3, 4], [1, 0], False), ([2, 3, 4], [3, 2], False), ([4], [], False),
                     ([4], [], True)]
    stale_rounds = got["stale"]["rounds"]
    assert stale_rounds[1]["hallucinated"] == [0] and stale_rounds[1]["pool_ids"] == [1, 2]
    assert [r["reused"] for r in stale_rounds] == [False, False, True, True]
    assert got["cut"]["rounds"][0]["truncated"] is True
    assert got["cut"]["rounds"][0]["error"].startswith("answer cut off at max_new_tokens")
    assert [r["reused"] for r in got["prose"]["rounds"]] == [False, True, True, True]
    assert got["invented"]["rounds"][0]["hallucinated"] == [99]
    # fae run's default arms, asked by the task's defaults: every round's control and the gold-only pool
    assert all(len(c["control"]) == ROUNDS and c["gold_only"] is not None for c in got.values())
    ctrl = [(c["round"], c.get("pool_ids"), c.get("removed"), c.get("reused"), "skipped" in c)
            for c in got["order"]["control"]]
    assert ctrl == [(1, [0, 1, 2], [3, 4], False, False), (2, None, None, None, True), (3, None, None, None, True)]
    assert got["order"]["gold_only"]["pool_ids"] == [0, 2] and got["order"]["gold_only"]["cited"] == [2, 0]
    # nothing removed yet (an invalid round 0): the control's pool is round 0's, copied
    assert [(c["pool_ids"], c["reused"]) for c in got["cut"]["control"]] == [([0, 1, 2], True)] * ROUNDS
    assert got != fae_run_claims(scripted["records"], ROUNDS, ABLATION_ONLY)  # the arms are in the comparison


def test_only_unreused_questions_reach_the_model(scripted):
    claims = {s.id: s.scores["fae_scorer"].metadata[CLAIM_KEY] for s in scripted["log"].samples}
    counts = {cid: call_counts_of(c) for cid, c in claims.items()}
    asked = {cid: n["model_calls"] + n["control_calls"] + n["sufficiency_calls"] for cid, n in counts.items()}
    assert scripted["verifier"].calls == asked
    assert {cid: n["model_calls"] for cid, n in counts.items()} == \
        {"ideal": 2, "order": 3, "prose": 1, "invented": 1, "stale": 2, "cut": 1}
    assert {cid: n["control_calls"] for cid, n in counts.items()} == \
        {"ideal": 2, "order": 2, "prose": 1, "invented": 1, "stale": 2, "cut": 1}


def test_inspect_metrics_are_fae_metrics(scripted):
    log = scripted["log"]
    claims = list(fae_run_claims(scripted["records"], ROUNDS).values())
    want = compute_metrics(claims)
    shown = {name: m.value for name, m in log.results.scores[0].metrics.items()}
    wanted = {name: want[key] for name, key in METRIC_NAMES.items()}
    wanted.update({name: want[block][key] for name, (block, key) in ARM_METRIC_NAMES.items()})
    for name, value in wanted.items():
        if value is None:
            assert name not in shown  # undefined is left out, never shown as a number
        else:
            assert shown[name] == pytest.approx(value), name
    assert want["IS"] is not None and want["label_accuracy"] not in (0, 1)  # the case is not degenerate
    assert all(wanted[name] is not None for name in ARM_METRIC_NAMES)  # the control's metrics are shown
    sample = next(s for s in log.samples if s.id == "order")
    score = sample.scores["fae_scorer"]
    assert score.value == {"strict": 1.0, "r0": 1.0, "r1": 1.0, "r2": 0.0, "r3": 0.0}
    assert '| 1 | [2, 3, 4] | {"label": "REFUTE", "evidence": [3, 2]} | REFUTE | [3, 2] |' in score.explanation
    assert '| control 1 | [0, 1, 2] | {"label": "REFUTE", "evidence": [1, 0]} | REFUTE | [1, 0] |' \
        in score.explanation
    assert "| control 2 | | | | | | | not asked: " in score.explanation
    assert '| gold-only | [0, 2] | {"label": "REFUTE", "evidence": [2, 0]} | REFUTE | [2, 0] |' in score.explanation
    assert sample.store[STORE_KEY] == score.metadata[CLAIM_KEY]


def test_the_log_becomes_a_run_that_fae_commands_read(scripted, capsys):
    run = load_run(scripted["run"])  # the one run reader: finished, consistent
    expected = fae_run_claims(scripted["records"], ROUNDS)
    assert [c["id"] for c in run.claims] == list(SCRIPT)
    assert run.claims == [expected[c] for c in SCRIPT]
    metrics = {k: v for k, v in run.metrics.items() if k != "computed_from"}
    assert metrics == compute_metrics(list(expected.values()), n_excluded_nei=1)
    cfg = run.config
    assert cfg["backend"] == "inspect" and cfg["model"] == "mockllm/model" and cfg["rounds"] == ROUNDS
    assert {k: cfg[k] for k in Arms().record()} == Arms().record()
    assert run.metrics["control"]["IS_ctrl"] is not None and run.metrics["gold_only"]["n_claims"] == len(SCRIPT)
    assert cfg["inspect_log"]["path"] == str(Path(scripted["log"].location).resolve())
    from real_fae_core.hashing import sha256_file

    assert cfg["inspect_log"]["sha256"] == sha256_file(scripted["log"].location)
    assert cfg["records_sha256"] == sha256_file(scripted["records"])
    assert cfg["decoding"]["greedy"] is True and cfg["decoding"]["max_tokens"] == 64
    out = scripted["tmp"] / "report"
    assert fae_main(["report", str(scripted["run"]), "--output", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert f"{100 * run.metrics['label_accuracy']:.2f}" in report
    assert "## Control arm and gold-only pools" in report and "line ids original, control matched (seed 0)" in report
    cmp = scripted["tmp"] / "compare"
    assert fae_main(["compare", str(scripted["run"]), str(scripted["run"]), "--output", str(cmp),
                     "--bootstrap", "200"]) == 0
    assert json.loads((cmp / "compare.json").read_text())["n_claims"] == len(SCRIPT)  # read like any run
    view = scripted["tmp"] / "view"
    assert fae_main(["view", str(scripted["run"]), "--output", str(view)]) == 0
    assert (view / "index.html").is_file()
    # importing the same log again rewrites the run; another run's directory is refused
    assert fae_main(["from-inspect", scripted["log"].location, "--output", str(scripted["run"])]) == 0
    capsys.readouterr()
    other = scripted["tmp"] / "other"
    other.mkdir()
    (other / "claims.jsonl").write_text('{"id": "x", "rounds": []}\n')
    assert fae_main(["from-inspect", scripted["log"].location, "--output", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fae from-inspect: error: {other} already holds a run's claims; write to a fresh --output"]


def test_a_failed_round_leaves_the_claim_incomplete_never_scored(tmp_path, capsys):
    records = make_records(tmp_path / "records.jsonl", names=("ideal", "order", "stale"), nei=False)
    # order's calls: round 0; round 1, its control, the gold-only pool; round 2 (its control: too few lines)
    log = run_inspect(records, tmp_path / "logs", MockVerifier(fail={"order": 4}), fail_on_error=False,
                      arms=Arms(cited_only=False, size_sweep=False))
    by_id = {s.id: s for s in log.samples}
    bad = by_id["order"]
    assert bad.error is not None and not bad.scores
    assert "claim 'order': round 2 of rounds 0..3 did not complete: ConnectionError: provider unreachable" \
        in bad.error.message
    partial = bad.store[STORE_KEY]  # the questions that were answered stay visible
    assert [r["round"] for r in partial["rounds"]] == [0, 1]
    assert [c["round"] for c in partial["control"]] == [1] and partial["gold_only"]["pool_ids"] == [0, 2]
    # the metrics are over the complete claims only
    complete = [by_id[c].scores["fae_scorer"].metadata[CLAIM_KEY] for c in ("ideal", "stale")]
    want = compute_metrics(complete)
    shown = {name: m.value for name, m in log.results.scores[0].metrics.items()}
    assert shown["accuracy"] == pytest.approx(want["label_accuracy"])
    assert log.results.completed_samples == 2
    # back to a run directory: refused with one line, or the complete claims only on request
    out = tmp_path / "run"
    assert fae_main(["from-inspect", log.location, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("1 of 3 claims are incomplete (first: sample 'order': error after 2 of 4 rounds: "
                              "claim 'order': round 2 of rounds 0..3 did not complete: ConnectionError: provider "
                              "unreachable for order); rerun them") in err[0]
    assert not out.exists()
    with pytest.raises(UserError, match="incomplete"):
        log_to_run(log.location, out, command="x")
    assert fae_main(["from-inspect", log.location, "--output", str(out), "--skip-incomplete"]) == 0
    run = load_run(out)
    assert [c["id"] for c in run.claims] == ["ideal", "stale"]
    assert list(run.config["skipped_incomplete"]) == ["order"]
    # Inspect's --score-on-error hands the errored sample to the scorer: it scores NaN, left out; here the
    # control of round 1 fails after round 1 was answered: every round of a claim is not enough
    log = run_inspect(records, tmp_path / "logs2", MockVerifier(fail={"order": 2}), fail_on_error=False,
                      score_on_error=True)
    bad = next(s for s in log.samples if s.id == "order")
    assert "claim 'order': the control of round 1 did not complete: ConnectionError" in bad.error.message
    assert [r["round"] for r in bad.store[STORE_KEY]["rounds"]] == [0, 1] and bad.store[STORE_KEY]["control"] == [None]
    assert math.isnan(bad.scores["fae_scorer"].value) and CLAIM_KEY not in (bad.scores["fae_scorer"].metadata or {})
    shown = {name: m.value for name, m in log.results.scores[0].metrics.items()}
    assert shown["accuracy"] == pytest.approx(want["label_accuracy"])
    assert fae_main(["from-inspect", log.location, "--output", str(tmp_path / "run2")]) == 2


def test_renumbered_line_ids_and_a_control_seed_are_the_ones_fae_run_uses(tmp_path):
    """-T line_ids=renumbered shows lines 0..n-1 and maps cited numbers back to record ids, as fae run does;
    -T control_seed draws the control's lines as fae run draws them."""
    from fae.ablation.engine import control_order

    records = make_records(tmp_path / "records.jsonl", names=("ideal", "order", "stale"), nei=False)
    ideal = ClaimRecord.from_dict(make_record_dict(id="ideal", claim="c", label="SUPPORT", evidence=[[1]],
                                                   sentences=[{"id": i, "text": "s"} for i in range(3)]))

    def first_drawn(seed):  # the line the control of round 1 removes: [0, 2] are neither cited nor gold
        return next(i for i in control_order(ideal, seed) if i in (0, 2))

    seed = next(s for s in range(1, 50) if first_drawn(s) != first_drawn(0))  # another control pool than seed 0's
    arms = Arms(control="random", control_seed=seed, line_ids="renumbered")
    verifier = MockVerifier()
    log = run_inspect(records, tmp_path / "logs", verifier, arms=arms)
    assert log.status == "success"
    got = {s.id: s.scores["fae_scorer"].metadata[CLAIM_KEY] for s in log.samples}
    expected = fae_run_claims(records, ROUNDS, arms)
    assert got == expected
    # the numbering matters: round 1 of `ideal` shows [0, 2] as line0, line1; the verifier's "1" is record id 2
    r1 = got["ideal"]["rounds"][1]
    assert (r1["pool_ids"], r1["cited"], r1["label"]) == ([0, 2], [2], "SUPPORT")
    assert got["stale"]["rounds"][1]["cited"] == [1]  # "0" again: now the first line left, record id 1
    assert got != fae_run_claims(records, ROUNDS, Arms(control="random", control_seed=seed))
    assert got["ideal"]["control"] != fae_run_claims(records, ROUNDS, Arms(control="random",
                                                                           line_ids="renumbered"))["ideal"]["control"]
    sample = next(s for s in log.samples if s.id == "ideal")
    assert sample.input[-1].text.endswith("line0: sentence 0 of ideal\nline1: sentence 1 of ideal\n"
                                          "line2: sentence 2 of ideal")
    run_dir = tmp_path / "run"
    assert fae_main(["from-inspect", log.location, "--output", str(run_dir)]) == 0
    run = load_run(run_dir)
    assert {k: run.config[k] for k in arms.record()} == arms.record()
    assert run.claims == [expected[c] for c in ("ideal", "order", "stale")]


def test_the_ablation_alone_on_request(tmp_path):
    """-T control=none -T gold_only=false: the paper's protocol, as fae run --control none --no-gold-only."""
    records = make_records(tmp_path / "records.jsonl", names=("ideal", "order"), nei=False)
    verifier = MockVerifier()
    log = run_inspect(records, tmp_path / "logs", verifier, arms=ABLATION_ONLY)
    got = {s.id: s.scores["fae_scorer"].metadata[CLAIM_KEY] for s in log.samples}
    assert got == fae_run_claims(records, ROUNDS, ABLATION_ONLY)
    assert all("control" not in c and "gold_only" not in c for c in got.values())
    assert verifier.calls == {"ideal": 2, "order": 3}
    shown = {name: m.value for name, m in log.results.scores[0].metrics.items()}
    assert "accuracy" in shown and not set(ARM_METRIC_NAMES) & set(shown)  # undefined: left out
    run_dir = tmp_path / "run"
    assert fae_main(["from-inspect", log.location, "--output", str(run_dir)]) == 0
    run = load_run(run_dir)
    assert (run.config["control"], run.config["gold_only"]) == ("none", False)
    assert run.metrics["control"] is None and run.metrics["gold_only"] is None


def test_the_inspect_names_without_a_public_home_are_where_inspect_keeps_them():
    """fae.harness.inspect_internals imports Inspect's PrerequisiteError and active_model from private modules;
    an Inspect release that moves either fails here, not in a user's `inspect eval`."""
    from fae.harness.inspect_internals import PrerequisiteError, active_model

    assert issubclass(PrerequisiteError, Exception) and PrerequisiteError("x").message == "x"
    assert active_model() is None  # no eval running: the task then has no model to check


def test_bad_input_is_one_line(tmp_path, capsys):
    from fae.harness.inspect_internals import PrerequisiteError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "claim": "c", "label": "SUPPORT", "sentences": [], "evidence": []}\n')
    good = make_records(tmp_path / "good.jsonl", names=("ideal",), nei=False)
    cases = [({"records": str(bad)}, f"real_fae/fae: error: {bad}:1: record 'x': field 'sentences'"),
             ({"records": str(good), "round": 2}, "real_fae/fae: error: unknown task option 'round'"),
             ({"records": str(good), "rounds": -1}, "task option rounds: expected an integer >= 0"),
             ({"records": str(tmp_path / "none.jsonl")}, "records file not found"),
             ({"records": str(good), "line_ids": "x"},
              "real_fae/fae: error: task option line_ids: 'x'; choose original or renumbered"),
             ({"records": str(good), "control": "x"}, "task option control: 'x'; choose matched, random, none"),
             ({"records": str(good), "gold_only": "yes"}, "task option gold_only: expected true or false"),
             ({"records": str(good), "control_seed": 1.5}, "task option control_seed: expected an integer"),
             ({}, "task option records is required")]
    for args, message in cases:
        with pytest.raises(PrerequisiteError) as err:
            inspect_eval(TASK_NAME, task_args=args, model="mockllm/model", log_dir=str(tmp_path / "logs"),
                         display="none")
        assert message in str(err.value.message) and "\n" not in str(err.value.message), args
    log = run_inspect(good, tmp_path / "logs2", MockVerifier(), epochs=2)  # FAE is greedy: one epoch
    assert fae_main(["from-inspect", log.location, "--output", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fae from-inspect: error: {log.location}: 2 epochs; FAE answers are greedy and a run holds "
                   "each claim once: evaluate with --epochs 1"]
    notalog = tmp_path / "x.eval"
    notalog.write_text("not a log")
    assert fae_main(["from-inspect", str(notalog), "--output", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fae from-inspect: error: {notalog}: not a readable Inspect log")


def test_the_command_line_finds_the_task_and_prints_bad_input_as_one_message(tmp_path):
    """A fresh process: the entry point resolves real_fae/fae; a bad records file is a message, no traceback."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    env = dict(os.environ, COLUMNS="300")
    p = subprocess.run([str(BIN / "inspect"), "eval", TASK_NAME, "-T", f"records={bad}", "--model", "mockllm/model",
                        "--log-dir", str(tmp_path / "logs")], capture_output=True, text=True, env=env, timeout=300,
                       cwd=tmp_path)
    text = (p.stdout + p.stderr).strip()
    assert p.returncode == 1
    assert "Traceback" not in text
    assert text.splitlines() == [f"real_fae/fae: error: {bad}:1: record 'x': field 'claim': missing required field"]
    good = make_records(tmp_path / "good.jsonl", names=("ideal",), nei=False)
    p = subprocess.run([str(BIN / "inspect"), "eval", TASK_NAME, "-T", f"records={good}", "-T", "line_ids=x",
                        "--model", "mockllm/model", "--log-dir", str(tmp_path / "logs")], capture_output=True,
                       text=True, env=env, timeout=300, cwd=tmp_path)
    text = (p.stdout + p.stderr).strip()
    assert p.returncode == 1 and "Traceback" not in text
    assert text.splitlines() == ["real_fae/fae: error: task option line_ids: 'x'; choose original or renumbered"]
    assert not list((tmp_path / "logs").glob("*.eval"))  # refused up front: nothing asked, no log


# ---------------------------------------------------------------- real weights, both ways


ROUND_KEYS = ("round", "pool_ids", "raw_output", "label", "cited", "hallucinated", "valid", "reused", "evidence")
N_DEMO_CLAIMS = 16


@pytest.mark.slow
def test_real_weights_answer_the_same_through_inspect_and_fae_run(tmp_path):
    """The same greedy model, the same 16 claims, R = 4, the same dtype: fae run --backend hf and inspect eval
    --model hf/local give the same raw answer at every round, control and gold-only pool. The model is the
    demo's base (tests/demo_verifier.py): valid at round 0 and finding another copy of its line each round,
    so both sides generate the ablated rounds they are compared on. fae run's --dtype auto is bf16 on a CPU
    with native bf16: fp32 is named on both sides."""
    records = demo_verifier.write_records(tmp_path / "records.jsonl", N_DEMO_CLAIMS)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="2")
    run_a = tmp_path / "fae_run"
    r = subprocess.run([str(BIN / "fae"), *demo_verifier.fae_run_args(records, run_a)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    logs = tmp_path / "logs"
    r = subprocess.run([str(BIN / "inspect"), "eval", TASK_NAME, "-T", f"records={records}", "-T", "rounds=4",
                        "-T", f"max_tokens={demo_verifier.MAX_NEW_TOKENS}", "-T", f"line_ids={demo_verifier.LINE_IDS}",
                        "--model", "hf/local", "-M", f"model_path={demo_verifier.MODEL}", "-M", "do_sample=false",
                        "-M", "device=cpu", "-M", f"dtype={demo_verifier.INSPECT_DTYPE}", "--log-dir", str(logs),
                        "--display", "plain"],
                       capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout + r.stderr)[-2000:]
    [log] = list(logs.glob("*.eval"))
    run_b = tmp_path / "inspect_run"
    assert fae_main(["from-inspect", str(log), "--output", str(run_b)]) == 0
    a, b = load_run(run_a), load_run(run_b)
    assert a.config["decoding"]["dtype"] == b.config["decoding"]["dtype"] == "float32"
    assert [c["id"] for c in a.claims] == [c["id"] for c in b.claims] and len(a.claims) == N_DEMO_CLAIMS
    for ca, cb in zip(a.claims, b.claims):
        # both with fae run's default arms: each round's control and the gold-only pool are asked too
        asked_a = ca["rounds"] + [c for c in ca["control"] + [ca["gold_only"]] if "skipped" not in c]
        asked_b = cb["rounds"] + [c for c in cb["control"] + [cb["gold_only"]] if "skipped" not in c]
        assert len(asked_a) == len(asked_b)
        for ra, rb in zip(asked_a, asked_b):
            assert ra["raw_output"] == rb["raw_output"], (ca["id"], ra["round"])
            # the round's contract (SPEC §6); `truncated` and its note in `error` only where the provider says
            assert {k: ra[k] for k in ROUND_KEYS} == {k: rb[k] for k in ROUND_KEYS}
    for key in ("label_accuracy", "strict_accuracy", "IS", "ER", "IO", "round_accuracy", "invalid_rate",
                "gold_only", "model_calls", "reused_calls"):
        assert a.metrics[key] == b.metrics[key], key
    assert (a.metrics["control"] or {}).get("IS_ctrl") == (b.metrics["control"] or {}).get("IS_ctrl")
    # the comparison is not vacuous: Inspect's provider was asked these ablated and control pools itself
    counts = demo_verifier.assert_ablated_rounds_generated(b.claims)
    assert counts["ablation"] + counts["control"] >= 80, counts


def test_a_retry_wrappers_error_is_named_by_the_error_behind_it():
    import tenacity

    from fae.harness.inspect_task import describe_error

    @tenacity.retry(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_none())
    def unreachable():
        raise ConnectionError("connection refused\n  (port 9)")

    with pytest.raises(tenacity.RetryError) as err:
        unreachable()
    assert describe_error(err.value) == "ConnectionError: connection refused (port 9)"
    assert describe_error(ValueError()) == "ValueError"


def test_from_inspect_as_a_function_writes_what_the_command_line_writes(scripted, tmp_path, capsys):
    from fae.harness.from_inspect import FromInspectConfig, run

    out = tmp_path / "py"
    res = run(FromInspectConfig(log=scripted["log"].location, output=out))
    assert res.ok and res.outputs["run_dir"] == str(out) and res.outputs["claims"] == str(out / "claims.jsonl")
    cli = load_run(scripted["run"])  # the fixture's `fae from-inspect` of the same log
    assert (out / "claims.jsonl").read_bytes() == (scripted["run"] / "claims.jsonl").read_bytes()
    assert {k: v for k, v in res.summary.items() if k != "computed_from"} == \
        {k: v for k, v in cli.metrics.items() if k != "computed_from"}
    assert json.loads((out / "metrics.json").read_text())["IS"] == cli.metrics["IS"]


# ---------------------------------------------------------------- greedy whatever the provider; the dtype it ran


def test_the_log_of_a_server_provider_records_its_dtype_as_the_servers(scripted):
    """mockllm keeps no weights here: like an API or a vLLM server, its dtype is the server's."""
    from fae.harness.inspect_task import DTYPE_KEY

    assert {s.store[DTYPE_KEY] for s in scripted["log"].samples} == {"server"}
    assert load_run(scripted["run"]).config["decoding"]["dtype"] == "server"


def test_a_provider_that_would_sample_is_refused_before_anything_is_asked(tiny_llama, tmp_path):
    """Inspect's hf provider samples unless -M do_sample=false; then the task's temperature 0 made
    transformers refuse every call (a RoundError per sample). Refused up front, with what to pass."""
    from fae.harness.inspect_internals import PrerequisiteError
    from inspect_ai.model import GenerateConfig

    records = make_records(tmp_path / "records.jsonl", names=("ideal",), nei=False)
    sampling = get_model("hf/local", model_path=str(tiny_llama), device="cpu", memoize=False)
    with pytest.raises(PrerequisiteError, match=r"^real_fae/fae: error: the hf provider samples unless told not "
                                                r"to: pass -M do_sample=false"):
        inspect_eval(TASK_NAME, task_args={"records": str(records)}, model=sampling, log_dir=str(tmp_path / "logs"),
                     display="none")
    hot = get_model("mockllm/model", config=GenerateConfig(temperature=0.7), custom_outputs=MockVerifier())
    with pytest.raises(PrerequisiteError, match=r"--temperature 0.7: FAE's answers are greedy"):
        inspect_eval(TASK_NAME, task_args={"records": str(records)}, model=hot, log_dir=str(tmp_path / "logs"),
                     display="none")
    assert not list((tmp_path / "logs").glob("*.eval"))
    # a task made before the model (Python's eval(task, model=...)): refused at the claim's first question
    from real_fae.tasks import fae

    [log] = inspect_eval(fae(records=str(records)), model=sampling, log_dir=str(tmp_path / "logs2"), display="none")
    assert log.status == "error" and "not asked: the hf provider samples" in log.error.message


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_the_hf_provider_records_the_dtype_it_ran_and_from_inspect_carries_it(tiny_llama, tmp_path, dtype):
    """The dtype is the loaded model's (what transformers chose, or -M dtype=...); a run in another dtype
    than fae run's (`--dtype auto` is bf16 on a CPU with native bf16) is then refused by fae compare."""
    from fae.harness.inspect_task import DTYPE_KEY

    records = make_records(tmp_path / "records.jsonl", names=("ideal", "order"), nei=False)
    model = get_model("hf/local", model_path=str(tiny_llama), device="cpu", do_sample=False, memoize=False,
                      **({"dtype": dtype} if dtype else {}))
    want = dtype or str(model.api.model.dtype).removeprefix("torch.")
    [log] = inspect_eval(TASK_NAME, task_args={"records": str(records), "rounds": 1, "max_tokens": 4,
                                               "control": "none", "gold_only": False},
                         model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success" and {s.store[DTYPE_KEY] for s in log.samples} == {want}
    run = tmp_path / "run"
    assert fae_main(["from-inspect", log.location, "--output", str(run)]) == 0
    assert load_run(run).config["decoding"]["dtype"] == want
    other = tmp_path / "other"
    assert fae_main(["from-inspect", log.location, "--output", str(other)]) == 0
    cfg = json.loads((other / "config.json").read_text())
    cfg["decoding"]["dtype"] = "float16"
    (other / "config.json").write_text(json.dumps(cfg))
    assert fae_main(["compare", str(run), str(other), "-o", str(tmp_path / "cmp")]) == 2


def test_the_command_line_says_what_to_pass_for_greedy_answers(tiny_llama, tmp_path):
    """A fresh process, as the finding ran it: --model hf/local without -M do_sample=false is one line."""
    records = make_records(tmp_path / "records.jsonl", names=("ideal",), nei=False)
    env = dict(os.environ, COLUMNS="300", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    p = subprocess.run([str(BIN / "inspect"), "eval", TASK_NAME, "-T", f"records={records}", "--model", "hf/local",
                        "-M", f"model_path={tiny_llama}", "-M", "device=cpu", "--temperature", "0",
                        "--log-dir", str(tmp_path / "logs")], capture_output=True, text=True, env=env, timeout=300,
                       cwd=tmp_path)
    text = (p.stdout + p.stderr).strip()
    assert p.returncode == 1 and "Traceback" not in text
    assert [line for line in text.splitlines() if "real_fae/fae" in line] == [
        "real_fae/fae: error: the hf provider samples unless told not to: pass -M do_sample=false (FAE's answers "
        "are greedy)"]
    assert not list((tmp_path / "logs").glob("*.eval"))
