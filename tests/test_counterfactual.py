"""Counterfactual evidence: `real-data counterfactual` on the shared Check-COVID and SciFact files.

Every counterfactual must carry the verdict opposite to its claim's gold
label (PAVE's label consistency): claim-aware rule-based swaps, proved by
rule; LLM rewrites (and unproved swaps) checked by an LLM judge through the
local OpenAI-compatible server, cached, with request seeds derived from
what is asked; per-kind results in `fae pave`; the demo world's native
counterfactuals.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from data_prep.cli import main as real_data
from data_prep.counterfactual.entity import SpanCorpus, claim_aware_swap, find_spans
from data_prep.counterfactual.rewrite import OPPOSITE, rewrite_problem, topic_overlap
from data_prep.counterfactual.runner import request_seed
from data_prep.records import save_records
from fae.cli import main as fae
from helpers import make_record_dict
from openai_server import LocalOpenAIServer, claim_of

DATASETS = {  # name -> (converter, claims file, corpus file) under the shared data
    "check-covid": ("check-covid", "check-covid/covidCheck_dev_composed+extracted.json", "check-covid/corpus.json"),
    "scifact": ("scifact", "scifact/claims_dev.jsonl", "scifact/corpus_cited.jsonl"),
    # the train split has REFUTE claims whose value a rule can move to the claim's ("36.4%" -> "7.8%")
    "check-covid-train": ("check-covid", "check-covid/covidCheck_train_composed+extracted.json",
                          "check-covid/corpus.json"),
}
DEV = ("check-covid", "scifact")


@pytest.fixture(scope="module")
def converted(shared_data, tmp_path_factory) -> dict[str, Path]:
    """The shared datasets converted once to claim records (the real converters)."""
    out = {}
    base = tmp_path_factory.mktemp("cf-records")
    for name, (converter, claims, corpus) in DATASETS.items():
        path = base / f"{name}.jsonl"
        assert real_data(["convert", "--dataset", converter, "--claims", str(shared_data / claims),
                          "--corpus", str(shared_data / corpus), "--output", str(path)]) == 0
        out[name] = path
    return out


def _read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _gold_texts(rec: dict) -> dict[int, str]:
    gold = {i for g in rec["evidence"] for i in g}
    return {s["id"]: s["text"] for s in rec["sentences"] if s["id"] in gold}


# ---------------------------------------------------------------------------
# counter-entity, rule-based and claim-aware, on the real files
# ---------------------------------------------------------------------------


# An oracle written apart from the implementation (no find_spans): what values a sentence states.
_MONTH_NAMES = "January|February|March|April|May|June|July|August|September|October|November|December"
_VALUE_RE = re.compile(rf"(?<![\w.,-])\d+(?:[.,]\d+)*(?:\s?%)?(?![\w%-]|[.,]\d)|\b(?:{_MONTH_NAMES})\b")
_UP_WORDS = {"increase", "increased", "increases", "rose", "rise", "rises", "higher", "more", "greater", "grew"}
_DOWN_WORDS = {"decrease", "decreased", "decreases", "fell", "fall", "falls", "lower", "less", "fewer", "declined",
               "reduced", "reduction"}


def _values(text: str) -> set[str]:
    """Numbers, percentages (years among them) and months a text states."""
    return {" ".join(m.group().casefold().split()) for m in _VALUE_RE.finditer(text)}


def _masked(text: str) -> str:
    return _VALUE_RE.sub("<V>", text)


def _direction_words(text: str) -> tuple[bool, bool]:
    words = set(re.findall(r"[a-z]+", text.lower()))
    return bool(words & _UP_WORDS), bool(words & _DOWN_WORDS)


def flips_by_rule(claim: str, label: str, original: str, new: str) -> bool:
    """An independent reading of the rule: SUPPORT -> a value the claim and the evidence stated is gone;
    REFUTE -> a value the claim states and the evidence lacked is now stated, and the evidence does not
    speak of the opposite direction alone ("decreased" where the claim says "increased"); nothing else moved."""
    if _masked(original) != _masked(new):
        return False
    if label == "SUPPORT":
        return bool((_values(claim) & _values(original)) - _values(new))
    claim_up, claim_down = _direction_words(claim)
    new_up, new_down = _direction_words(new)
    if (claim_up and not claim_down and new_down and not new_up) or (claim_down and not claim_up and new_up
                                                                      and not new_down):
        return False
    return bool((_values(claim) - _values(original)) & _values(new))


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_rule_swaps_carry_the_opposite_verdict_and_the_rest_is_counted(converted, dataset, tmp_path, capsys):
    src = converted[dataset]
    out = tmp_path / "cf.jsonl"
    assert real_data(["counterfactual", "--records", str(src), "--output", str(out), "--kinds", "entity",
                      "--no-progress"]) == 0
    assert "entity (rules)" in capsys.readouterr().out
    before, after = _read(src), _read(out)
    assert len(before) == len(after)
    kept = {"SUPPORT": 0, "REFUTE": 0}
    for old, new in zip(before, after):
        cf = new.pop("counterfactual_sentences", None)
        assert new == old  # every other field intact, same order
        if cf is None:
            continue
        assert set(cf) == {"entity"}
        gold = _gold_texts(old)
        docs = {s["id"]: s.get("doc") for s in old["sentences"]}
        for s in cf["entity"]:
            assert s["id"] in gold and s.get("doc") == docs[s["id"]] and s["check"] == "rule"
            assert flips_by_rule(old["claim"], old["label"], gold[s["id"]], s["text"]), (old["claim"], s["text"])
            kept[old["label"]] += 1
    summary = json.loads((tmp_path / "cf.jsonl.summary.json").read_text())["kinds"]["entity"]
    assert summary["kept"] == sum(kept.values()) == summary["label_check"]["rule"] > 0
    assert summary["kept"] + summary["dropped"] == summary["sentences"]
    assert sum(summary["dropped_by_reason"].values()) == summary["dropped"] == len(summary["dropped_sentences"])
    # a name swap is not provable by rule: without a judge it is dropped, and counted as such
    assert summary["dropped_by_reason"]["a name swap, not provable by rule, and no judge"] > 0
    if dataset == "check-covid-train":
        assert kept["REFUTE"] > 0 and kept["SUPPORT"] > 0


def test_rule_swaps_are_seeded_and_independent_of_record_order(converted, tmp_path):
    src = _read(converted["check-covid-train"])
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("".join(json.dumps(r) + "\n" for r in reversed(src)))
    runs = {}
    for name, path, seed in (("a", converted["check-covid-train"], 0), ("b", converted["check-covid-train"], 0),
                             ("rev", shuffled, 0), ("seed1", converted["check-covid-train"], 1)):
        out = tmp_path / f"{name}.jsonl"
        assert real_data(["counterfactual", "--records", str(path), "--output", str(out), "--kinds", "entity",
                          "--seed", str(seed), "--no-progress"]) == 0
        runs[name] = {r["id"]: r.get("counterfactual_sentences") for r in _read(out)}
    assert runs["a"] == runs["b"] == runs["rev"]
    assert runs["seed1"] != runs["a"]  # SUPPORT swaps draw their replacement value


def test_spans_are_whole_tokens():
    spans = [(s.kind, s.text) for s in find_spans("RR 0.52; 95% CI 0.24-1.12 in SARS-CoV-2 and COVID-19 (March 2020).")]
    assert spans == [("entity", "RR"), ("number", "0.52"), ("percent", "95%"), ("entity", "CI"), ("entity", "SARS-CoV-2"),
                     ("entity", "COVID-19"), ("month", "March"), ("year", "2020")]


CORPUS = SpanCorpus.from_texts(["Cases rose 12% in March 2020 in Wuhan.", "About 30% of 450 patients in Italy.",
                                "Mortality was 45% in 2021 among 812 adults in Spain.", "A phase 3 trial."])


def _swap(claim, label, text):
    return claim_aware_swap(claim, label, text, CORPUS, seed=0, record_id="r", sentence_id=0)


def test_support_claims_get_their_value_moved_away_and_refute_claims_get_their_own_value():
    # SUPPORT: the claim's 45% leaves the evidence (every occurrence), replaced by a percentage of the corpus
    swap, why = _swap("Mortality was 45% in Spain.", "SUPPORT", "Mortality reached 45% (45% of 812 adults).")
    assert why is None and swap.proved and swap.direction.startswith("away")
    assert "45%" not in swap.text and swap.text.count(swap.swaps[0].replacement) == 2
    assert swap.swaps[0].replacement in CORPUS.by_kind["percent"]
    # REFUTE: the evidence's differing value (same unit, matching neighbours) becomes the claim's
    swap, why = _swap("The vaccine was 95% effective in adults.", "REFUTE",
                      "In 2020 the vaccine was 70% effective in adults and 60% in children.")
    assert why is None and swap.proved and swap.text == "In 2020 the vaccine was 95% effective in adults and 60% in children."
    # a swapped name, a bounded value ("more than"), a one-digit label: returned, but not proved by rule
    assert not _swap("ACE2 binds the spike.", "SUPPORT", "The spike binds ACE2 in Wuhan.")[0].proved
    assert not _swap("More than 450 patients died.", "SUPPORT", "In all, 450 patients died.")[0].proved
    assert not _swap("Type 2 diabetes was common.", "SUPPORT", "Type 2 diabetes was seen in 30% of cases.")[0].proved
    assert not _swap("About 40 days passed.", "REFUTE", "About 12 patients were seen.")[0].proved  # days vs patients
    # nothing to swap: no shared span (SUPPORT), no differing value (REFUTE)
    assert _swap("Masks work.", "SUPPORT", "In Italy 30% wore masks.") == (None, "the sentence states none of the "
                                                                          "claim's values or names")
    assert _swap("Masks work.", "REFUTE", "In Italy 30% wore masks.")[1].startswith("the claim states no value")


@settings(derandomize=True, max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(list("abcXYZ019 .,%-") + ["COVID-19", "March", " 2020", "The ", " 45%", " 12 days"]),
                max_size=30).map("".join),
       st.lists(st.sampled_from(["COVID-19", "March", "2020", "45%", "12 days", "7 days", "Zed"]), max_size=4),
       st.sampled_from(["SUPPORT", "REFUTE"]), st.integers(0, 3))
def test_claim_aware_swap_replaces_exactly_the_chosen_spans(text, claim_words, label, seed):
    claim = " ".join(["Claim"] + claim_words) + "."
    corpus = SpanCorpus.from_texts([text, claim, "Zed 7 44% April 1999 Qux-2 13 days"])
    swap, why = claim_aware_swap(claim, label, text, corpus, seed=seed, record_id="x", sentence_id=seed)
    if swap is None:
        assert why
        return
    rebuilt, pos = [], 0
    for sw in swap.swaps:
        assert text[sw.start:sw.start + len(sw.original)] == sw.original
        rebuilt += [text[pos:sw.start], sw.replacement]
        pos = sw.start + len(sw.original)
    assert "".join(rebuilt) + text[pos:] == swap.text
    claim_spans = {s.text.casefold() for s in find_spans(claim)}
    if label == "SUPPORT":  # the claim's span leaves the sentence for one the claim does not state
        assert all(sw.original.casefold() in claim_spans and sw.replacement.casefold() not in claim_spans
                   for sw in swap.swaps)
    else:  # the sentence's span gives way to the claim's own
        assert all(sw.replacement.casefold() in claim_spans and sw.original.casefold() not in claim_spans
                   for sw in swap.swaps)


def test_rewrite_check_wants_a_different_sentence_on_the_same_topic():
    orig = "Remdesivir reduced the recovery time of hospitalized COVID-19 patients."
    ok = json.dumps({"sentence": "Remdesivir did not shorten the recovery time of hospitalized COVID-19 patients."})
    assert rewrite_problem(orig, ok, 0.3) is None
    assert "identical" in rewrite_problem(orig, json.dumps({"sentence": orig.upper()}), 0.3)
    assert "left the topic" in rewrite_problem(orig, json.dumps({"sentence": "The sky is green today."}), 0.3)
    assert "JSON" in rewrite_problem(orig, "Sure, here it is", 0.3)
    assert topic_overlap(orig, orig) == 1.0


# ---------------------------------------------------------------------------
# LLM rewrites and the LLM judge, through the local server, cached and seeded
# ---------------------------------------------------------------------------

OFF_TOPIC = "Bananas are yellow fruit grown in warm places."


def _field(body: dict, name: str) -> str | None:
    m = re.search(rf"^{name}: (.*)$", body["messages"][-1]["content"], re.MULTILINE)
    return m.group(1) if m else None


def _is_judge(body: dict) -> bool:
    return _field(body, "Evidence") is not None


def stated(claim: str, verdict: str) -> str:
    """How the scripted rewriter makes a sentence give a verdict, and how the scripted judge reads one."""
    return f"Hence it is {'false' if verdict == 'REFUTE' else 'true'} that {claim.strip()}"


def scripted_llm(off_topic: set[str] = frozenset(), stubborn: set[str] = frozenset(), sampled: bool = False):
    """Rewriter: appends a statement of the intended verdict ("Hence it is false that <claim>"), except
    for claims in ``stubborn`` (always "true", whatever was asked) and sentences in ``off_topic``.
    Judge: REFUTE / SUPPORT when the evidence says the claim is false / true, else NOT_ENOUGH_INFO.
    ``sampled``: the rewrite's wording depends on the request seed, as a sampling server's would."""

    def respond(body):
        claim = _field(body, "Claim")
        if _is_judge(body):
            evidence = _field(body, "Evidence")
            label = ("REFUTE" if stated(claim, "REFUTE") in evidence else
                     "SUPPORT" if stated(claim, "SUPPORT") in evidence else "NOT_ENOUGH_INFO")
            return json.dumps({"label": label})
        text, verdict = _field(body, "Sentence"), _field(body, "Intended verdict")
        if text in off_topic:
            return json.dumps({"sentence": OFF_TOPIC})
        said = "SUPPORT" if claim in stubborn else verdict
        lead = random.Random(body["seed"]).choice(["Indeed,", "Notably,", "In short,"]) + " " if sampled else ""
        return json.dumps({"sentence": f"{lead}{text} {stated(claim, said)}"})

    return respond


def _yaml(path: Path, url: str, temperature: float = 0.0) -> Path:
    path.write_text(f"annotators:\n  - name: writer\n    base_url: {url}\n    model: writer-1\n"
                    f"    max_concurrency: 4\n    temperature: {temperature}\n    max_tokens: 200\n    max_retries: 1\n"
                    f"    malformed_retries: 1\n    backoff_base: 0.01\n")
    return path


def _both_labels(path: Path, n: int) -> list[dict]:
    """The first ``n`` SUPPORT and the first ``n`` REFUTE records, in file order."""
    recs = _read(path)
    keep = {r["id"] for lab in ("SUPPORT", "REFUTE") for r in [x for x in recs if x["label"] == lab][:n]}
    return [r for r in recs if r["id"] in keep]


@pytest.mark.parametrize("dataset", DEV)
def test_llm_counterfactuals_carry_the_opposite_verdict_checked_by_the_judge(converted, dataset, tmp_path):
    recs = _both_labels(converted[dataset], 3)
    src = tmp_path / "in.jsonl"
    save_records(recs, src)
    supports = [r for r in recs if r["label"] == "SUPPORT"]
    first_gold = next(iter(_gold_texts(supports[0]).values()))
    stubborn = {supports[1]["claim"], [r for r in recs if r["label"] == "REFUTE"][1]["claim"]}
    out = tmp_path / "cf.jsonl"
    llm = recording(scripted_llm({first_gold}, stubborn))
    with LocalOpenAIServer(responder=llm) as srv:
        ann = _yaml(tmp_path / "ann.yaml", srv.base_url)
        argv = ["counterfactual", "--records", str(src), "--output", str(out), "--annotators", str(ann),
                "--entity-method", "llm", "--no-progress"]
        assert real_data(argv) == 0
        made = srv.count()
        bodies = list(llm.seen)
        first = out.read_text()
        summary = json.loads((tmp_path / "cf.jsonl.summary.json").read_text())
        assert real_data(argv) == 0
        assert srv.count() == made  # everything from the cache
    assert out.read_text() == first
    label_of = {r["claim"]: r["label"] for r in recs}
    rewrites = [b for b in bodies if not _is_judge(b)]
    judged = [b for b in bodies if _is_judge(b)]
    # the rewrite saw the claim and the verdict it must give; the judge never sees the intended verdict
    assert rewrites and all(_field(b, "Intended verdict") == OPPOSITE[label_of[_field(b, "Claim")]] for b in rewrites)
    assert judged and not any("Intended verdict" in b["messages"][-1]["content"] for b in judged)
    n_gold = sum(len(_gold_texts(r)) for r in recs)
    off_topic = sum(t == first_gold for r in recs for t in _gold_texts(r).values())
    assert len(rewrites) == 2 * (n_gold + off_topic)  # one per gold sentence and kind; off-topic ones re-asked once
    kept_by_label = {"SUPPORT": 0, "REFUTE": 0}
    for old, new in zip(recs, _read(out)):
        cf = new.pop("counterfactual_sentences", {})
        assert new == old
        gold = _gold_texts(old)
        want = OPPOSITE[old["label"]]
        for kind, pool in cf.items():
            for s in pool:
                assert s["check"] == "judge" and s["text"].startswith(gold[s["id"]])
                assert s["text"].endswith(stated(old["claim"], want))  # the opposite verdict, every one kept
                kept_by_label[old["label"]] += 1
        if old["claim"] in stubborn and old["label"] == "SUPPORT":
            assert cf == {}  # its rewrites still supported the claim: the judge dropped them
    assert kept_by_label["SUPPORT"] > 0 and kept_by_label["REFUTE"] > 0
    stubborn_support = sum(1 for r in recs if r["claim"] in stubborn and r["label"] == "SUPPORT"
                           for t in _gold_texts(r).values() if t != first_gold)
    assert stubborn_support > 0
    for kind in ("entity", "semantic"):
        k = summary["kinds"][kind]
        reasons = k["dropped_by_reason"]
        assert reasons["label check: the judge reads SUPPORT, not REFUTE"] == stubborn_support
        assert reasons["rewrite failed: the rewrite left the topic"] == off_topic
        assert k["kept"] + k["dropped"] == k["sentences"] == n_gold and k["label_check"]["judge"] == k["kept"]
    assert summary["requests_by_task"]["judge"]["made"] == len(judged)


def recording(respond):
    """The responder, keeping every request body it answered (the server's log keeps no bodies)."""
    def wrapped(body):
        wrapped.seen.append(body)
        return respond(body)

    wrapped.seen = []
    return wrapped


def test_rule_swaps_that_no_rule_proves_go_to_the_judge(converted, tmp_path):
    recs = _both_labels(converted["check-covid"], 15)
    src = tmp_path / "in.jsonl"
    save_records(recs, src)
    out = tmp_path / "cf.jsonl"
    llm = recording(scripted_llm())
    with LocalOpenAIServer(responder=llm) as srv:
        ann = _yaml(tmp_path / "ann.yaml", srv.base_url)
        assert real_data(["counterfactual", "--records", str(src), "--output", str(out), "--annotators", str(ann),
                          "--kinds", "entity", "--no-progress"]) == 0
    k = json.loads((tmp_path / "cf.jsonl.summary.json").read_text())["kinds"]["entity"]
    # a swapped name leaves the claim's verdict to a reader: this judge reads NOT_ENOUGH_INFO and drops it
    judged = [b for b in llm.seen if _is_judge(b)]
    assert judged and k["method"] == "rules" and k["label_check"]["judge"] == 0
    assert sum(n for reason, n in k["dropped_by_reason"].items()
               if reason.startswith("label check: the judge reads NOT_ENOUGH_INFO")) == len(judged)
    assert "a name swap, not provable by rule, and no judge" not in k["dropped_by_reason"]


def test_sampled_requests_get_seeds_derived_from_what_is_asked(converted, tmp_path):
    """At temperature > 0 each request's seed is a function of (seed, record, sentence, task, attempt):
    records in another order, or a run resumed after failures, ask with the same seeds and get the same
    answers from a server that honours them; a malformed answer's re-ask moves to the next attempt's seed."""
    recs = _both_labels(converted["scifact"], 3)
    straight, backwards = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    save_records(recs, straight)
    save_records(list(reversed(recs)), backwards)
    bad_rec = recs[0]
    bad_sid, bad_text = next(iter(_gold_texts(bad_rec).items()))
    bad_seed = request_seed(0, bad_rec["id"], bad_sid, "rewrite-semantic", 0)
    base = scripted_llm(sampled=True)

    def respond(body):  # the first attempt of one rewrite is malformed
        return "no JSON here" if body.get("seed") == bad_seed and not _is_judge(body) else base(body)

    outputs, seeds = {}, {}
    for name, src, faults in (("straight", straight, None), ("backwards", backwards, None),
                              ("resumed", straight, lambda body, attempt: "500" if attempt == 0 and
                               not _is_judge(body) and len(body["messages"][-1]["content"]) % 3 == 0 else None)):
        llm = recording(respond)
        with LocalOpenAIServer(responder=llm, faults=faults) as srv:
            ann = _yaml(tmp_path / f"{name}.yaml", srv.base_url, temperature=0.7)
            ann.write_text(ann.read_text().replace("max_retries: 1", "max_retries: 0"))
            argv = ["counterfactual", "--records", str(src), "--output", str(tmp_path / f"{name}-cf.jsonl"),
                    "--annotators", str(ann), "--kinds", "semantic", "--no-progress"]
            if faults is None:
                assert real_data(argv) == 0
            else:
                assert real_data(argv) == 1  # some requests failed: nothing written, answers so far cached
                assert real_data(argv) == 0  # resumed: only the failed ones are asked again
        outputs[name] = {r["id"]: r.get("counterfactual_sentences") for r in _read(tmp_path / f"{name}-cf.jsonl")}
        seeds[name] = sorted((_field(b, "Claim"), _field(b, "Sentence") or _field(b, "Evidence"), b["seed"])
                             for b in llm.seen)
        assert all(isinstance(b.get("seed"), int) for b in llm.seen)
    assert outputs["straight"] == outputs["backwards"] == outputs["resumed"]
    assert seeds["straight"] == seeds["backwards"]
    assert set(seeds["resumed"]) == set(seeds["straight"])  # retried requests resent the same seed
    asked = [s for c, t, s in seeds["straight"] if c == bad_rec["claim"] and t == bad_text]
    assert bad_seed in asked and request_seed(0, bad_rec["id"], bad_sid, "rewrite-semantic", 1) in asked
    assert bad_rec["id"] in outputs["straight"] and outputs["straight"][bad_rec["id"]]["semantic"]
    wording = {s["text"].split()[0] for pools in outputs["straight"].values() if pools for s in pools["semantic"]}
    assert len(wording) > 1  # the seeds really vary from request to request


def test_a_changed_min_overlap_asks_again_instead_of_replaying_the_cached_verdict(converted, tmp_path):
    recs = _both_labels(converted["check-covid"], 1)
    src = tmp_path / "in.jsonl"
    save_records(recs, src)
    first_gold = next(iter(_gold_texts(recs[0]).values()))
    out = tmp_path / "cf.jsonl"
    with LocalOpenAIServer(responder=scripted_llm(off_topic={first_gold})) as srv:
        ann = _yaml(tmp_path / "ann.yaml", srv.base_url)
        argv = ["counterfactual", "--records", str(src), "--output", str(out), "--annotators", str(ann),
                "--kinds", "semantic", "--no-progress"]
        assert real_data(argv) == 0
        summary = json.loads((tmp_path / "cf.jsonl.summary.json").read_text())["kinds"]["semantic"]
        assert summary["dropped_by_reason"]["rewrite failed: the rewrite left the topic"] >= 1  # default threshold
        made = srv.count()
        assert real_data(argv) == 0 and srv.count() == made  # same threshold: all from the cache
        assert real_data([*argv, "--min-overlap", "0"]) == 0
        assert srv.count() > made  # a new threshold: asked again, not replayed from the cache
    summary = json.loads((tmp_path / "cf.jsonl.summary.json").read_text())["kinds"]["semantic"]
    assert "rewrite failed: the rewrite left the topic" not in summary["dropped_by_reason"]
    # accepted under --min-overlap 0, then dropped by the judge: the off-topic sentence gives no verdict
    assert OFF_TOPIC not in out.read_text()
    assert summary["dropped_by_reason"]["label check: the judge reads NOT_ENOUGH_INFO, not REFUTE"] >= 1


def test_semantic_needs_annotators_and_failed_requests_exit_1_and_resume(converted, tmp_path, capsys):
    recs = _both_labels(converted["check-covid"], 2)
    src = tmp_path / "in.jsonl"
    save_records(recs, src)
    out = tmp_path / "cf.jsonl"
    assert real_data(["counterfactual", "--records", str(src), "--output", str(out)]) == 2
    assert "--annotators is required" in capsys.readouterr().err
    calls = {"n": 0}

    def faults(body, attempt):
        calls["n"] += 1
        return "500" if calls["n"] <= 1 else None  # the very first request fails for good (max_retries 0)

    with LocalOpenAIServer(responder=scripted_llm(), faults=faults) as srv:
        ann = _yaml(tmp_path / "ann.yaml", srv.base_url)
        ann.write_text(ann.read_text().replace("max_retries: 1", "max_retries: 0"))
        argv = ["counterfactual", "--records", str(src), "--output", str(out), "--annotators", str(ann),
                "--kinds", "semantic", "--no-progress"]
        assert real_data(argv) == 1
        assert not out.exists() and "run the same command again" in capsys.readouterr().err
        n = srv.count()
        assert real_data(argv) == 0  # the failed rewrite and then its judgement are sent
        assert srv.count() == n + 2
    assert all("semantic" in r["counterfactual_sentences"] for r in _read(out))


# ---------------------------------------------------------------------------
# the human validity audit
# ---------------------------------------------------------------------------

def test_fleiss_kappa_reproduces_the_textbook_example():
    from data_prep.counterfactual.audit_score import fleiss_kappa

    # Fleiss (1971) as tabulated on Wikipedia: 10 subjects, 14 raters, 5 categories; P = 0.378, Pe = 0.213, κ = 0.210
    table = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
             [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
    assert round(fleiss_kappa(table), 3) == 0.210
    assert fleiss_kappa([[3, 0], [0, 3], [3, 0]]) == 1.0  # perfect agreement
    assert fleiss_kappa([[0, 3], [0, 3]]) is None  # one category only: chance agreement is 1, κ undefined
    # two raters: Fleiss' κ is Scott's π, by hand: agreement 4/5, chance 0.5² + 0.5² -> (0.8 - 0.5) / 0.5
    assert fleiss_kappa([[2, 0], [0, 2], [2, 0], [0, 2], [1, 1]]) == pytest.approx((0.8 - 0.5) / 0.5)
    with pytest.raises(ValueError):
        fleiss_kappa([[2, 1], [1, 1]])


def test_audit_sheets_round_trip_with_pass_rates_and_kappa(tmp_path, capsys):
    import csv

    from data_prep.counterfactual.audit import CRITERIA

    recs = []
    for k in range(40):
        label = "SUPPORT" if k % 2 == 0 else "REFUTE"
        recs.append(make_record_dict(id=f"r{k}", dataset="alpha" if k < 30 else "beta", claim=f"Claim {k}.",
                                     label=label, counterfactual_sentences={
                                         "entity": [{"id": 0, "text": f"Swapped {k}.", "check": "rule"}],
                                         **({"semantic": [{"id": 0, "text": f"Rewritten {k}.", "check": "judge"}]}
                                            if k % 4 < 2 else {})}))
    src = tmp_path / "cf.jsonl"
    save_records(recs, src)
    audit = tmp_path / "audit"
    assert real_data(["counterfactual-audit", "--records", str(src), "--output", str(audit),
                      "--size", "24"]) == 0
    sample = json.loads((audit / "audit.json").read_text())["sample"]
    assert len(sample) == 24 and len({(s["record_id"], s["kind"]) for s in sample}) == 24
    strata = {}
    for s in sample:
        key = (s["source"], s["kind"], s["gold_label"])
        strata[key] = strata.get(key, 0) + 1
    # 8 strata (alpha/beta x entity/semantic x SUPPORT/REFUTE), 3 each, but beta has only 2 semantic
    # instances per label: those are all taken and the 2 left over go to other strata
    assert len(strata) == 8 and strata[("beta", "semantic", "SUPPORT")] == strata[("beta", "semantic", "REFUTE")] == 2
    assert sorted(strata.values()) == [2, 2, 3, 3, 3, 3, 4, 4]
    n_entity = sum(s["kind"] == "entity" for s in sample)
    assert all(s["intended_verdict"] == OPPOSITE[s["gold_label"]] for s in sample)
    # three annotators: everyone passes everything, except that on semantic items rater 3 fails
    # label consistency, and on the first two entity items raters 1 and 2 fail claim relevance
    entity_items = [s["item"] for s in sample if s["kind"] == "entity"][:2]
    for r in (1, 2, 3):
        path = audit / f"sheet-{r}.csv"
        rows = list(csv.DictReader(path.read_text().splitlines()))
        for row in rows:
            for crit, _ in CRITERIA:
                row[crit] = "1"
            if row["kind"] == "semantic" and r == 3:
                row["label_consistency"] = "no"
            if int(row["item"]) in entity_items and r in (1, 2):
                row["claim_relevance"] = "0"
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
    assert real_data(["counterfactual-audit-score", str(audit)]) == 0
    res = json.loads((audit / "score.json").read_text())
    overall, entity, semantic = (res["groups"][g] for g in ("overall", "entity", "semantic"))
    assert semantic["pass_rate"]["label_consistency"] == 1.0  # 2 of 3 pass: the majority passes
    assert entity["pass_rate"]["claim_relevance"] == pytest.approx((n_entity - 2) / n_entity)
    assert entity["valid"] == n_entity - 2 and semantic["valid"] == 24 - n_entity and overall["valid"] == 22
    assert {i["item"] for i in res["invalid_items"]} == set(entity_items)
    # κ by hand for semantic label consistency: every item splits 2/1, so P = 1/3, pe = (2/3)² + (1/3)² = 5/9
    assert semantic["kappa"]["label_consistency"] == pytest.approx((1 / 3 - 5 / 9) / (1 - 5 / 9))
    assert semantic["kappa"]["artifact_free"] is None  # all pass: κ undefined, not a number
    assert "| claim_relevance |" in (audit / "score.md").read_text()
    # a blank criterion is one clear error naming file, line and field
    path = audit / "sheet-2.csv"
    rows = list(csv.DictReader(path.read_text().splitlines()))
    rows[2]["intervention_consistency"] = " "  # line 4: the header, then rows 0 and 1
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    capsys.readouterr()
    assert real_data(["counterfactual-audit-score", str(audit)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sheet-2.csv:4" in err[0] and "intervention_consistency" in err[0]


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
    assert {c for c in line["conditions"] if "@" not in c} == {  # "@jsd": the JSD rule's own runs
        "claim_only", "gold_evidence", "counterfactual_entity", "counterfactual_semantic"}


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


# ---------------------------------------------------------------------------
# the demo world
# ---------------------------------------------------------------------------


def test_demo_world_counterfactuals_carry_the_opposite_verdict_and_leave_the_records_unchanged(tmp_path):
    from real.demo.world import (
        add_counterfactuals,
        build_world,
        claimed_value,
        make_split,
        train_test_facts,
    )

    world = build_world(seed=0)
    _, facts = train_test_facts(world, 50, 60, seed=10)
    plain = make_split(world, facts, seed=12, prefix="t")
    with_cf = add_counterfactuals(world, make_split(world, facts, seed=12, prefix="t"), seed=13)
    assert build_world(seed=0).facts == world.facts
    assert {r.label for r in plain} == {"SUPPORT", "REFUTE"}
    vocab = world.words()
    for a, b in zip(plain, with_cf):
        cf = b.extra.pop("counterfactual_sentences")
        assert a == b
        fact = world.facts[(a.extra["entity"], a.extra["attribute"])]
        (gold,) = a.gold_ids
        (ent,), (sem,) = cf["entity"], cf["semantic"]
        assert ent["id"] == sem["id"] == gold and ent["check"] == sem["check"] == "rule"
        # counter-entity: only the value differs, another value of the same attribute; read against the
        # claim (one value per entity and attribute) it gives the opposite verdict
        new_value = ent["text"].split()[-2]
        assert ent["text"] == fact.sentence(new_value) and new_value in world.values[fact.attribute]
        assert new_value != fact.value
        verdict = "SUPPORT" if new_value == claimed_value(a) else "REFUTE"
        assert verdict == OPPOSITE[a.label]
        # counter-semantic: the entity gets that value too; the true value is said to belong elsewhere
        first, second = sem["text"].split(" . ")
        assert fact.value not in first.split() and second.endswith(f"is {fact.value} .")
        assert ("SUPPORT" if first.split()[-1] == claimed_value(a) else "REFUTE") == OPPOSITE[a.label]
        assert set(sem["text"].split()) <= vocab and set(ent["text"].split()) <= vocab  # the word tokenizer knows them
    again = add_counterfactuals(world, make_split(world, facts, seed=12, prefix="t"), seed=13)
    assert [r.extra["counterfactual_sentences"] for r in again] == \
        [r.extra["counterfactual_sentences"] for r in add_counterfactuals(world, with_cf, seed=13)]


_UP_VERBS, _DOWN_VERBS = ("increased", "rose", "grew"), ("decreased", "fell", "declined")
_STATED = re.compile(r"(increased|rose|grew|decreased|fell|declined) by (\d+)%")


def _stated(text: str) -> tuple[str, str]:
    """The oracle: the direction and value a generated sentence states, read from the template itself."""
    verb, value = _STATED.search(text).groups()
    return ("up" if verb in _UP_VERBS else "down"), value


@settings(derandomize=True, max_examples=200, deadline=None)
@given(st.sampled_from(["hospital admissions", "mortality", "viral load", "the infection rate"]),
       st.sampled_from(_UP_VERBS + _DOWN_VERBS), st.sampled_from(_UP_VERBS + _DOWN_VERBS),
       st.integers(10, 99), st.integers(10, 99), st.sampled_from(["SUPPORT", "REFUTE"]), st.integers(0, 5))
def test_a_proved_swap_states_the_opposite_verdict_with_the_claims_direction(metric, verb_claim, verb_sentence,
                                                                            v_claim, v_sentence, label, seed):
    """Generated (claim, sentence) pairs, read back by a template oracle: a swap is proved only when the new
    sentence states the opposite verdict — REFUTE -> the claim's value with the claim's direction; SUPPORT ->
    another value in the claim's direction — and a swap with both directions equal is proved (the rule is not
    vacuous)."""
    claim = f"In 2021, {metric} {verb_claim} by {v_claim}% in adults."
    if label == "SUPPORT":  # a sentence that supports the claim states its direction and value
        verb_sentence, v_sentence = verb_claim, v_claim
    elif (verb_claim in _UP_VERBS) == (verb_sentence in _UP_VERBS) and v_claim == v_sentence:
        v_sentence = v_claim + 1  # a refuting sentence differs in direction or value
    sentence = f"In 2021, {metric} {verb_sentence} by {v_sentence}% in adults."
    corpus = SpanCorpus.from_texts([claim, sentence, "About 44% and 7% were seen; 61% and 13% later."])
    swap, why = claim_aware_swap(claim, label, sentence, corpus, seed=seed, record_id="g", sentence_id=seed)
    claim_says = _stated(claim)
    same_direction = (verb_claim in _UP_VERBS) == (verb_sentence in _UP_VERBS)
    if swap is None:
        assert label == "REFUTE" and v_claim == v_sentence, why  # only a pure direction flip has no value to swap
        return
    new_says = _stated(swap.text)
    if label == "SUPPORT":
        assert swap.proved and new_says[0] == claim_says[0] and new_says[1] != claim_says[1]
    elif swap.proved:
        assert new_says == claim_says  # the claim's value with the claim's direction: it now supports it
    if label == "REFUTE":
        assert swap.proved == same_direction  # "decreased by 30%" never passes for "increased by 30%"


def test_a_value_swapped_in_with_the_opposite_direction_or_another_unit_is_not_proved():
    """The issue's example: "X decreased by 12%" rewritten to "X decreased by 30%" still refutes "X increased by
    30%"; it goes to the judge (unproved), never to the rule. So when the direction word stands far from its
    value, when a change has no direction the rule knows, or when the unit differs."""
    swap, why = _swap("X increased by 30%.", "REFUTE", "X decreased by 12%.")
    assert why is None and swap.text == "X decreased by 30%." and not swap.proved
    far = _swap("Sales increased over the last fiscal year by 30%.", "REFUTE",
                "Sales decreased over the last fiscal year by 12%.")[0]
    assert far.text == "Sales decreased over the last fiscal year by 30%." and not far.proved
    assert not _swap("Mortality improved by 30% in adults.", "REFUTE", "Mortality worsened by 12% in adults.")[0].proved
    assert not _swap("The dose was 30 mg/kg in adults.", "REFUTE", "The dose was 12 mg/day in adults.")[0].proved
    # SUPPORT: the claim's value moved away in a sentence that gives it another direction proves nothing either
    assert not _swap("X increased by 30% in adults.", "SUPPORT", "X fell, by 30% in adults.")[0].proved
    # where value, unit and direction agree the rule proves the flip (it is not vacuous)
    for claim, sentence in (("X increased by 30% in adults.", "X rose by 12% in adults."),
                            ("Sales increased over the last fiscal year by 30%.",
                             "Sales rose over the last fiscal year by 12%."),
                            ("The dose was 30 mg/kg in adults.", "The dose was 12 mg/kg in adults.")):
        swap, why = _swap(claim, "REFUTE", sentence)
        assert why is None and swap.proved, (claim, sentence, swap)


# An oracle of its own for generated sentences: a whitespace tokenizer and the generator's vocabulary (no regular
# expressions or word lists of the implementation): which direction, value and unit a sentence states.
_ORACLE_UP = {"increased", "rose", "grew", "climbed", "jumped", "increase", "rise", "gain"}
_ORACLE_DOWN = {"decreased", "fell", "declined", "dropped", "plunged", "shrank", "decrease", "drop", "reduction"}
_ORACLE_OTHER = {"changed", "shifted", "varied", "improved", "worsened"}  # a change whose direction is not stated
_ORACLE_UNITS = {"%", "mg", "days", "mg/kg", "mg/day", "patients"}


def _oracle(text: str) -> tuple[frozenset, str, str | None]:
    """(directions, value, unit): the change words read as up/down (any other change word as itself), the one
    number, and the unit token that follows it."""
    tokens = text.lower().replace("%", " %").replace(",", " ").rstrip(".").split()
    dirs = frozenset("up" if t in _ORACLE_UP else "down" if t in _ORACLE_DOWN else t
                     for t in tokens if t in _ORACLE_UP | _ORACLE_DOWN | _ORACLE_OTHER)
    (i, value), = [(i, t) for i, t in enumerate(tokens) if t.isdigit()]
    unit = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1] in _ORACLE_UNITS else None
    return dirs, value, unit


_VERBS = ("increased", "rose", "grew", "climbed", "jumped", "decreased", "fell", "declined", "dropped", "plunged",
          "shrank", "changed", "shifted", "varied", "improved", "worsened")
_NOUNS = ("increase", "rise", "gain", "decrease", "drop", "reduction")
_FILLERS = ("", " sharply", " over the last fiscal year", " in the second half of the trial period")


def _generated(template: int, subject: str, verb: str, noun: str, filler: str, value: int, unit: str) -> str:
    amount = f"{value}{unit}" if unit == "%" else f"{value} {unit}"
    if template == 0:  # the change, its amount after "by"
        return f"{subject.capitalize()} {verb}{filler} by {amount} in adults."
    if template == 1:  # the change as a noun after its amount
        return f"In adults, a {amount} {noun} in {subject} was seen{filler}."
    return f"{subject.capitalize()} was {amount}{filler} in adults."  # a level, no change


_SIDE = st.tuples(st.integers(0, 2), st.sampled_from(_VERBS), st.sampled_from(_NOUNS), st.sampled_from(_FILLERS),
                  st.integers(10, 99), st.sampled_from(sorted(_ORACLE_UNITS)))


@settings(derandomize=True, max_examples=400, deadline=None)
@given(st.sampled_from(["mortality", "the viral load", "the median dose", "the hospital stay"]), _SIDE, _SIDE,
       st.sampled_from(["SUPPORT", "REFUTE"]), st.integers(0, 3))
def test_a_proved_swap_states_the_claims_direction_value_and_unit_by_an_independent_oracle(subject, c_side, s_side,
                                                                                          label, seed):
    """Generated (claim, sentence) pairs over directions, values, units, templates and fillers that move the
    direction word away from its value: whenever the rule says proved, the oracle reads the new sentence as
    stating the claim's direction, value and unit (REFUTE -> it now supports the claim), or the claim's direction
    and unit with another value (SUPPORT -> it now refutes it)."""
    claim = _generated(c_side[0], subject, *c_side[1:])
    if label == "SUPPORT":  # a supporting sentence states what the claim states, in its own words
        template, verb, noun, filler = s_side[:4]
        sentence = _generated(c_side[0], subject, verb, noun, filler, *c_side[4:])
        assume(_oracle(sentence) == _oracle(claim))
    else:
        sentence = _generated(s_side[0], subject, *s_side[1:])
        assume(_oracle(sentence) != _oracle(claim))
    corpus = SpanCorpus.from_texts([claim, sentence, "About 44% and 61% of 73 and 58 cases."])
    swap, why = claim_aware_swap(claim, label, sentence, corpus, seed=seed, record_id="g", sentence_id=seed)
    if swap is None or not swap.proved:
        return
    claim_says, new_says = _oracle(claim), _oracle(swap.text)
    if label == "REFUTE":
        assert new_says == claim_says, (claim, sentence, swap.text)
    else:
        assert (new_says[0], new_says[2]) == (claim_says[0], claim_says[2]) and new_says[1] != claim_says[1], \
            (claim, sentence, swap.text)


def test_audit_of_a_counterfactual_run_that_kept_nothing_writes_empty_sheets_not_an_error(tmp_path, capsys):
    """`real-data counterfactual` can keep no sentence (no rule proves a flip and no judge is set): the audit
    says so and writes header-only sheets, so a pipeline does not stop there; records that never went
    through `real-data counterfactual` are still refused."""
    recs = [make_record_dict(id=f"r{k}", claim=f"Claim {k}.", label="SUPPORT") for k in range(3)]
    src = tmp_path / "cf.jsonl"
    save_records(recs, src)
    assert real_data(["counterfactual-audit", "--records", str(src), "--output", str(tmp_path / "a0")]) == 2
    assert "run `real-data counterfactual` first" in capsys.readouterr().err
    assert not (tmp_path / "a0").exists()
    summary = {"complete": True, "kinds": {"entity": {"sentences": 3, "kept": 0, "dropped": 3, "dropped_by_reason": {
        "a name swap, not provable by rule, and no judge": 2, "the sentence states none of the claim's values": 1}}}}
    (tmp_path / "cf.jsonl.summary.json").write_text(json.dumps(summary))
    audit = tmp_path / "audit"
    assert real_data(["counterfactual-audit", "--records", str(src), "--output", str(audit)]) == 0
    out = capsys.readouterr().out
    assert "nothing to audit" in out and "none of the 3 gold sentences" in out
    assert "2 a name swap, not provable by rule, and no judge" in out
    sample = json.loads((audit / "audit.json").read_text())
    assert sample["sample"] == [] and sample["instances_available"] == 0 and "nothing to audit" in sample["note"]
    for k in (1, 2, 3):
        lines = (audit / f"sheet-{k}.csv").read_text().splitlines()
        assert len(lines) == 1 and lines[0].startswith("item,")  # the header only
