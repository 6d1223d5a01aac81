"""The built-in demo: synthetic world, base-model builder, and a reduced end-to-end run."""

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from data_prep.prompts import (
    format_answer,
    render_chat,
    render_evidence_prompt,
)
from data_prep.records import load_records
from real.demo.drift import table2_pattern
from real.demo.annotators import ANNOTATORS, AnnotatorServer, annotate, write_annotators_yaml
from real.demo.base_model import ExampleFactory, build_base, build_word_tokenizer, cosine_lambda, lr_lambda
from real_fae_core.errors import UserError
from real_fae_core.runlock import RunLock
from real.demo import main as real_demo
from real.training.onpolicy import REWARD_TERMS
from real.demo.pipeline import BASE_DIR, MARKER, ON_POLICY, VARIANTS, DemoSize, claim_output, run_demo, write_world_records
from real.demo.world import add_incomplete_gold, build_world, make_split, train_test_facts


def test_world_is_seeded_and_records_are_valid(tmp_path):
    w1, w2 = build_world(seed=3), build_world(seed=3)
    assert w1.facts == w2.facts and build_world(seed=4).facts != w1.facts
    train_facts, test_facts = train_test_facts(w1, 100, 50, seed=1)
    assert not set(train_facts) & set(test_facts)  # test claims are about unseen facts
    recs = make_split(w1, test_facts, seed=2, prefix="t")
    labels = {r.label for r in recs}
    assert labels == {"SUPPORT", "REFUTE"}
    for r in recs:
        r.validate()
        gold = r.sentence_map()[r.gold_ids[0]]
        fact = w1.facts[(r.extra["entity"], r.extra["attribute"])]
        assert gold.text == fact.sentence()  # the gold line states the true fact
        assert (r.claim == fact.sentence()) == (r.label == "SUPPORT")
        # distractors include other facts about the same entity
        assert sum(s.doc == fact.entity for s in r.sentences) >= 2
    train_path, test_path = write_world_records(tmp_path, DemoSize(n_train=30, n_test=10), seed=0)
    assert len(load_records(train_path)) == 30 and len(load_records(test_path)) == 10
    # enhancement fills enhanced_evidence; the world never claims its gold is complete
    assert all(r.enhanced_evidence is None for r in load_records(train_path) + load_records(test_path))


def test_incomplete_gold_names_one_of_two_proving_lines_and_leaves_the_streams_alone():
    w = build_world(seed=0)
    facts, _ = train_test_facts(w, 300, 10, seed=10)
    plain = make_split(w, facts, seed=11, prefix="t")
    recs = add_incomplete_gold(make_split(w, facts, seed=11, prefix="t"), seed="train-0")
    # own RNG: the split's stream is what it was (the base builder draws its data through make_record)
    assert [r.claim for r in plain] == [r.claim for r in recs] and plain == make_split(w, facts, seed=11, prefix="t")
    incomplete = [r for r in recs if r.extra["incomplete_gold"]]
    assert 0.25 < len(incomplete) / len(recs) < 0.45
    tok = build_word_tokenizer(w)
    named_first = 0
    for p, r in zip(plain, recs):
        r.validate()
        fact = w.facts[(r.extra["entity"], r.extra["attribute"])]
        proving = r.extra["proving_ids"]
        assert [s.id for s in r.sentences] == list(range(len(r.sentences)))
        assert [s.id for s in r.sentences if s.text == fact.sentence()] == proving
        if not r.extra["incomplete_gold"]:
            assert (r.sentences, r.evidence, r.extra["proving_ids"]) == (p.sentences, p.evidence, p.gold_ids)
            continue
        assert len(proving) == 2 and len(r.sentences) == len(p.sentences) + 1
        assert r.gold_ids[0] in proving and r.enhanced_evidence is None
        named_first += r.gold_ids[0] == proving[0]
        assert {s.doc for s in r.sentences if s.id in proving} == {fact.entity, "almanac"}
        ids = tok(render_chat(tok, render_evidence_prompt(r)), add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids  # the second line is words the shipped tokenizer knows
    assert 0.3 < named_first / len(incomplete) < 0.7  # which copy the gold names is a coin
    again = add_incomplete_gold(make_split(w, facts, seed=11, prefix="t"), seed="train-0")
    assert again == recs


def test_base_builder_draws_the_same_records_as_before():
    """The shipped base's rebuild draws its training data through make_record: its stream is pinned
    (digest computed with the code the shipped base was built with)."""
    import hashlib
    import random

    class _Tok:  # the factory needs only the eot id to draw records
        def convert_tokens_to_ids(self, token):
            return 0

    factory = ExampleFactory(build_world(seed=0), _Tok(), random.Random(1))
    recs = [factory.record() for _ in range(50)]
    drawn = [[r.claim, r.label, [s.text for s in r.sentences], r.evidence] for r in recs]
    assert hashlib.sha256(json.dumps(drawn).encode()).hexdigest() == (
        "50bf567c4a343da3f8edb94ecc65745e81baf71a06a207e3cdb70b92935cba68")
    assert all(r.enhanced_evidence is None for r in recs)


def test_word_tokenizer_round_trips_answers_and_prompts():
    w = build_world()
    tok = build_word_tokenizer(w)
    for ans in (format_answer("SUPPORT", [3]), format_answer("REFUTE", [0, 12]), format_answer("NOT_ENOUGH_INFO")):
        ids = tok(ans, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == ans
    rec = make_split(w, list(w.facts.values())[:1], seed=0, prefix="x")[0]
    ids = tok(render_chat(tok, render_evidence_prompt(rec)), add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    assert len(ids) < 80  # word-level: the whole prompt stays short on CPU


@pytest.mark.slow
def test_build_base_writes_a_loadable_model_and_curve(quick_base):
    log = [json.loads(line) for line in (quick_base / "build_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [10, 20]
    assert all(0.0 <= e["exact_full_pool"] <= 1.0 for e in log)
    info = json.loads((quick_base / "build_info.json").read_text())
    assert info["steps"] == 20 and info["parameters"] > 0
    tok = AutoTokenizer.from_pretrained(quick_base)
    assert tok.chat_template and (quick_base / "model.safetensors").exists()


def test_shipped_base_model_is_small_and_documented():
    files = {p.name for p in BASE_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "build_info.json", "build_log.jsonl"} <= files
    size = sum(p.stat().st_size for p in BASE_DIR.iterdir())
    assert size < 20 * 2**20
    info = json.loads((BASE_DIR / "build_info.json").read_text())
    assert info["best_exact_full_pool"] >= 0.9  # never ship a base that cannot read the pool
    assert {"seed", "wall_seconds", "steps"} <= set(info)


@pytest.fixture(scope="module")
def quick_base(tmp_path_factory):
    """A base built by the real builder, briefly: the plumbing test needs no skill."""
    out = tmp_path_factory.mktemp("demo-base")
    build_base(out, steps=20, batch_size=8, eval_every=10, log=lambda *_: None)
    return out


def test_lr_schedule_is_the_stop_and_resume_procedure():
    """The default schedule: cosine over 40,000 up to step 17,000, then cosine over 18,000."""
    f = lr_lambda(18000, 40000, 17000)
    first, final = cosine_lambda(40000), cosine_lambda(18000)
    assert all(f(s) == first(s) for s in (0, 499, 500, 10000, 17000))
    assert all(f(s) == final(s) for s in (17001, 17500, 18000))
    assert f(17001) < 0.2 < f(17000)  # the low-LR final phase begins after step 17,000
    assert lr_lambda(300)(150) == cosine_lambda(300)(150)  # no final phase: one cosine


def test_one_command_build_equals_stop_and_resume_bitwise(tmp_path):
    """Build with schedule N stopped after step K, resume with steps=M  ==  one command (N, K, M)."""
    tiny = dict(batch_size=4, hidden_size=32, num_layers=1, eval_every=1000, abstain_from_step=12,
                log=lambda *_: None)
    two = tmp_path / "two"
    build_base(two, steps=40, schedule_steps=None, stop_after=12, **tiny)  # the 40-step build, stopped by hand
    assert json.loads((two / "build_info.json").read_text())["steps"] == 12
    info2 = build_base(two, steps=18, schedule_steps=None, **tiny)  # resumed with --steps 18
    one = tmp_path / "one"
    info1 = build_base(one, steps=18, schedule_steps=40, final_phase_from=12, **tiny)
    assert info1["steps"] == info2["steps"] == 18
    assert (one / "model.safetensors").read_bytes() == (two / "model.safetensors").read_bytes()
    assert info1["schedule"]["final_phase_from"] == 12 and info1["schedule"]["schedule_steps"] == 40
    # the test can fail: one plain 18-step cosine is another schedule, and other weights
    plain = tmp_path / "plain"
    build_base(plain, steps=18, schedule_steps=None, **tiny)
    assert (plain / "model.safetensors").read_bytes() != (one / "model.safetensors").read_bytes()


def test_build_base_cli_defaults_are_the_shipped_schedule(monkeypatch, tmp_path):
    import real.demo as demo_cli
    import real.demo.base_model as bm

    seen = {}
    monkeypatch.setattr(bm, "build_base", lambda out, **kw: seen.update(kw) or {})
    assert demo_cli.main(["build-base", "--output", str(tmp_path)]) == 0
    assert (seen["steps"], seen["schedule_steps"], seen["final_phase_from"], seen["stop_after"]) == \
        (18000, 40000, 17000, None)
    assert seen["command"] == f"real-demo build-base --output {tmp_path}"
    shipped = json.loads((BASE_DIR / "build_info.json").read_text())
    assert shipped["command"] == "real-demo build-base --output real/demo/base"
    assert shipped["schedule"] == bm.schedule_info(18000, 40000, 17000)


@pytest.mark.slow
def test_build_base_resumes(tmp_path):
    out = tmp_path / "base"
    build_base(out, steps=10, batch_size=8, eval_every=10, log=lambda *_: None)
    info = build_base(out, steps=20, batch_size=8, eval_every=10, log=lambda *_: None)
    steps = [json.loads(line)["step"] for line in (out / "build_log.jsonl").read_text().splitlines()]
    assert steps == [10, 20] and info["steps"] == 20  # continued from step 10, not from scratch


# The CI demo: the shipped base, reduced so that it runs in ~2-3 min on 2 free cores, and still
# large enough for the effect (measured in docs/demo.md).
CI_SIZE = DemoSize(n_train=160, n_test=50, max_steps=60, bootstrap=200, pave_claims=4, pave_samples=2, on_policy=True,
                   on_policy_steps=6)


@pytest.mark.slow
def test_reduced_demo_on_the_shipped_base_shows_the_effect(tmp_path, capsys):
    out = tmp_path / "demo"
    summary = run_demo(out, CI_SIZE, seed=0)
    for v in VARIANTS:
        for rel in (f"runs/{v}/claims.jsonl", f"runs/{v}/metrics.json", f"probes/{v}/dirk.json",
                    f"data/pairs-{v}/stats.json", f"models/{v}/adapter_model.safetensors"):
            assert (out / rel).exists(), rel
        state = json.loads((out / "models" / v / "trainer_state.json").read_text())
        assert state["global_step"] == CI_SIZE.max_steps  # the reduced size really reached the trainer
    for rel in ("report.md", "trajectory.png", "dirk.png", "compare/compare.json", "summary.json",
                "data/train.enhanced.jsonl", "data/annotators.yaml", "soft_trajectory.png", "reliability.png"):
        assert (out / rel).exists(), rel
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary)) and set(on_disk["variants"]) == {*VARIANTS, ON_POLICY}
    # the on-policy variant (real-demo --on-policy): GRPO from real_sufficient's adapter, every reward term
    # logged, evaluated and reported like the others, its goals stated in drift.json
    state = json.loads((out / "models" / ON_POLICY / "trainer_state.json").read_text())
    assert state["global_step"] == CI_SIZE.on_policy_steps
    assert {f"rewards/{t}/mean" for t in REWARD_TERMS} <= {k for e in state["log_history"] for k in e}
    assert "GRPOTrainer" in (out / "models" / ON_POLICY / "README.md").read_text()
    assert on_disk["variants"][ON_POLICY]["n_claims"] == 50 and f"| {ON_POLICY} |" in (out / "report.md").read_text()
    # judged by its own goals, not the Table-2 pattern: 6 steps of necessity alone from this 60-step
    # real_sufficient leave it unreadable (measured: a_0 0.12, invalid 0.40; its recipe weighs neither format
    # nor label, docs/demo.md), which drift.json reports as missed goals
    assert [p["held"] for p in json.loads((out / "drift.json").read_text())["on_policy"]][0] is (
        on_disk["variants"][ON_POLICY]["label_accuracy"] >= 0.98)
    # the effect, with margins a broken pipeline cannot pass: the demo's own Table-2 statements (real.demo.drift),
    # among them that the control arm catches REAL's cue (SPEC §6): it abstains when lines that are neither cited
    # nor gold go (60 steps, matched control: IS_ctrl 0.77 measured, sft 0.0) and on gold-only pools; the full
    # demo's numbers are in docs/demo.md
    failed = [statement for statement, held in table2_pattern(on_disk) if not held]
    assert not failed, (failed, {v: (m["IS"], m["control"]) for v, m in on_disk["variants"].items()})
    # real_sufficient answers where real abstains: on the gold lines alone and on short pools of the size sweep
    # (60 steps, measured: gold-only Acc 0.84 vs real's 0.0, sweep Acc 0.74 vs 0.15; necessity needs the full
    # demo's 8 epochs: IS - IS_ctrl 77.3 there, docs/demo.md)
    suf, real = on_disk["variants"]["real_sufficient"], on_disk["variants"]["real"]
    assert suf["gold_only"]["label_accuracy"] - real["gold_only"]["label_accuracy"] >= 0.5
    assert suf["size_sweep"]["sweep_accuracy"] - real["size_sweep"]["sweep_accuracy"] >= 0.3
    assert suf["cited_only"]["label_accuracy"] - real["cited_only"]["label_accuracy"] >= 0.4
    for v in VARIANTS:
        ctrl = on_disk["variants"][v]["control"]
        assert ctrl["n_control_claims"] >= 40 and on_disk["variants"][v]["gold_only"]["n_claims"] == 50, v
    drift = json.loads((out / "drift.json").read_text())  # a reduced run is not compared with the full one
    assert drift["pattern_held"] and "size" in drift["skipped"]
    assert len(drift["on_policy"]) == 6 and "on_policy needs its evidence" in drift["on_policy"][1]["statement"]
    for v in VARIANTS:
        assert on_disk["variants"][v]["n_claims"] == 50 and on_disk["variants"][v]["soft"]["n_with_probs"] == 50
    # enhancement really ran: the real client and vote, answers that beat gold's recall
    enh = on_disk["enhancement"]
    assert enh["summary"]["made"] == 3 * 160 and enh["summary"]["failed"] == 0
    assert enh["enhanced"]["recall"] > enh["gold"]["recall"] and enh["n_incomplete_gold"] > 0
    train = load_records(out / "data" / "train.enhanced.jsonl")
    assert all(r.enhanced_evidence is not None and set(r.extra["annotations"]) == {a.model for a in ANNOTATORS}
               for r in train)
    inc = on_disk["incomplete_gold"]["incomplete"]
    assert set(inc) == {*VARIANTS, ON_POLICY} and inc["real"]["n_claims"] > 0
    compare = json.loads((out / "compare" / "compare.json").read_text())  # SPEC §8 on sft vs real
    assert {"S00", "S01", "S10", "S11", "G", "E0", "A1", "A0", "E1", "I"} <= set(compare)
    report = (out / "report.md").read_text()
    for v in VARIANTS:
        assert f"| {v} |" in report and f"| {v} (incomplete gold) |" in report
    assert "## Evidence enhancement" in report and "## PAVE: arbitration profile" in report
    assert "| Model | IS | soft IS | NEI area | ECE r0 |" in report
    assert "## Control arm and gold-only pools: is IS evidence?" in report and "| real_sufficient |" in report
    assert "## Sufficiency: does it answer on the evidence alone?" in report and (out / "sufficiency.png").is_file()
    for v in ("sft", "real"):
        assert set(on_disk["pave"][v]) == {"entity", "semantic"}
    printed = capsys.readouterr().out
    assert "| no_enhancement |" in printed and "soft FAE (x100" in printed


def test_simulated_annotators_are_seeded_and_of_different_quality():
    w = build_world(seed=0)
    facts, _ = train_test_facts(w, 200, 1, seed=10)
    recs = add_incomplete_gold(make_split(w, facts, seed=11, prefix="t"), seed="a")
    from data_prep.enhance.prompt import render_annotator_prompt

    scores = {}
    for a in ANNOTATORS:
        hits = picks = truth = 0
        for r in recs:
            got = annotate(a, render_annotator_prompt(r), seed=0)
            assert got == annotate(a, render_annotator_prompt(r), seed=0)  # reruns agree with the cache
            hits += len(set(got) & set(r.extra["proving_ids"]))
            picks += len(got)
            truth += len(r.extra["proving_ids"])
        scores[a.model] = (hits / picks, hits / truth)
    recalls = [scores[a.model][1] for a in ANNOTATORS]
    assert recalls == sorted(recalls, reverse=True) and recalls[0] > 0.9 > recalls[-1]
    assert annotate(ANNOTATORS[0], render_annotator_prompt(recs[0]), seed=1) is not None


def test_real_data_enhance_runs_against_the_simulated_annotators(tmp_path):
    from data_prep.cli import main as real_data

    train, _ = write_world_records(tmp_path, DemoSize(n_train=30, n_test=2), seed=0)
    with AnnotatorServer() as srv:
        ann = write_annotators_yaml(tmp_path / "ann.yaml", srv.base_url, seed=0)
        out = tmp_path / "enh.jsonl"
        argv = ["enhance", "--records", str(train), "--annotators", str(ann), "--output", str(out), "--no-progress"]
        assert real_data(argv) == 0
        first = out.read_text()
        assert real_data(argv) == 0  # a rerun is served from the cache, with the same answers
    assert out.read_text() == first
    summary = json.loads((tmp_path / "enh.jsonl.summary.json").read_text())
    assert summary["requests"]["served_from_cache"] == 90 and summary["requests"]["made"] == 0
    recs = load_records(out)
    assert any(len(r.enhanced_evidence) > len(r.gold_ids) for r in recs if r.extra["incomplete_gold"])


def test_demo_refuses_a_directory_it_did_not_write_and_deletes_nothing(tmp_path, capsys):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "mine.jsonl").write_text("{}\n")
    (project / "notes.md").write_text("keep\n")
    assert real_demo(["--output", str(project)]) == UserError.exit_code
    err = capsys.readouterr().err
    assert "not a real-demo output" in err and str(project) in err and "data" in err
    assert (project / "data" / "mine.jsonl").read_text() == "{}\n" and (project / "notes.md").exists()
    assert not (project / MARKER).exists()


def test_a_rerun_clears_the_previous_demo_results(tmp_path):
    out = tmp_path / "demo_out"
    claim_output(out).release()  # a first run: the marker is written
    for rel in ("summary.json", "report.md", "dirk.png", "runs/sft/claims.jsonl", "models/real/x"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text("old run")
    (out / "mine.txt").write_text("not a demo file")
    claim_output(out).release()
    # a run killed after this point cannot leave an earlier run's summary beside its partial runs
    assert not any((out / rel).exists() for rel in ("summary.json", "report.md", "dirk.png", "runs", "models"))
    assert (out / "mine.txt").exists()  # only what the demo writes is removed


def test_an_older_demo_output_without_the_marker_is_still_a_demo_output(tmp_path):
    out = tmp_path / "demo_out"
    (out / "runs").mkdir(parents=True)
    (out / "summary.json").write_text("{}")
    claim_output(out).release()
    assert not (out / "summary.json").exists() and not (out / "runs").exists() and (out / MARKER).exists()


def test_two_demos_on_one_output_the_second_stops_and_deletes_nothing(tmp_path):
    out = tmp_path / "demo_out"
    first = claim_output(out)
    try:
        (out / "runs" / "sft").mkdir(parents=True)
        (out / "runs" / "sft" / "claims.jsonl").write_text("first run's answers\n")
        with pytest.raises(UserError, match="in use by real-demo"):
            claim_output(out)
        assert (out / "runs" / "sft" / "claims.jsonl").read_text() == "first run's answers\n"
    finally:
        first.release()


def test_build_base_stops_when_another_build_holds_the_output(tmp_path):
    out = tmp_path / "base"
    with RunLock(out, "real-demo build-base", is_dir=True):
        with pytest.raises(UserError, match="in use by real-demo build-base"):
            build_base(out, steps=2, batch_size=2, eval_every=2, hidden_size=16, num_layers=1, log=lambda *_: None)
    assert not (out / "build_log.jsonl").exists() and not (out / "resume_state.pt").exists()


_STAGE_WITH_GRANDCHILD = """
import subprocess, sys, time
grand = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(grand.pid))
time.sleep(120)
"""

_DEMO_RUNNING_A_STAGE = """
import sys
from pathlib import Path
from real_fae_core.entry import run_guarded
from real.demo.pipeline import run_stage
stage = [sys.executable, "-c", sys.argv[1], sys.argv[2]]
sys.exit(run_guarded("real-demo", lambda argv: run_stage(stage, Path(sys.argv[3]))))
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has stopped running


def test_a_stopped_demo_stops_its_stage_and_the_stage_children(tmp_path):
    """`accelerate launch` starts real.train as a grandchild: SIGTERM to real-demo must not orphan it."""
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "grandchild.pid"
    demo = subprocess.Popen([sys.executable, "-c", _DEMO_RUNNING_A_STAGE, _STAGE_WITH_GRANDCHILD, str(pid_file),
                             str(tmp_path / "stage.log")], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    assert _alive(grandchild)
    demo.send_signal(signal.SIGTERM)
    assert demo.wait(timeout=30) != 0
    assert "terminated" in demo.stderr.read()
    deadline = time.monotonic() + 15
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_a_failed_stage_stops_the_stages_running_beside_it(tmp_path):
    """Trainings run side by side: one failing must stop the other (and its grandchild) and name the failure."""
    import sys
    import time

    from real.demo.pipeline import run_stages

    pid_file = tmp_path / "grandchild.pid"
    failing = [sys.executable, "-c", "import sys, time; time.sleep(5); print('out of memory'); sys.exit(3)"]
    slow = [sys.executable, "-c", _STAGE_WITH_GRANDCHILD, str(pid_file)]
    queued = tmp_path / "never.log"
    started = time.monotonic()
    with pytest.raises(UserError) as err:
        run_stages([(slow, tmp_path / "slow.log", None), (failing, tmp_path / "failing.log", None),
                    ([sys.executable, "-c", "pass"], queued, None)], lanes=2)
    assert time.monotonic() - started < 60  # not the 120 s the slow stage would take
    assert "exit 3" in str(err.value) and "out of memory" in str(err.value) and "failing.log" in str(err.value)
    assert not queued.exists()  # the third stage never started
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 15
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_training_lanes_split_the_cores_between_two_trainings():
    from real.demo.pipeline import training_lanes

    assert training_lanes(1) == (1, 1) and training_lanes(None) == (1, 1)
    assert training_lanes(2) == (2, 1) and training_lanes(3) == (2, 1) and training_lanes(16) == (2, 8)
