"""The built-in demo: synthetic world, base-model builder, and a reduced end-to-end run."""

import json

import pytest
from transformers import AutoTokenizer

from data_prep.prompts import (
    format_answer,
    render_chat,
    render_evidence_prompt,
)
from data_prep.records import load_records
from real.demo.annotators import ANNOTATORS, AnnotatorServer, annotate, write_annotators_yaml
from real.demo.base_model import ExampleFactory, build_base, build_word_tokenizer, cosine_lambda, lr_lambda
from real.demo.pipeline import BASE_DIR, VARIANTS, DemoSize, run_demo, write_world_records
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


@pytest.mark.slow
def test_build_base_resumes(tmp_path):
    out = tmp_path / "base"
    build_base(out, steps=10, batch_size=8, eval_every=10, log=lambda *_: None)
    info = build_base(out, steps=20, batch_size=8, eval_every=10, log=lambda *_: None)
    steps = [json.loads(line)["step"] for line in (out / "build_log.jsonl").read_text().splitlines()]
    assert steps == [10, 20] and info["steps"] == 20  # continued from step 10, not from scratch


@pytest.mark.slow
def test_reduced_demo_end_to_end(tmp_path, quick_base, capsys):
    out = tmp_path / "demo"
    summary = run_demo(out, DemoSize(n_train=40, n_test=16, max_steps=6, bootstrap=100), seed=0, base=quick_base)
    for rel in ("runs/sft/claims.jsonl", "runs/real/metrics.json", "probes/sft/dirk.json", "probes/real/dirk.json",
                "report.md", "trajectory.png", "dirk.png", "compare/compare.json", "summary.json"):
        assert (out / rel).exists(), rel
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    for v in ("sft", "real"):
        metrics = json.loads((out / "runs" / v / "metrics.json").read_text())
        assert on_disk["variants"][v] == metrics and metrics["n_claims"] == 16 and metrics["rounds"] == 4
        state = json.loads((out / "models" / v / "trainer_state.json").read_text())
        assert state["global_step"] == 6  # the reduced size really reached the trainer
        assert (out / "models" / v / "adapter_model.safetensors").exists()
    assert (out / "dirk.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    compare = json.loads((out / "compare" / "compare.json").read_text())  # SPEC §8 on sft vs real
    assert {"S00", "S01", "S10", "S11", "G", "E0", "A1", "A0", "E1", "I"} <= set(compare)
    assert compare["n_claims"] == 16 and (out / "compare" / "compare.md").exists()
    report = (out / "report.md").read_text()
    assert "| sft |" in report and "| real |" in report
    # the PAVE step: both counterfactual kinds for both variants, in the summary and the report
    for v in ("sft", "real"):
        assert set(on_disk["pave"][v]) == {"entity", "semantic"}
        assert (out / "pave" / v / "pave.md").exists()
    assert "## PAVE: arbitration profile" in report and "| real | semantic |" in report
    # soft FAE: the soft columns, both figures, label probabilities on every round, the printed lines
    assert "| Model | IS | soft IS | NEI area | ECE r0 |" in report
    assert (out / "soft_trajectory.png").exists() and (out / "reliability.png").exists()
    for v in ("sft", "real"):
        assert on_disk["variants"][v]["soft"]["n_with_probs"] == 16
    assert {"soft_IS", "nei_area", "ece"} <= set(compare["metrics"])
    assert "soft FAE (x100" in capsys.readouterr().out
