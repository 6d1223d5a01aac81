"""Counterfactual evidence (issue 19): `real-data counterfactual` on the shared Check-COVID and
SciFact files (rule-based counter-entity swaps; LLM rewrites through the local OpenAI-compatible
server, cached), per-kind results in `fae pave`, and the demo world's native counterfactuals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.cli import main as real_data
from data_prep.counterfactual.entity import SpanCorpus, entity_swap, find_spans
from data_prep.counterfactual.rewrite import rewrite_problem, topic_overlap
from data_prep.records import save_records
from fae.cli import main as fae
from helpers import make_record_dict
from openai_server import LocalOpenAIServer, claim_of

DATASETS = {
    "check-covid": ("check-covid/covidCheck_dev_composed+extracted.json", "check-covid/corpus.json"),
    "scifact": ("scifact/claims_dev.jsonl", "scifact/corpus_cited.jsonl"),
}


@pytest.fixture(scope="module")
def converted(shared_data, tmp_path_factory) -> dict[str, Path]:
    """Both shared datasets converted once to claim records (the real converters)."""
    out = {}
    base = tmp_path_factory.mktemp("cf-records")
    for name, (claims, corpus) in DATASETS.items():
        path = base / f"{name}.jsonl"
        assert real_data(["convert", "--dataset", name, "--claims", str(shared_data / claims),
                          "--corpus", str(shared_data / corpus), "--output", str(path)]) == 0
        out[name] = path
    return out


def _read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# ---------------------------------------------------------------------------
# counter-entity, rule-based, on the real files
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_entity_swaps_change_one_span_and_keep_the_rest(converted, dataset, tmp_path, capsys):
    src = converted[dataset]
    out = tmp_path / "cf.jsonl"
    assert real_data(["counterfactual", "--records", str(src), "--output", str(out), "--kinds", "entity",
                      "--no-progress"]) == 0
    assert "entity (rules)" in capsys.readouterr().out
    before, after = _read(src), _read(out)
    assert len(before) == len(after)
    n_pools = 0
    for old, new in zip(before, after):
        cf = new.pop("counterfactual_sentences", None)
        assert new == old  # every other field intact, same order
        if cf is None:
            continue
        n_pools += 1
        assert set(cf) == {"entity"}
        gold = {i for g in old["evidence"] for i in g}
        texts = {s["id"]: s for s in old["sentences"]}
        for s in cf["entity"]:
            assert s["id"] in gold and s.get("doc") == texts[s["id"]].get("doc")  # sentence ids kept
            orig = texts[s["id"]]["text"]
            assert s["text"] != orig
            new = s["text"]
            # one salient span of the original was replaced by something else; the rest is byte for byte kept
            assert any(new.startswith(orig[:sp.start]) and new.endswith(orig[sp.end:])
                       and len(new) >= sp.start + len(orig) - sp.end
                       and new[sp.start:len(new) - (len(orig) - sp.end)] != sp.text
                       for sp in find_spans(orig)), (orig, new)
    assert n_pools >= 0.8 * len(before)
    summary = json.loads((tmp_path / "cf.jsonl.summary.json").read_text())
    assert summary["kinds"]["entity"]["records_with_pool"] == n_pools
    assert summary["requests"]["made"] == 0  # rules: no model, no request


def test_entity_swaps_are_seeded_and_independent_of_record_order(converted, tmp_path):
    src = _read(converted["check-covid"])
    shuffled = tmp_path / "reversed-input.jsonl"
    shuffled.write_text("".join(json.dumps(r) + "\n" for r in reversed(src)))
    runs = {}
    for name, path, seed in (("a", converted["check-covid"], 0), ("b", converted["check-covid"], 0),
                             ("rev", shuffled, 0), ("seed1", converted["check-covid"], 1)):
        out = tmp_path / f"{name}.jsonl"
        assert real_data(["counterfactual", "--records", str(path), "--output", str(out), "--kinds", "entity",
                          "--seed", str(seed), "--no-progress"]) == 0
        runs[name] = {r["id"]: r.get("counterfactual_sentences") for r in _read(out)}
    assert runs["a"] == runs["b"] == runs["rev"]
    assert runs["seed1"] != runs["a"]


def test_spans_are_whole_tokens():
    spans = [(s.kind, s.text) for s in find_spans("RR 0.52; 95% CI 0.24-1.12 in SARS-CoV-2 and COVID-19 (March 2020).")]
    assert spans == [("entity", "RR"), ("number", "0.52"), ("percent", "95%"), ("entity", "CI"), ("entity", "SARS-CoV-2"),
                     ("entity", "COVID-19"), ("month", "March"), ("year", "2020")]


def test_replacements_come_from_the_corpus_and_keep_their_kind():
    corpus = SpanCorpus.from_texts(["Cases rose 12% in March 2020 in Wuhan.", "About 30% of 450 patients in Italy."])
    text, swaps = entity_swap("Deaths fell 5% in Spain.", corpus, seed=0, record_id="r", sentence_id=0, swaps=2)
    for sw in swaps:
        assert sw.replacement in corpus.by_kind[sw.kind] and sw.replacement != sw.original
    assert entity_swap("no salient span here.", corpus, seed=0, record_id="r", sentence_id=0) is None


@settings(derandomize=True, max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(list("abcXYZ019 .,%-") + ["COVID-19", "March", " 2020", "The "]),
                max_size=30).map("".join), st.integers(0, 3))
def test_swap_replaces_exactly_the_chosen_spans(text, seed):
    spans = find_spans(text)
    assert all(text[s.start:s.end] == s.text for s in spans)
    assert all(a.end <= b.start for a, b in zip(spans, spans[1:]))  # ordered, non-overlapping
    corpus = SpanCorpus.from_texts([text, "Zed 7 44% April 1999 Qux-2"])
    got = entity_swap(text, corpus, seed=seed, record_id="x", sentence_id=seed, swaps=2)
    if got is None:
        return
    new, swaps = got
    rebuilt, pos = [], 0
    for sw in swaps:
        assert text[sw.start:sw.start + len(sw.original)] == sw.original
        rebuilt += [text[pos:sw.start], sw.replacement]
        pos = sw.start + len(sw.original)
    assert "".join(rebuilt) + text[pos:] == new


def test_rewrite_check_wants_a_different_sentence_on_the_same_topic():
    orig = "Remdesivir reduced the recovery time of hospitalized COVID-19 patients."
    ok = json.dumps({"sentence": "Remdesivir did not shorten the recovery time of hospitalized COVID-19 patients."})
    assert rewrite_problem(orig, ok, 0.3) is None
    assert "identical" in rewrite_problem(orig, json.dumps({"sentence": orig.upper()}), 0.3)
    assert "left the topic" in rewrite_problem(orig, json.dumps({"sentence": "The sky is green today."}), 0.3)
    assert "JSON" in rewrite_problem(orig, "Sure, here it is", 0.3)
    assert topic_overlap(orig, orig) == 1.0


# ---------------------------------------------------------------------------
# counter-semantic (and LLM counter-entity) through the local server, cached
# ---------------------------------------------------------------------------

OFF_TOPIC = "Bananas are yellow fruit grown in warm places."


def _sentence_of(body: dict) -> str:
    return re.search(r"^Sentence: (.*)$", body["messages"][-1]["content"], re.MULTILINE).group(1)


def _rewriter(bad: set[str]):
    """Contradicts a sentence (semantic) or swaps one word (entity); off-topic for sentences in ``bad``."""

    def respond(body):
        text = _sentence_of(body)
        if text in bad:
            return json.dumps({"sentence": OFF_TOPIC})
        if "opposite" in body["messages"][0]["content"]:
            return json.dumps({"sentence": f"Contrary to this report, it is not true that {text[0].lower()}{text[1:]}"})
        words = text.split()
        return json.dumps({"sentence": " ".join(words[:-1] + ["Atlantis."])})

    return respond


def _yaml(path: Path, url: str) -> Path:
    path.write_text(f"annotators:\n  - name: writer\n    base_url: {url}\n    model: writer-1\n"
                    f"    max_concurrency: 4\n    temperature: 0.0\n    max_tokens: 200\n    max_retries: 1\n"
                    f"    malformed_retries: 1\n    backoff_base: 0.01\n")
    return path


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_llm_rewrites_go_through_the_server_and_a_rerun_makes_zero_requests(converted, dataset, tmp_path, capsys):
    recs = _read(converted[dataset])[:6]
    src = tmp_path / "in.jsonl"
    save_records(recs, src)
    first_gold = {s["id"]: s["text"] for s in recs[0]["sentences"]}[recs[0]["evidence"][0][0]]
    out = tmp_path / "cf.jsonl"
    with LocalOpenAIServer(responder=_rewriter({first_gold})) as srv:
        ann = _yaml(tmp_path / "ann.yaml", srv.base_url)
        argv = ["counterfactual", "--records", str(src), "--output", str(out), "--annotators", str(ann),
                "--entity-method", "llm", "--no-progress"]
        assert real_data(argv) == 0
        made = srv.count()
        gold_of = {r["id"]: [s["text"] for s in r["sentences"] if any(s["id"] in g for g in r["evidence"])]
                   for r in recs}
        n_gold = sum(map(len, gold_of.values()))
        unique = {t for texts in gold_of.values() for t in texts}  # claims of one abstract share sentences
        # one request per distinct sentence and kind; the off-topic one is re-asked once (malformed_retries: 1)
        assert made == 2 * len(unique) + 2
        first = out.read_text()
        summary = json.loads((tmp_path / "cf.jsonl.summary.json").read_text())
        assert real_data(argv) == 0
        assert srv.count() == made  # everything from the cache
    assert out.read_text() == first
    again = json.loads((tmp_path / "cf.jsonl.summary.json").read_text())
    assert again["requests"]["made"] == 0 and again["requests"]["served_from_cache"] == 2 * n_gold
    assert summary["requests"]["made"] == made and summary["tokens"]["in"] > 0
    assert again["tokens"]["in_incl_cache"] == summary["tokens"]["in_incl_cache"]  # cost of cached answers kept
    for kind in ("entity", "semantic"):
        failed = summary["kinds"][kind]["failed_rewrites"]
        assert [(f["id"], "left the topic" in f["reason"]) for f in failed] == \
            [(rid, True) for rid, texts in gold_of.items() for t in texts if t == first_gold]
    for old, new in zip(recs, _read(out)):
        cf = new.pop("counterfactual_sentences", {})
        assert new == old
        gold = {s["id"]: s["text"] for s in old["sentences"]}
        for kind, pool in cf.items():
            for s in pool:
                assert s["text"] != gold[s["id"]] and OFF_TOPIC not in s["text"]
        if set(gold_of[old["id"]]) != {first_gold}:
            assert set(cf) == {"entity", "semantic"}
        else:
            assert cf == {}  # its only gold sentence failed both kinds: no pool rather than a bad one
        assert all(s["text"].startswith("Contrary to this report") for s in cf.get("semantic", []))


def test_a_changed_min_overlap_asks_again_instead_of_replaying_the_cached_verdict(converted, tmp_path):
    recs = _read(converted["check-covid"])[:2]
    src = tmp_path / "in.jsonl"
    save_records(recs, src)
    first_gold = {s["id"]: s["text"] for s in recs[0]["sentences"]}[recs[0]["evidence"][0][0]]
    out = tmp_path / "cf.jsonl"
    with LocalOpenAIServer(responder=_rewriter({first_gold})) as srv:
        ann = _yaml(tmp_path / "ann.yaml", srv.base_url)
        argv = ["counterfactual", "--records", str(src), "--output", str(out), "--annotators", str(ann),
                "--kinds", "semantic", "--no-progress"]
        assert real_data(argv) == 0
        failed = json.loads((tmp_path / "cf.jsonl.summary.json").read_text())["kinds"]["semantic"]["failed_rewrites"]
        assert failed and all("left the topic" in f["reason"] for f in failed)  # under the default threshold
        made = srv.count()
        assert real_data(argv) == 0 and srv.count() == made  # same threshold: all from the cache
        assert real_data([*argv, "--min-overlap", "0"]) == 0
        assert srv.count() > made  # a new threshold: asked again, not replayed from the cache
    summary = json.loads((tmp_path / "cf.jsonl.summary.json").read_text())
    assert summary["kinds"]["semantic"]["failed_rewrites"] == []  # accepted under --min-overlap 0
    assert OFF_TOPIC in out.read_text()


def test_semantic_needs_annotators_and_failed_requests_exit_1_and_resume(converted, tmp_path, capsys):
    recs = _read(converted["check-covid"])[:3]
    src = tmp_path / "in.jsonl"
    save_records(recs, src)
    out = tmp_path / "cf.jsonl"
    assert real_data(["counterfactual", "--records", str(src), "--output", str(out)]) == 2
    assert "--annotators is required" in capsys.readouterr().err
    calls = {"n": 0}

    def faults(body, attempt):
        calls["n"] += 1
        return "500" if calls["n"] <= 1 else None  # the very first request fails for good (max_retries 0)

    with LocalOpenAIServer(responder=_rewriter(set()), faults=faults) as srv:
        ann = _yaml(tmp_path / "ann.yaml", srv.base_url)
        ann.write_text(ann.read_text().replace("max_retries: 1", "max_retries: 0"))
        argv = ["counterfactual", "--records", str(src), "--output", str(out), "--annotators", str(ann),
                "--kinds", "semantic", "--no-progress"]
        assert real_data(argv) == 1
        assert not out.exists() and "run the same command again" in capsys.readouterr().err
        n = srv.count()
        assert real_data(argv) == 0  # only the failed request is sent again
        assert srv.count() == n + 1
    assert all("semantic" in r["counterfactual_sentences"] for r in _read(out))


# ---------------------------------------------------------------------------
# fae pave: per-kind results
# ---------------------------------------------------------------------------

OTHER = {"SUPPORT": "REFUTE", "REFUTE": "SUPPORT"}


def test_fae_pave_reports_each_kind(tmp_path, capsys):
    recs, golds = [], {}
    for k in range(12):
        gold = "SUPPORT" if k % 2 == 0 else "REFUTE"
        claim = f"Claim number {k} holds."
        golds[claim] = gold
        recs.append(make_record_dict(id=f"r{k}", claim=claim, label=gold, counterfactual_sentences={
            "entity": [{"id": 0, "text": f"ENTITY swap {k}."}], "semantic": [{"id": 0, "text": f"SEMANTIC {k}."}]}))
    path = tmp_path / "eval.jsonl"
    save_records(recs, path)

    def respond(body):
        gold = golds[claim_of(body)]
        user = body["messages"][-1]["content"]
        # knows every claim; misled by entity swaps, persists against semantic rewrites
        label = OTHER[gold] if "ENTITY" in user else gold
        return json.dumps({"label": label, "evidence": [0] if "Document:" in user else []})

    out = tmp_path / "pave"
    with LocalOpenAIServer(responder=respond) as srv:
        assert fae(["pave", "--records", str(path), "--backend", "openai", "--model", "m", "--base-url",
                    srv.base_url, "--samples", "3", "--temperature", "0.8", "--output", str(out),
                    "--no-progress", "--stability", "vote", "--max-retries", "0"]) == 0
    printed = capsys.readouterr().out
    res = json.loads((out / "pave.json").read_text())
    assert list(res["kinds"]) == ["entity", "semantic"] and res["primary_kind"] == "entity"
    assert res["kinds"]["entity"]["profile"]["PR"] == 0.0 and res["kinds"]["semantic"]["profile"]["PR"] == 1.0
    assert res["profile"] == res["kinds"]["entity"]["profile"]  # top level = the first kind
    assert re.search(r"^entity +Margin .* PR 0\.00%", printed, re.MULTILINE)
    assert re.search(r"^semantic +Margin .* PR 100\.00%", printed, re.MULTILINE)
    md = (out / "pave.md").read_text()
    assert "## By kind of counterfactual evidence" in md
    assert "## Arbitration profile: counter-entity" in md and "## JSD arbitration: counter-semantic" in md
    line = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert set(line["conditions"]) == {"claim_only", "gold_evidence", "counterfactual_entity",
                                       "counterfactual_semantic"}


@pytest.mark.parametrize("value,reason", [({}, "non-empty list"), ({"Entity!": [{"id": 0, "text": "x"}]}, "kind"),
                                          ({"entity": []}, "counterfactual_sentences.entity")])
def test_fae_pave_rejects_bad_kind_pools_with_one_line(tmp_path, capsys, value, reason):
    path = tmp_path / "eval.jsonl"
    save_records([make_record_dict(id="r0", counterfactual_sentences=value)], path)
    assert fae(["pave", "--records", str(path), "--model", "m", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and reason in err[0] and "r0" in err[0]


# ---------------------------------------------------------------------------
# the demo world
# ---------------------------------------------------------------------------


def test_demo_world_counterfactuals_leave_the_world_and_records_unchanged(tmp_path):
    from real.demo.world import (
        add_counterfactuals,
        build_world,
        make_split,
        train_test_facts,
    )

    world = build_world(seed=0)
    _, facts = train_test_facts(world, 50, 30, seed=10)
    plain = make_split(world, facts, seed=12, prefix="t")
    with_cf = add_counterfactuals(world, make_split(world, facts, seed=12, prefix="t"), seed=13)
    assert build_world(seed=0).facts == world.facts
    vocab = world.words()
    for a, b in zip(plain, with_cf):
        cf = b.extra.pop("counterfactual_sentences")
        assert a == b
        fact = world.facts[(a.extra["entity"], a.extra["attribute"])]
        (gold,) = a.gold_ids
        (ent,), (sem,) = cf["entity"], cf["semantic"]
        assert ent["id"] == sem["id"] == gold
        # counter-entity: only the value differs, and it is another value of the same attribute
        new_value = ent["text"].split()[-2]
        assert ent["text"] == fact.sentence(new_value) and new_value in world.values[fact.attribute]
        assert new_value != fact.value
        # counter-semantic: the entity gets another value; the true value is said to belong elsewhere
        first, second = sem["text"].split(" . ")
        assert fact.value not in first.split() and second.endswith(f"is {fact.value} .")
        assert set(sem["text"].split()) <= vocab and set(ent["text"].split()) <= vocab  # the word tokenizer knows them
    again = add_counterfactuals(world, make_split(world, facts, seed=12, prefix="t"), seed=13)
    assert [r.extra["counterfactual_sentences"] for r in again] == \
        [r.extra["counterfactual_sentences"] for r in add_counterfactuals(world, with_cf, seed=13)]
