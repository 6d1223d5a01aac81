"""Retrieval (SPEC §10): `real-data index` and `real-data retrieve` on the shipped data and on planted corpora.

Covered: the corpus readers (hypothesis round trips), determinism (byte-identical outputs), tie breaks
(pages by document id, units by unit id), packing at the budget edge, the reranker's second ordering
and truncation count (a tiny cross-encoder built in code), the bi-encoder stand-in's ordering (cosine of
claim and unit embeddings, checked against numpy; ties in unit order; a tiny bi-encoder built in code), records that `fae run`'s loader and engine
take unchanged, and every bad input of the issue: one line naming file, line and field, exit 2,
nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_prep.cli import main
from data_prep.records import load_records
from data_prep.retrieval.corpus import iter_documents
from data_prep.retrieval.index import Index, build_index
from data_prep.retrieval.pack import BudgetTooSmall, pack
from data_prep.retrieval.rerank import BiEncoder, best_first, hub_hint
from data_prep.retrieval.retrieve import Unit, rank_units
from fae.ablation.engine import ablate
from fae_helpers import Scripted
from retrieval_helpers import BI_MAX_TOKENS, abstract_corpus, tiny_bi_encoder, tiny_cross_encoder, write_jsonl

DATA = Path(__file__).parent / "data"
SCIFACT = DATA / "scifact"
COVID = DATA / "check-covid"


def _index(tmp_path: Path, corpus: Path, fmt: str, name: str = "idx.sqlite") -> Path:
    out = tmp_path / name
    assert main(["index", "--corpus", str(corpus), "--format", fmt, "--output", str(out)]) == 0
    return out


def _retrieve(dataset, claims, corpus, index, out, *extra) -> int:
    claims = claims if isinstance(claims, list) else [claims]
    return main(["retrieve", "--dataset", dataset, "--claims", *map(str, claims), "--corpus", str(corpus),
                 "--index", str(index), "--output", str(out), *map(str, extra)])


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ---------------------------------------------------------------- corpus readers

_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.dictionaries(st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True),
                            st.lists(_text.filter(str.strip), min_size=1, max_size=5), min_size=1, max_size=6))
def test_abstract_corpus_reader_round_trips(tmp_path_factory, docs):
    path = abstract_corpus(tmp_path_factory.mktemp("c") / "corpus.jsonl", docs)
    read = list(iter_documents(path, "scifact"))
    assert [d.id for d in read] == list(docs)
    assert [list(d.units) for d in read] == [[s.strip() for s in a] for a in docs.values()]
    assert [d.line for d in read] == list(range(1, len(docs) + 1))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=20)
                      .map(str.strip).filter(lambda s: "\t" not in s and "-" not in s), min_size=1, max_size=6)
       .filter(lambda ls: any(ls)))
def test_fever_page_reader_round_trips(tmp_path_factory, lines):
    rows = "\n".join(f"{i}\t{s}\tlink" for i, s in enumerate(lines))
    path = write_jsonl(tmp_path_factory.mktemp("w") / "wiki-001.jsonl",
                       [{"id": "", "text": "", "lines": ""},  # the dump's own empty page: skipped
                        {"id": "Some_Page", "text": " ".join(lines), "lines": rows}])
    skipped: list[int] = []
    (doc,) = iter_documents(path.parent, "fever", skipped)
    assert skipped == [1] and doc.id == "Some_Page" and doc.title == "Some Page"
    assert list(doc.units) == lines


# ---------------------------------------------------------------- the shipped data

@pytest.fixture(scope="module")
def scifact_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sf")
    corpus = SCIFACT / "corpus_cited.jsonl"
    index = _index(tmp, corpus, "scifact")
    outs = []
    for name in ("a", "b"):
        assert _retrieve("scifact", SCIFACT / "claims_dev.jsonl", corpus, index, tmp / name) == 0
        outs.append(tmp / name)
    return outs


def test_scifact_one_record_per_claim_and_abstract_with_provenance(scifact_run):
    out = scifact_run[0]
    records = load_records(out / "records.jsonl")  # the loader `fae run --records` uses
    summary = json.loads((out / "summary.json").read_text())
    by_claim: dict[str, list] = {}
    for r in records:
        by_claim.setdefault(r.extra["claim_id"], []).append(r)
        assert r.id == f"{r.extra['claim_id']}:{r.sentences[0].doc}"
        assert {s.doc for s in r.sentences} == {r.extra["retrieval"]["pages"][0]["doc"]}
        assert [s.extra["bm25_rank"] for s in r.sentences] == [s.id for s in r.sentences]
        assert all({"sentence_index", "page_rank", "bm25_rank"} <= s.extra.keys() for s in r.sentences)
    assert {len(rs) for rs in by_claim.values()} == {3}
    assert summary["claims"] == 42 and summary["records"] == len(records) == 126
    assert summary["records_by_label"]["NOT_ENOUGH_INFO"] > 0  # NEI claims and non-gold abstracts kept


def test_gold_maps_to_the_corpus_sentence(scifact_run):
    """A gold id of a record points at the rationale sentence the claims file names."""
    claims = {f"scifact-{json.loads(line)['id']}": json.loads(line)
              for line in (SCIFACT / "claims_dev.jsonl").read_text().splitlines()}
    checked = 0
    for r in load_records(scifact_run[0] / "records.jsonl"):
        evidence = claims[r.extra["claim_id"]]["evidence"]
        for group in r.evidence:
            doc = r.sentences[group[0]].doc
            idxs = sorted(r.sentence_map()[i].extra["sentence_index"] for i in group)
            assert idxs in [sorted(e["sentences"]) for e in evidence[doc]]
            checked += 1
    assert checked > 20


def test_the_same_inputs_give_byte_identical_outputs(scifact_run):
    a, b = scifact_run
    for name in ("records.jsonl", "misses.jsonl", "summary.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_misses_are_recorded_not_added_back(scifact_run):
    out = scifact_run[0]
    misses = [json.loads(line) for line in (out / "misses.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["misses"] == len(misses) >= 1
    records = {r.id: r for r in load_records(out / "records.jsonl")}
    for m in misses:
        for doc in m["missed_docs"]:
            assert f"{m['claim_id']}:{doc}" not in records
            assert doc not in m["retrieved_docs"]


def test_check_covid_pools_feed_the_fae_engine_and_keep_nei(tmp_path):
    corpus = COVID / "corpus.json"
    index = _index(tmp_path, corpus, "check-covid")
    assert _retrieve("check-covid", COVID / "covidCheck_test_composed.json", corpus, index, tmp_path / "o") == 0
    records = load_records(tmp_path / "o" / "records.jsonl")
    assert any(r.label == "NOT_ENOUGH_INFO" and r.evidence == [] for r in records)
    assert all(len(r.sentences) <= 100 for r in records)
    verifiable = [r for r in records if r.label != "NOT_ENOUGH_INFO"]
    rows = ablate(verifiable, Scripted(), rounds=2)
    assert len(rows) == len(verifiable)


# ---------------------------------------------------------------- tie breaks and packing

def test_page_ties_break_by_document_id_and_unit_ties_by_unit_id(tmp_path):
    same = ["alpha beta gamma.", "alpha beta gamma."]
    corpus = abstract_corpus(tmp_path / "c.jsonl", {"z9": same, "a1": same, "m5": same, "q0": ["unrelated words."]})
    build_index(corpus, "scifact", tmp_path / "i.sqlite")
    index = Index(tmp_path / "i.sqlite")
    pages = index.top_pages(["alpha"], 3)
    assert [p.doc for p in pages] == ["a1", "m5", "z9"]
    assert pages[0].score == pages[1].score == pages[2].score
    units = [Unit(p.doc, p.rank, i, t) for p in pages for i, t in index.units(p)]
    ranked = rank_units(list(reversed(units)), ["alpha"])
    assert [u.key for u in ranked] == sorted(u.key for u in units)
    index.close()


def test_units_matching_no_token_come_last_in_unit_order(tmp_path):
    units = [Unit("d", 0, 0, "nothing here"), Unit("d", 0, 1, "the claim word"), Unit("d", 0, 2, "also none")]
    assert [u.index for u in rank_units(units, ["word"])] == [1, 0, 2]


def test_packing_keeps_whole_units_up_to_the_budget_edge():
    lengths = {"a": [3, 3, 3], "b": [3, 4, 1]}
    assert pack([0, 1, 2], {"a": lengths["a"]}, 6) == [0, 1]  # exactly at the budget: kept
    assert pack([0, 1, 2], {"a": lengths["a"]}, 5) == [0]  # one token short: the unit is left out
    assert pack([0, 1, 2], lengths, 6) == [0]  # tokenizer b would reach 7: every model sees the same units
    assert pack([2, 0, 1], lengths, 7) == [2, 0]  # in the ordering's order, stopping at the first misfit
    with pytest.raises(BudgetTooSmall):
        pack([1, 0], lengths, 3)


# ---------------------------------------------------------------- the reranker

@pytest.mark.slow
def test_reranker_gives_a_second_ordering_of_the_same_pool_and_counts_truncation(tmp_path):
    model = tiny_cross_encoder(tmp_path / "ce")
    long = "word " * 600  # 600 words: past 512 tokens with the claim
    corpus = abstract_corpus(tmp_path / "c.jsonl", {"1": ["Aspirin lowers fever.", long.strip(), "Fever is common."],
                                                     "2": ["Aspirin is a drug."]})
    claims = write_jsonl(tmp_path / "claims.jsonl", [{"id": 7, "claim": "Aspirin lowers fever.", "evidence": {
        "1": [{"sentences": [0], "label": "SUPPORT"}]}, "cited_doc_ids": [1]}])
    index = _index(tmp_path, corpus, "scifact")
    args = ("--reranker", model, "--budgets", "1000", "2048", "--tokenizer", model)
    assert _retrieve("scifact", claims, corpus, index, tmp_path / "o", *args) == 0
    (rec,) = [r for r in load_records(tmp_path / "o" / "records.jsonl") if r.sentences[0].doc == "1"]
    bm25, rerank = rec.extra["retrieval"]["orderings"]
    assert sorted(bm25) == sorted(rerank) == [s.id for s in rec.sentences]
    long_id = next(s.id for s in rec.sentences if s.text.startswith("word"))
    assert rec.extra["retrieval"]["truncated_pairs"] == [long_id]
    packed = rec.extra["retrieval"]["packed"]
    assert set(packed) == {"1000", "2048"} and [len(p) for p in packed["2048"]] == [3, 3]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["reranker"]["truncated_pairs"] == 1 and set(summary["retained_share"]["2048"]) == {
        "bm25", "reranker"}


# ---------------------------------------------------------------- the bi-encoder stand-in

@pytest.fixture(scope="module")
def bi_encoder(tmp_path_factory) -> Path:
    return tiny_bi_encoder(tmp_path_factory.mktemp("bi") / "bi")


def _bi_pool(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A SciFact corpus whose first abstract has seven units, one of them past 64 tokens, and one claim."""
    corpus = abstract_corpus(tmp_path / "c.jsonl", {
        "1": ["Aspirin lowers fever.", "Fever is common in children.", "Aspirin is an old drug.",
              "word " * 40 + "fever.", "Ibuprofen also lowers fever.", "Dogs bark at night.",
              "Fever rises at night and aspirin helps."],
        "2": ["Aspirin is a drug."]})
    claims = write_jsonl(tmp_path / "claims.jsonl", [{"id": 7, "claim": "Aspirin lowers fever.", "evidence": {
        "1": [{"sentences": [0], "label": "SUPPORT"}]}, "cited_doc_ids": [1]}])
    return corpus, claims, _index(tmp_path, corpus, "scifact")


def _cosine_order(model_dir: Path, claim: str, texts: list[str]) -> list[int]:
    """The order by cosine of claim and unit embeddings, computed here with numpy (best first, ties by position)."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    q = model.encode([claim], convert_to_numpy=True).astype(np.float64)[0]
    u = model.encode(texts, convert_to_numpy=True).astype(np.float64)
    cos = (u @ q) / (np.linalg.norm(u, axis=1) * np.linalg.norm(q))
    return sorted(range(len(texts)), key=lambda i: (-cos[i], i))


@pytest.mark.slow
def test_bi_encoder_orders_the_pool_by_cosine_of_claim_and_unit_embeddings(tmp_path, bi_encoder):
    corpus, claims, index = _bi_pool(tmp_path)
    args = ("--reranker", bi_encoder, "--reranker-kind", "bi-encoder", "--budgets", "2048",
            "--tokenizer", bi_encoder)
    assert _retrieve("scifact", claims, corpus, index, tmp_path / "o", *args) == 0
    (rec,) = [r for r in load_records(tmp_path / "o" / "records.jsonl") if r.sentences[0].doc == "1"]
    bm25, cosine = rec.extra["retrieval"]["orderings"]
    texts = [s.text for s in rec.sentences]
    assert len(texts) == 7 and bm25 == list(range(7))
    assert cosine == _cosine_order(bi_encoder, "Aspirin lowers fever.", texts)
    assert cosine != bm25  # the check has something to see: the cosine order is not the BM25 one
    long_id = next(s.id for s in rec.sentences if s.text.startswith("word"))
    assert rec.extra["retrieval"]["truncated_pairs"] == [long_id]  # 200+ characters: past 64 tokens
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    # named without this machine's path (the summary is meant to be committed and read elsewhere)
    assert summary["reranker"] == {"model": bi_encoder.name, "kind": "bi-encoder", "pairs": 8,
                                   "truncated_pairs": 1, "max_pair_tokens": BI_MAX_TOKENS}


@pytest.mark.slow
def test_bi_encoder_ties_keep_the_unit_order(tmp_path, bi_encoder):
    model = BiEncoder(str(bi_encoder))
    same = "Aspirin lowers fever."
    texts = ["Dogs bark.", same, "Cats purr at night.", same, same, "Dogs bark."]
    order, cut = model.order("Aspirin lowers fever in adults.", texts)
    assert cut == []
    assert [i for i in order if texts[i] == same] == [1, 3, 4]
    assert [i for i in order if texts[i] == "Dogs bark."] == [0, 5]
    assert len({tuple(model.embed([same] * 3)[i]) for i in range(3)}) == 1  # equal texts: one embedding
    assert best_first([0.5, 0.9, 0.5, 0.9]) == [1, 3, 0, 2]


@pytest.mark.slow
def test_bi_encoder_pools_are_byte_identical_run_to_run(tmp_path, bi_encoder):
    corpus, claims, index = _bi_pool(tmp_path)
    args = ("--reranker", bi_encoder, "--reranker-kind", "bi-encoder", "--reranker-batch-size", "3",
            "--budgets", "256", "2048", "--tokenizer", bi_encoder)
    for name in ("a", "b"):
        assert _retrieve("scifact", claims, corpus, index, tmp_path / name, *args) == 0
    for name in ("records.jsonl", "misses.jsonl", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.slow
@pytest.mark.parametrize("model, kind, says", [
    ("cross", "bi-encoder", "cannot be loaded as a bi-encoder (it is a cross-encoder; pass --reranker-kind "
                            "cross-encoder)"),
    ("empty", "bi-encoder", "cannot be loaded as a bi-encoder (not a sentence-transformers model: no modules.json)"),
    ("missing", "bi-encoder", "directory does not exist"),
    ("bi", "cross-encoder", "cannot be loaded as a cross-encoder (it is a bi-encoder; pass --reranker-kind "
                            "bi-encoder)"),
])
def test_a_model_of_another_kind_is_bad_input(small, capsys, bi_encoder, model, kind, says):
    tmp_path, corpus, claims, index = small
    models = tmp_path.parent / f"{tmp_path.name}-models"
    path = {"cross": lambda: tiny_cross_encoder(models / "ce"), "empty": lambda: models / "empty",
            "missing": lambda: models / "missing", "bi": lambda: bi_encoder}[model]()
    if model == "empty":
        path.mkdir(parents=True)
    capsys.readouterr()  # what building the model printed
    before = _before(tmp_path)
    assert _retrieve("scifact", claims, corpus, index, tmp_path / "o", "--reranker", path,
                     "--reranker-kind", kind) == 2
    assert f"--reranker {str(path)!r}: {says}" in _error(capsys)
    assert _before(tmp_path) == before


def test_a_reranker_kind_without_a_reranker_is_bad_input(small, capsys):
    tmp_path, corpus, claims, index = small
    assert _retrieve("scifact", claims, corpus, index, tmp_path / "o", "--reranker-kind", "bi-encoder") == 2
    assert "--reranker-kind bi-encoder names the kind of --reranker, which is not given" in _error(capsys)


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("rows, where", [
    ([{"doc_id": 1, "abstract": ["a b."]}, {"abstract": ["c d."]}], ":2: field 'doc_id': missing"),
    ([{"doc_id": 1}], ":1: field 'abstract': missing"),
    ([{"doc_id": 1, "abstract": ["a b."]}, {"doc_id": 1, "abstract": ["c."]}], ":2: field 'doc_id': duplicate"),
    ([], ": empty corpus"),
])
def test_bad_corpus_is_one_line_exit_2_and_no_index(tmp_path, capsys, rows, where):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", rows)
    out = tmp_path / "idx.sqlite"
    assert main(["index", "--corpus", str(corpus), "--format", "scifact", "--output", str(out)]) == 2
    err = _error(capsys)
    assert f"{corpus}{where}" in err, err
    assert list(tmp_path.iterdir()) == [corpus]  # no index, no temporary


@pytest.fixture()
def small(tmp_path):
    corpus = abstract_corpus(tmp_path / "corpus.jsonl", {"1": ["Aspirin lowers fever in adults.", "Other text."],
                                                          "2": ["Fever is common."]})
    claims = write_jsonl(tmp_path / "claims.jsonl", [
        {"id": 1, "claim": "Aspirin lowers fever.", "evidence": {"1": [{"sentences": [0], "label": "SUPPORT"}]},
         "cited_doc_ids": [1]},
        {"id": 2, "claim": "... !!! ...", "evidence": {}, "cited_doc_ids": [2]}])
    return tmp_path, corpus, claims, _index(tmp_path, corpus, "scifact")


def _before(tmp_path) -> set:
    return set(tmp_path.iterdir())


def test_a_claim_without_an_alphanumeric_token_is_bad_input(small, capsys):
    tmp_path, corpus, claims, index = small
    before = _before(tmp_path)
    assert _retrieve("scifact", claims, corpus, index, tmp_path / "o") == 2
    assert f"{claims}:2: field 'claim': has no alphanumeric token" in _error(capsys)
    assert _before(tmp_path) == before


def test_a_budget_below_the_first_unit_is_bad_input(small, capsys):
    tmp_path, corpus, _claims, index = small
    claims = write_jsonl(tmp_path / "one.jsonl", [{"id": 1, "claim": "Aspirin lowers fever.", "evidence": {},
                                                    "cited_doc_ids": [1]}])
    before = _before(tmp_path)
    assert _retrieve("scifact", claims, corpus, index, tmp_path / "o", "--budgets", "2",
                     "--tokenizer", str(Path(__file__).parents[1] / "real" / "demo" / "base")) == 2
    err = _error(capsys)
    assert f"{claims}:1: field 'budgets': budget 2 tokens is smaller than the first unit" in err
    assert _before(tmp_path) == before


def test_an_index_of_another_corpus_is_refused(small, capsys):
    tmp_path, corpus, claims, index = small
    other = abstract_corpus(tmp_path / "other.jsonl", {"1": ["Aspirin lowers fever in adults.", "Changed."]})
    before = _before(tmp_path)
    assert _retrieve("scifact", claims, other, index, tmp_path / "o") == 2
    err = _error(capsys)
    assert f"{index}: field 'corpus_sha256': the index was built from {corpus}" in err
    assert _before(tmp_path) == before


def test_a_reranker_that_cannot_be_loaded_is_bad_input(small, capsys):
    tmp_path, corpus, claims, index = small
    broken = tmp_path / "not-a-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    before = _before(tmp_path)
    assert _retrieve("scifact", claims, corpus, index, tmp_path / "o", "--reranker", broken) == 2
    assert f"--reranker {str(broken)!r}: cannot be loaded" in _error(capsys)
    assert _before(tmp_path) == before


def test_a_hub_name_that_does_not_load_says_what_to_do_offline(small, capsys, monkeypatch):
    """A hub name that cannot be resolved: offline, the line says only the cache was read and asks for a local
    directory; online, it says HF_HUB_OFFLINE=1 stops the minutes of retries where the hub is unreachable."""
    from huggingface_hub import constants

    tmp_path, corpus, claims, index = small
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    before = _before(tmp_path)
    hub_name = "no-such-org/no-such-reranker"
    assert _retrieve("scifact", claims, corpus, index, tmp_path / "o", "--reranker", hub_name) == 2
    err = _error(capsys)
    assert "--reranker 'no-such-org/no-such-reranker': cannot be loaded as a cross-encoder" in err
    assert err.endswith("HF_HUB_OFFLINE is set, so only the local hub cache was read: give a local directory "
                        "holding a copy"), err
    assert _before(tmp_path) == before
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert "set HF_HUB_OFFLINE=1 (no retries) or give a local directory" in hub_hint()
