"""`real-data families`: which records each rule joins, determinism, tie breaks, bad input, and the file
`fae compare --families` reads."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from fae_helpers import CLAIMS, write_run
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.cli import main as real_data
from data_prep.records import ClaimRecord
from data_prep.retrieval.families import (
    Edge,
    FamilyOptions,
    build_families,
    exact_key,
    lexical_neighbours,
    near_duplicate_pairs,
    negation_key,
    numeric_key,
)
from fae.cli import main as fae

REPO = Path(__file__).resolve().parents[1]
NONE = FamilyOptions(exact=False, numeric=False, negation=False, shared_docs="off", near_duplicates=False)


def record(rid: str, claim: str, docs=("d0",), gold_doc: str | None = None, **extra) -> ClaimRecord:
    """A record whose pool holds one sentence per doc; gold = the sentence of ``gold_doc`` (default: the first)."""
    sentences = [{"id": i, "text": f"sentence {i}", "doc": d} for i, d in enumerate(docs)]
    gold = list(docs).index(gold_doc) if gold_doc is not None else 0
    return ClaimRecord.from_dict({"id": rid, "claim": claim, "label": "SUPPORT", "sentences": sentences,
                                  "evidence": [[gold]], **extra})


def families(records, options=FamilyOptions()) -> dict[str, str]:
    return build_families(records, options).families


def together(fams: dict[str, str], a: str, b: str) -> bool:
    return fams[a] == fams[b]


# ---------------------------------------------------------------- each rule


def test_exact_match_ignores_case_whitespace_punctuation_and_unicode_forms():
    assert exact_key("Statins  decrease\tblood-cholesterol.") == exact_key("statins decrease blood cholesterol")
    assert exact_key("ＣＯＶＩＤ-19 spreads") == exact_key("covid 19 spreads")  # NFKC: full-width letters
    assert exact_key("?!") is None  # no word: matches nothing
    recs = [record("a", "Statins decrease cholesterol.", docs=("x",)),
            record("b", "STATINS  decrease cholesterol", docs=("y",)),
            record("c", "Statins decrease glucose.", docs=("z",)),
            record("d", "?!", docs=("u",)), record("e", "...", docs=("v",))]
    opts = FamilyOptions(numeric=False, negation=False, shared_docs="off", near_duplicates=False)
    fams = families(recs, opts)
    assert together(fams, "a", "b") and not together(fams, "a", "c") and not together(fams, "d", "e")
    assert not together(families(recs, NONE), "a", "b")


def test_numeric_mutations_differ_only_in_numbers():
    assert numeric_key("20% of patients had 1,500 cells") == numeric_key("35 % of patients had 2.5 cells")
    recs = [record("a", "20% of patients recover within 14 days.", docs=("x",)),
            record("b", "35% of patients recover within 3 days.", docs=("y",)),
            record("c", "Most patients recover within 14 days.", docs=("z",)),
            record("d", "20% of patients recover within 14 days", docs=("u",))]
    on = families(recs, FamilyOptions(exact=False, negation=False, shared_docs="off", near_duplicates=False))
    assert together(on, "a", "b") and not together(on, "a", "c")
    assert not together(on, "a", "d")  # an exact match is the exact rule's to join, not a mutation
    assert not together(families(recs, NONE), "a", "b")


def test_negation_mutations_are_narrow():
    assert negation_key("X doesn't cause Y") == negation_key("X does not cause Y") == negation_key("X does cause Y")
    assert negation_key("It can't, won't, cannot") == "it can will can"
    recs = [record("a", "Vitamin D is associated with lower mortality.", docs=("x",)),
            record("b", "Vitamin D is not associated with lower mortality.", docs=("y",)),
            record("c", "Vitamin D never isn't associated with lower mortality", docs=("z",)),
            record("d", "Vitamin D causes lower mortality.", docs=("u",)),
            record("e", "Vitamin D does not cause lower mortality.", docs=("v",))]
    opts = FamilyOptions(exact=False, numeric=False, shared_docs="off", near_duplicates=False)
    fams = families(recs, opts)
    assert together(fams, "a", "b") and together(fams, "a", "c")
    assert not together(fams, "d", "e")  # the verb changed too: not a negation-only mutation
    assert not together(families(recs, NONE), "a", "b")


def test_shared_documents_cited_gold_and_off():
    recs = [record("a", "alpha claim", docs=("d1", "d2"), gold_doc="d1"),
            record("b", "beta claim", docs=("d3", "d2"), gold_doc="d3"),  # shares d2 with a, not as gold
            record("c", "gamma claim", docs=("d1",)),  # shares d1 with a, as gold
            record("e", "delta claim", docs=("d9",), cited_docs=["d3"]),  # its cited_docs, not its pool
            record("f", "epsilon claim", docs=("d2",), cited_docs=[])]
    rules = dict(exact=False, numeric=False, negation=False, near_duplicates=False)
    cited = families(recs, FamilyOptions(shared_docs="cited", **rules))
    assert len({cited[r] for r in "abce"}) == 1 and not together(cited, "a", "f")
    gold = families(recs, FamilyOptions(shared_docs="gold", **rules))
    assert together(gold, "a", "c") and not together(gold, "a", "b") and not together(gold, "b", "e")
    assert len(set(families(recs, FamilyOptions(shared_docs="off", **rules)).values())) == 5


def test_near_duplicates_above_the_jaccard_threshold_among_bm25_neighbours():
    recs = [record("a", "Cold exposure increases brown adipose tissue recruitment", docs=("x",)),
            record("b", "Cold exposure reduces brown adipose tissue recruitment", docs=("y",)),  # 6/8
            record("c", "Cold exposure damages skin", docs=("z",))]
    opts = dict(exact=False, numeric=False, negation=False, shared_docs="off")
    res = build_families(recs, FamilyOptions(jaccard=0.7, **opts))
    assert together(res.families, "a", "b") and not together(res.families, "a", "c")
    assert res.near_duplicates == [("a", "b", 0.75)]
    assert not together(families(recs, FamilyOptions(jaccard=0.76, **opts)), "a", "b")
    assert together(families(recs, FamilyOptions(jaccard=0.75, **opts)), "a", "b")  # at least the threshold
    assert not together(families(recs, FamilyOptions(near_duplicates=False, **opts)), "a", "b")
    assert len(set(families(recs, FamilyOptions(jaccard=0.0, **opts)).values())) == 1


def test_only_the_top_neighbours_are_compared():
    # "q" ranks "q r v" first (shorter than "s t u q", ahead of the tie "q r w"); "s t u q" ranks "s t u x"
    # first: with one neighbour each, "q" and "s t u q" are never compared although their Jaccard is 1/4.
    texts = ["q", "q r v", "q r w", "s t u q", "s t u x"]
    assert lexical_neighbours(texts, 1)[0] == [1]
    assert [j for i, j, _ in near_duplicate_pairs(texts, 1, 0.2) if i == 0] == [1]
    assert {j for i, j, _ in near_duplicate_pairs(texts, 3, 0.2) if i == 0} == {1, 2, 3}


def test_bm25_ties_are_broken_by_text_order_and_families_named_by_their_smallest_id():
    # every other text shares one token with "a b", has the same length: equal BM25, so index order decides
    assert lexical_neighbours(["a b", "a c", "a d", "a e"], 2) == [[1, 2], [0, 2], [0, 1], [0, 1]]
    recs = [record(rid, "one and the same claim", docs=(rid,)) for rid in ("z9", "b2", "b10", "m")]
    assert set(families(recs).values()) == {"b10"}  # string order: "b10" < "b2"


def test_units_of_one_claim_are_always_one_family():
    recs = [record("scifact-12:4983", "first", docs=("4983",)), record("scifact-12:77", "second", docs=("77",)),
            record("scifact-13:77", "third", docs=("77",)),
            record("u1", "fourth", docs=("1",), claim_id="scifact-12"),
            record("a:b:c", "fifth", docs=("2",)), record("a:b:d", "sixth", docs=("3",))]
    fams = families(recs, NONE)
    assert len({fams["scifact-12:4983"], fams["scifact-12:77"], fams["u1"]}) == 1
    assert not together(fams, "scifact-12:77", "scifact-13:77")
    assert together(fams, "a:b:c", "a:b:d")  # split at the last separator
    assert len(set(families(recs, FamilyOptions(exact=False, numeric=False, negation=False, shared_docs="off",
                                                near_duplicates=False, unit_separator="")).values())) == 6


def test_the_link_counts_are_pairs_and_merges():
    recs = [record("a", "Statins lower cholesterol", docs=("x",)), record("b", "statins lower cholesterol!", docs=("y",)),
            record("c", "Statins lower cholesterol.", docs=("z",)), record("d", "Statins do not lower cholesterol", docs=("z",))]
    res = build_families(recs, FamilyOptions(near_duplicates=False))
    assert res.pairs == {"same_claim": 0, "exact": 3, "numeric": 0, "negation": 0, "shared_doc": 1}
    assert res.merges == {"same_claim": 0, "exact": 2, "numeric": 0, "negation": 0, "shared_doc": 1}
    assert build_families(recs, FamilyOptions(exact=False, near_duplicates=False)).merges["shared_doc"] == 1


# ---------------------------------------------------------------- properties

WORDS = ["not", "no", "cells", "virus", "increase", "reduce", "12", "7", "the", "of"]


@st.composite
def record_sets(draw):
    n = draw(st.integers(1, 12))
    ids = draw(st.lists(st.sampled_from([f"c{i}" for i in range(8)] + [f"c{i}:{j}" for i in range(3) for j in range(3)]),
                        min_size=n, max_size=n, unique=True))
    recs = []
    for rid in ids:
        words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=5))
        docs = draw(st.lists(st.sampled_from(["d1", "d2", "d3", "d4", "d5"]), min_size=1, max_size=2, unique=True))
        recs.append(record(rid, " ".join(words), docs=docs))
    return recs


OPTION_SETS = st.builds(FamilyOptions, exact=st.booleans(), numeric=st.booleans(), negation=st.booleans(),
                        shared_docs=st.sampled_from(["cited", "gold", "off"]), near_duplicates=st.booleans(),
                        neighbours=st.integers(1, 5), jaccard=st.sampled_from([0.0, 0.5, 0.7, 1.0]))


def components(ids, edges: list[Edge]) -> set[frozenset]:
    """The connected components of the links, by a search independent of the union-find."""
    adj = {i: set() for i in ids}
    for e in edges:
        adj[e.a].add(e.b)
        adj[e.b].add(e.a)
    seen, out = set(), set()
    for start in ids:
        if start in seen:
            continue
        stack, comp = [start], set()
        while stack:
            x = stack.pop()
            if x not in comp:
                comp.add(x)
                stack.extend(adj[x] - comp)
        seen |= comp
        out.add(frozenset(comp))
    return out


@settings(max_examples=80, deadline=None)
@given(record_sets(), OPTION_SETS, st.randoms(use_true_random=False))
def test_families_are_the_components_of_the_links_whatever_the_input_order(recs, options, rnd):
    res = build_families(recs, options)
    ids = [r.id for r in recs]
    assert sorted(res.families) == sorted(ids)  # a partition: every record exactly once
    groups: dict[str, set] = {}
    for rid, fam in res.families.items():
        groups.setdefault(fam, set()).add(rid)
    assert {frozenset(g) for g in groups.values()} == components(ids, res.edges)
    assert all(fam == min(g) for fam, g in groups.items())  # named by the smallest id
    assert all(res.families[e.a] == res.families[e.b] for e in res.edges)
    assert sum(res.merges.values()) == len(ids) - len(groups)
    for rid in ids:  # the units of one claim share a family
        if ":" in rid:
            assert all(res.families[o] == res.families[rid] for o in ids if o.split(":")[0] == rid.split(":")[0])
    shuffled = list(recs)
    rnd.shuffle(shuffled)
    again = build_families(shuffled, options)
    assert again.families == res.families and sorted(again.edges) == sorted(res.edges)
    assert again.pairs == res.pairs and again.near_duplicates == res.near_duplicates


@settings(max_examples=40, deadline=None)
@given(record_sets())
def test_turning_a_rule_off_never_joins_more(recs):
    full = set(build_families(recs, FamilyOptions()).families.values())
    for off in (dict(exact=False), dict(numeric=False), dict(negation=False), dict(shared_docs="off"),
                dict(near_duplicates=False)):
        assert len(set(build_families(recs, FamilyOptions(**off)).families.values())) >= len(full)


# ---------------------------------------------------------------- the command


def write_records(path: Path, recs: list[ClaimRecord]) -> Path:
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in recs), encoding="utf-8")
    return path


SAMPLE = [record("c1", "Statins are effective.", docs=("x",)), record("c2", "Statins are not effective.", docs=("y",)),
          record("c3", "Masks reduce transmission.", docs=("z",)), record("c4", "Zinc cures colds.", docs=("w",))]


def test_the_command_writes_families_and_a_summary_byte_identically_in_any_line_order(tmp_path, capsys):
    recs = write_records(tmp_path / "r.jsonl", SAMPLE)
    out = tmp_path / "fam.jsonl"
    assert real_data(["families", "--records", str(recs), "--output", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"id": "c1", "family": "c1"}, {"id": "c2", "family": "c1"}, {"id": "c3", "family": "c3"},
        {"id": "c4", "family": "c4"}]
    summary = json.loads((tmp_path / "fam.jsonl.summary.json").read_text())
    assert summary["n_records"] == 4 and summary["n_families"] == 3 and summary["family_sizes"] == {"1": 2, "2": 1}
    assert summary["links"]["negation"] == {"pairs": 1, "merges": 1}
    assert "4 records in 3 families" in capsys.readouterr().out
    first = (out.read_bytes(), (tmp_path / "fam.jsonl.summary.json").read_bytes())
    assert real_data(["families", "--records", str(recs), "--output", str(out)]) == 0
    assert (out.read_bytes(), (tmp_path / "fam.jsonl.summary.json").read_bytes()) == first
    permuted = list(SAMPLE)
    random.Random(3).shuffle(permuted)
    assert permuted != SAMPLE
    other = tmp_path / "fam2.jsonl"
    assert real_data(["families", "--records", str(write_records(tmp_path / "p.jsonl", permuted)),
                      "--output", str(other)]) == 0
    assert other.read_bytes() == out.read_bytes()


def test_the_options_reach_the_rules(tmp_path):
    recs = write_records(tmp_path / "r.jsonl", SAMPLE)
    out = tmp_path / "fam.jsonl"
    assert real_data(["families", "--records", str(recs), "--output", str(out), "--no-negation", "--jaccard", "0.8"]) == 0
    summary = json.loads((tmp_path / "fam.jsonl.summary.json").read_text())
    assert summary["n_families"] == 4 and "negation" not in summary["links"]  # c1/c2: Jaccard 0.75
    assert summary["options"]["negation"] is False and summary["options"]["jaccard"] == 0.8
    assert real_data(["families", "--records", str(recs), "--output", str(out), "--no-negation"]) == 0
    summary = json.loads((tmp_path / "fam.jsonl.summary.json").read_text())
    assert summary["n_families"] == 3 and summary["near_duplicates"] == [{"a": "c1", "b": "c2", "jaccard": 0.75}]


def test_families_feed_fae_compare(tmp_path):
    """The output is the file `fae compare --families` reads: units of one claim are one resampling unit."""
    ids = ["sf-1:11", "sf-1:12", "sf-2:13", "sf-3:14"]
    recs = [record(rid, text, docs=(rid.split(":")[1],)) for rid, text in
            zip(ids, ["Aspirin prevents strokes.", "Aspirin prevents strokes.", "Coffee shortens life.", "Tea helps."])]
    claims = [(rid, *rest) for rid, (_cid, *rest) in zip(ids, CLAIMS)]
    runs = [write_run(tmp_path / "sft", 0, claims=claims), write_run(tmp_path / "real", 1, claims=claims)]
    fam = tmp_path / "families.jsonl"
    assert real_data(["families", "--records", str(write_records(tmp_path / "r.jsonl", recs)),
                      "--output", str(fam), "--no-exact"]) == 0
    out = tmp_path / "cmp"
    assert fae(["compare", *map(str, runs), "-o", str(out), "--families", str(fam), "--bootstrap", "200"]) == 0
    res = json.loads((out / "compare.json").read_text())
    assert res["resampling_unit"] == "family" and res["n_units"] == 3


def test_shipped_scifact_and_check_covid_from_a_clean_clone(tmp_path):
    """Converted records of the shipped samples, and SciFact as claim × abstract units: the units of a claim
    share a family, and the unit families are the claim families."""
    data = REPO / "tests" / "data"
    sf, cc = tmp_path / "scifact.jsonl", tmp_path / "cc.jsonl"
    assert real_data(["convert", "--dataset", "scifact", "--claims", str(data / "scifact" / "claims_dev.jsonl"),
                      str(data / "scifact" / "claims_train.jsonl"), "--corpus",
                      str(data / "scifact" / "corpus_cited.jsonl"), "--output", str(sf), "--include-nei"]) == 0
    assert real_data(["convert", "--dataset", "check-covid", "--claims",
                      *(str(p) for p in sorted((data / "check-covid").glob("covidCheck_*.json"))),
                      "--corpus", str(data / "check-covid" / "corpus.json"), "--output", str(cc)]) == 0
    for path in (sf, cc):
        assert real_data(["families", "--records", str(path), "--output", str(path) + ".fam"]) == 0
        summary = json.loads(Path(str(path) + ".fam.summary.json").read_text())
        assert 0 < summary["n_families"] < summary["n_records"]
    claim_fams = {json.loads(line)["id"]: json.loads(line)["family"] for line in Path(str(sf) + ".fam").open()}
    units = []
    for line in sf.open():
        rec = json.loads(line)
        for doc in dict.fromkeys(s["doc"] for s in rec["sentences"]):
            sents = [s for s in rec["sentences"] if s["doc"] == doc]
            units.append({**rec, "id": f"{rec['id']}:{doc}", "sentences": sents, "evidence": [],
                          "label": "NOT_ENOUGH_INFO"})
    unit_path = tmp_path / "units.jsonl"
    unit_path.write_text("".join(json.dumps(u) + "\n" for u in units))
    assert real_data(["families", "--records", str(unit_path), "--output", str(tmp_path / "u.fam"),
                      "--no-exact", "--no-near-duplicates"]) == 0
    unit_fams = {json.loads(line)["id"]: json.loads(line)["family"] for line in (tmp_path / "u.fam").open()}
    by_claim: dict[str, set] = {}
    for uid, fam in unit_fams.items():
        by_claim.setdefault(uid.rsplit(":", 1)[0], set()).add(fam)
    assert all(len(f) == 1 for f in by_claim.values())
    pairs = [(a, b) for a in claim_fams for b in claim_fams if a < b]
    assert all((claim_fams[a] == claim_fams[b]) == (by_claim[a] == by_claim[b]) for a, b in pairs)


# ---------------------------------------------------------------- bad input


def good_line(rid="c1", **changes) -> str:
    return json.dumps({**record(rid, "A claim.").to_dict(), **changes})


BAD_INPUTS = {
    "not JSON": (["{not json"], [], r"r\.jsonl:1"),
    "missing field": ([good_line(), json.dumps({"id": "c2", "claim": "x", "label": "SUPPORT", "evidence": []})], [],
                      r"r\.jsonl:2: record 'c2': field 'sentences'"),
    "bad label": ([good_line(label="MAYBE")], [], r"r\.jsonl:1: record 'c1': field 'label'"),
    "duplicate id": ([good_line(), good_line("c2"), good_line()], [], r"r\.jsonl:3: record 'c1': field 'id': duplicate"),
    "empty": ([], [], r"r\.jsonl: no records"),
    "blank lines only": (["", "  "], [], r"r\.jsonl: no records"),
    "claim_id not a string": ([good_line(), good_line("c2", claim_id=7)], [],
                              r"r\.jsonl:2: record 'c2': field 'claim_id': must be a non-empty string"),
    "cited_docs not a list": ([good_line(cited_docs="d1")], [], r"r\.jsonl:1: record 'c1': field 'cited_docs'"),
    "cited_docs of numbers": ([good_line(), "", good_line("c2", cited_docs=[1, 2])], [],
                              r"r\.jsonl:3: record 'c2': field 'cited_docs'"),
    "gold_missed not groups": ([good_line(retrieval={"gold_missed": ["p1"]})], [],
                               r"r\.jsonl:1: record 'c1': field 'retrieval.gold_missed'"),
    "jaccard above 1": ([good_line()], ["--jaccard", "1.5"], r"jaccard: must be <= 1"),
    "jaccard below 0": ([good_line()], ["--jaccard", "-0.1"], r"jaccard: must be >= 0"),
    "jaccard nan": ([good_line()], ["--jaccard", "nan"], r"jaccard"),
    "neighbours 0": ([good_line()], ["--neighbours", "0"], r"neighbours: must be >= 1"),
    "unknown shared-docs": ([good_line()], ["--shared-docs", "all"], r"--shared-docs 'all': unknown"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_no_output(case, tmp_path, capsys):
    lines, flags, message = BAD_INPUTS[case]
    recs = tmp_path / "r.jsonl"
    recs.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    out = tmp_path / "out" / "fam.jsonl"
    assert real_data(["families", "--records", str(recs), "--output", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert re.search(message, err), err
    assert not out.exists() and not Path(str(out) + ".summary.json").exists()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_bad_paths_are_refused_and_an_old_output_is_kept(tmp_path, capsys):
    recs = write_records(tmp_path / "r.jsonl", SAMPLE)
    assert real_data(["families", "--records", str(tmp_path / "none.jsonl"), "--output", str(tmp_path / "f")]) == 2
    assert "none.jsonl: records file not found" in capsys.readouterr().err
    assert real_data(["families", "--records", str(recs), "--output", str(recs)]) == 2
    assert "is the records file" in capsys.readouterr().err
    assert real_data(["families", "--records", str(recs), "--output", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    old = tmp_path / "old.jsonl"
    old.write_text("kept\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good_line() + "\n" + good_line() + "\n")
    assert real_data(["families", "--records", str(bad), "--output", str(old)]) == 2
    assert old.read_text() == "kept\n" and sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "old.jsonl",
                                                                                          "r.jsonl"]


def test_retrieved_pages_are_not_citations():
    """A `real-data retrieve` record's pool is what BM25 found: its shared documents are its gold ones, found or
    missed, not its retrieved pages."""
    def unit(rid, doc, gold: bool, missed=()):
        rec = record(rid, f"claim {rid}", docs=(doc,)).to_dict()
        if not gold:
            rec.update(label="NOT_ENOUGH_INFO", evidence=[])
        rec["retrieval"] = {"pages": [{"doc": doc, "rank": 0}], "gold_missed": [[[d, 0]] for d in missed]}
        return ClaimRecord.from_dict(rec)
    recs = [unit("a:1", "p1", gold=True), unit("b:1", "p1", gold=False), unit("c:2", "p2", gold=False, missed=["p1"]),
            unit("d:3", "p3", gold=False)]
    fams = families(recs, FamilyOptions(exact=False, numeric=False, negation=False, near_duplicates=False))
    assert together(fams, "a:1", "c:2") and not together(fams, "a:1", "b:1") and fams["d:3"] == "d:3"


def test_retrieved_claims_citing_one_abstract_are_one_family(tmp_path):
    """`real-data retrieve` records carry the claim's cited abstracts (``cited_docs``): two NOT_ENOUGH_INFO
    claims citing abstract 1 share no gold and no text, only the citation, and still form one family; a claim
    citing abstract 2 stays apart although BM25 also retrieves abstract 1 for it."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in [
        {"doc_id": 1, "abstract": ["Aspirin lowers fever in adults.", "Salicylates act on prostaglandins."]},
        {"doc_id": 2, "abstract": ["Vitamin D raises bone density.", "Aspirin was not studied here."]}]))
    claims = tmp_path / "claims.jsonl"
    claims.write_text("".join(json.dumps(row) + "\n" for row in [
        {"id": 1, "claim": "Aspirin reduces fever.", "evidence": {}, "cited_doc_ids": [1]},
        {"id": 2, "claim": "Salicylates block prostaglandins in children.", "evidence": {}, "cited_doc_ids": [1]},
        {"id": 3, "claim": "Vitamin D and aspirin raise bone density.", "cited_doc_ids": [2],
         "evidence": {"2": [{"sentences": [0], "label": "SUPPORT"}]}}]))
    index, pools, fam = tmp_path / "idx.sqlite", tmp_path / "pools", tmp_path / "fam.jsonl"
    assert real_data(["index", "--corpus", str(corpus), "--format", "scifact", "--output", str(index)]) == 0
    assert real_data(["retrieve", "--dataset", "scifact", "--claims", str(claims), "--corpus", str(corpus),
                      "--index", str(index), "--output", str(pools)]) == 0
    records = [json.loads(line) for line in (pools / "records.jsonl").open()]
    assert {r["claim_id"]: r["cited_docs"] for r in records} == {
        "scifact-1": ["1"], "scifact-2": ["1"], "scifact-3": ["2"]}
    assert {r["id"] for r in records} >= {"scifact-3:1", "scifact-3:2"}
    assert all(r["label"] == "NOT_ENOUGH_INFO" for r in records if r["claim_id"] != "scifact-3")
    assert real_data(["families", "--records", str(pools / "records.jsonl"), "--output", str(fam)]) == 0
    by_claim: dict[str, set] = {}
    for line in fam.open():
        row = json.loads(line)
        by_claim.setdefault(row["id"].rsplit(":", 1)[0], set()).add(row["family"])
    assert all(len(f) == 1 for f in by_claim.values())
    assert by_claim["scifact-1"] == by_claim["scifact-2"] != by_claim["scifact-3"]


# ---------------------------------------------------------------- missed pools of `real-data retrieve`


def retrieved_pools(root: Path) -> Path:
    """records.jsonl and misses.jsonl as `real-data retrieve` writes them: Check-COVID-like claims cc-1_0 (missed:
    no complete gold group, so only in the misses file) and its twin cc-1_1 citing the same article, an unrelated
    cc-2_0, and SciFact-like units of claim sf-3 (abstract 5 retrieved without its rationale, so missed)."""
    def pool(rid, claim, cited, claim_id=None, gold=True):
        rec = record(rid, claim, docs=(cited,)).to_dict()
        if not gold:
            rec["evidence"] = []
        rec.update(claim_id=claim_id or rid, cited_docs=[cited],
                   retrieval={"pages": [{"doc": cited, "rank": 0}], "orderings": [[0]], "gold_missed": []})
        return rec
    root.mkdir()
    records = [pool("cc-1_1", "Masks cut transmission in schools.", "a1"),
               pool("cc-2_0", "Zinc cures colds.", "a2"), pool("sf-3:4", "Statins lower LDL.", "d4", "sf-3")]
    missed = [pool("cc-1_0", "Face coverings reduce spread among pupils.", "a1", gold=False),
              pool("sf-3:5", "Statins lower LDL.", "d5", "sf-3", gold=False)]
    (root / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "misses.jsonl").write_text("".join(json.dumps({"claim_id": p["claim_id"], "pools": [p]}) + "\n"
                                               for p in missed))
    return root


def test_missed_pools_get_their_claims_family(tmp_path, capsys):
    """`fae study` asks the pools of misses.jsonl too: each gets the family of its twins and of its claim's other
    pools (built from records.jsonl alone, cc-1_0 and sf-3:5 were in no family at all)."""
    pools = retrieved_pools(tmp_path / "pools")
    out = tmp_path / "fam.jsonl"
    assert real_data(["families", "--records", str(pools / "records.jsonl"), "--output", str(out)]) == 0
    fams = {row["id"]: row["family"] for row in map(json.loads, out.read_text().splitlines())}
    assert set(fams) == {"cc-1_0", "cc-1_1", "cc-2_0", "sf-3:4", "sf-3:5"}
    assert fams["cc-1_0"] == fams["cc-1_1"] != fams["cc-2_0"] and fams["sf-3:4"] == fams["sf-3:5"]
    summary = json.loads((tmp_path / "fam.jsonl.summary.json").read_text())
    assert summary["n_missed_pools"] == 2 and summary["misses_file"] == str(pools / "misses.jsonl")
    assert "5 records (with 2 missed pools) in 3 families" in capsys.readouterr().out
    moved = tmp_path / "moved.jsonl"  # --misses names the file when the records are elsewhere
    moved.write_bytes((pools / "records.jsonl").read_bytes())
    again = tmp_path / "again.jsonl"
    assert real_data(["families", "--records", str(moved), "--misses", str(pools / "misses.jsonl"),
                      "--output", str(again)]) == 0
    assert again.read_bytes() == out.read_bytes()


def test_retrieved_records_without_their_misses_are_refused(tmp_path, capsys):
    pools = retrieved_pools(tmp_path / "pools")
    (pools / "misses.jsonl").unlink()
    out = tmp_path / "fam.jsonl"
    assert real_data(["families", "--records", str(pools / "records.jsonl"), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "without misses.jsonl beside them" in err and "--misses" in err
    assert not out.exists()
