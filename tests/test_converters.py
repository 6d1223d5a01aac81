"""Dataset converters (`real-data convert`): real Check-COVID / SciFact files,
official-format fixtures for FEVER and Climate-FEVER built in tmp dirs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from helpers import sample_or_full

from data_prep.cli import main as real_data
from data_prep.converters import CONVERTERS, ConvertInputs, ConvertStats
from data_prep.converters.fever import load_pages, needed_pages, unescape
from data_prep.converters.trim import PoolTrimmer, select_pool
from data_prep.prompts import format_pool
from data_prep.records import load_records

CC_DEV = "check-covid/covidCheck_dev_composed+extracted.json"
# SUPPORT / REFUTE / NOT_ENOUGH_INFO claims, counted from the raw files: the shipped samples or the full copies
CC_DEV_S, CC_DEV_R, CC_DEV_NEI = sample_or_full((15, 14, 13), (69, 70, 68))
SF_DEV_S, SF_DEV_R, SF_DEV_NEI = sample_or_full((22, 10, 10), (124, 64, 112))


def write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def convert(capsys, *argv) -> tuple[int, str, str]:
    rc = real_data(["convert", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def summary_of(output: Path) -> dict:
    return json.loads(output.with_name(output.name + ".summary.json").read_text())


def raw_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------- Check-COVID (real data)

def test_check_covid_dev_end_to_end(shared_data, tmp_path, capsys):
    out = tmp_path / "cc.jsonl"
    rc, stdout, _ = convert(capsys, "--dataset", "check-covid",
                            "--claims", shared_data / CC_DEV,
                            "--corpus", shared_data / "check-covid/corpus.json", "--output", out)
    assert rc == 0
    records = load_records(out)  # validates every record
    labels = Counter(r.label for r in records)
    assert labels == {"SUPPORT": CC_DEV_S, "REFUTE": CC_DEV_R}
    s = summary_of(out)
    assert s["records_written"] == CC_DEV_S + CC_DEV_R and s["claims_read"] == CC_DEV_S + CC_DEV_R + CC_DEV_NEI
    assert s["dropped"] == {"NOT_ENOUGH_INFO claim (use --include-nei to keep)": CC_DEV_NEI}
    assert f"{CC_DEV_S + CC_DEV_R} records written" in stdout and f"SUPPORT {CC_DEV_S}" in stdout

    corpus = {o["cord_id"]: o["abstract"] for o in raw_jsonl(shared_data / "check-covid/corpus.json")}
    raw = {o["id"]: o for o in raw_jsonl(shared_data / CC_DEV)}
    for rec in records:
        src = raw[rec.id.removeprefix("check-covid-")]
        assert rec.dataset == "check-covid"
        assert [s.text for s in rec.sentences] == corpus[src["cord_id"]]
        assert rec.pool_ids == list(range(len(corpus[src["cord_id"]])))
        assert rec.evidence == [sorted({e["sent_index"] for e in src["evidence_set"]})]
        assert {s.doc for s in rec.sentences} == {src["cord_id"]}


def test_check_covid_include_nei(shared_data, tmp_path, capsys):
    out = tmp_path / "cc.jsonl"
    rc, _, _ = convert(capsys, "--dataset", "check-covid", "--claims", shared_data / CC_DEV,
                       "--corpus", shared_data / "check-covid/corpus.json", "--output", out, "--include-nei")
    assert rc == 0
    records = load_records(out)
    nei = [r for r in records if r.label == "NOT_ENOUGH_INFO"]
    assert len(records) == CC_DEV_S + CC_DEV_R + CC_DEV_NEI and len(nei) == CC_DEV_NEI
    # the source's related-but-insufficient sentences survive beside the empty gold
    assert all(r.evidence == [] and r.extra["related_evidence"] for r in nei)
    assert summary_of(out)["dropped"] == {}


# ---------------------------------------------------------------- SciFact (real data)

def test_scifact_dev_end_to_end(shared_data, tmp_path, capsys):
    out = tmp_path / "sf.jsonl"
    rc, _, _ = convert(capsys, "--dataset", "scifact", "--claims", shared_data / "scifact/claims_dev.jsonl",
                       "--corpus", shared_data / "scifact/corpus_cited.jsonl", "--output", out)
    assert rc == 0
    records = load_records(out)
    assert Counter(r.label for r in records) == {"SUPPORT": SF_DEV_S, "REFUTE": SF_DEV_R}
    assert summary_of(out)["dropped"] == {"NOT_ENOUGH_INFO claim (use --include-nei to keep)": SF_DEV_NEI}

    corpus = {str(o["doc_id"]): o["abstract"] for o in raw_jsonl(shared_data / "scifact/corpus_cited.jsonl")}
    raw = {str(o["id"]): o for o in raw_jsonl(shared_data / "scifact/claims_dev.jsonl")}
    multi_doc = 0
    for rec in records:
        src = raw[rec.id.removeprefix("scifact-")]
        docs = [str(d) for d in src["cited_doc_ids"]]
        multi_doc += len(docs) > 1
        # concatenated pool, running ids, doc id kept on each sentence
        assert [(s.doc, s.text) for s in rec.sentences] == [(d, t) for d in docs for t in corpus[d]]
        assert rec.pool_ids == list(range(len(rec.sentences)))
        # every rationale set is one group, mapped back to (doc, index)
        offsets = {}
        for d in docs:
            offsets[d] = sum(len(corpus[x]) for x in docs[: docs.index(d)])
        want = []
        for d, sets in src["evidence"].items():
            for ent in sets:
                g = sorted(offsets[d] + i for i in ent["sentences"])
                if g not in want:
                    want.append(g)
        assert sorted(rec.evidence) == sorted(want)
        wanted_label = {"SUPPORT": "SUPPORT", "CONTRADICT": "REFUTE"}[
            next(iter(src["evidence"].values()))[0]["label"]]
        assert rec.label == wanted_label
    assert multi_doc > 0


# ---------------------------------------------------------------- Climate-FEVER (fixture)

def _cf_claim(cid, label, ev_labels, texts=None):
    texts = texts or [f"Sentence {k} of claim {cid}." for k in range(len(ev_labels))]
    return {"claim_id": str(cid), "claim": f"Claim number {cid}.", "claim_label": label,
            "evidences": [{"evidence_id": f"Art{k}:{k}", "evidence_label": lab, "article": f"Article {k}",
                           "evidence": t, "entropy": 0.5, "votes": [lab, lab, None, None, None]}
                          for k, (lab, t) in enumerate(zip(ev_labels, texts))]}


def test_climate_fever(tmp_path, capsys):
    claims = write_jsonl(tmp_path / "climate-fever.jsonl", [
        _cf_claim(0, "SUPPORTS", ["SUPPORTS", "NOT_ENOUGH_INFO", "SUPPORTS", "REFUTES", "NOT_ENOUGH_INFO"]),
        _cf_claim(1, "REFUTES", ["NOT_ENOUGH_INFO", "REFUTES", "NOT_ENOUGH_INFO", "NOT_ENOUGH_INFO", "SUPPORTS"]),
        _cf_claim(2, "NOT_ENOUGH_INFO", ["NOT_ENOUGH_INFO"] * 5),
        _cf_claim(3, "DISPUTED", ["SUPPORTS", "REFUTES", "NOT_ENOUGH_INFO", "NOT_ENOUGH_INFO", "SUPPORTS"]),
        _cf_claim(4, "SUPPORTS", ["NOT_ENOUGH_INFO"] * 5),  # label without a matching sentence
    ])
    out = tmp_path / "cf.jsonl"
    rc, _, _ = convert(capsys, "--dataset", "climate-fever", "--claims", claims, "--output", out)
    assert rc == 0
    recs = {r.id: r for r in load_records(out)}
    assert set(recs) == {"climate-fever-0", "climate-fever-1"}
    r0, r1 = recs["climate-fever-0"], recs["climate-fever-1"]
    assert r0.label == "SUPPORT" and r0.evidence == [[0], [2]]
    assert r1.label == "REFUTE" and r1.evidence == [[1]]
    assert r0.pool_ids == [0, 1, 2, 3, 4] and r0.sentences[3].doc == "Article 3"
    assert summary_of(out)["dropped"] == {
        "DISPUTED claim": 1, "NOT_ENOUGH_INFO claim (use --include-nei to keep)": 1,
        "no sentence carries the claim label": 1}

    rc, _, _ = convert(capsys, "--dataset", "climate-fever", "--claims", claims, "--output", out, "--include-nei")
    recs = {r.id: r for r in load_records(out)}
    assert recs["climate-fever-2"].label == "NOT_ENOUGH_INFO" and recs["climate-fever-2"].evidence == []
    assert "climate-fever-3" not in recs  # DISPUTED is never kept


# ---------------------------------------------------------------- FEVER (fixture in the official format)

def _page(title, sentences):
    lines = "\n".join(f"{i}\t{s}" + ("\tLink\tLink" if s else "") for i, s in enumerate(sentences))
    return {"id": title, "text": " ".join(sentences), "lines": lines}


def _fever_claim(cid, label, groups):
    if label == "NOT ENOUGH INFO":
        ev = [[[900 + cid, None, None, None]]]
    else:
        ev = [[[900 + cid, 5000 + k, page, line] for page, line in g] for k, g in enumerate(groups)]
    return {"id": cid, "verifiable": "NOT VERIFIABLE" if label == "NOT ENOUGH INFO" else "VERIFIABLE",
            "label": label, "claim": f"FEVER claim {cid}.", "evidence": ev}


@pytest.fixture
def fever_files(tmp_path):
    wiki = tmp_path / "wiki-pages"
    write_jsonl(wiki / "wiki-001.jsonl", [
        {"id": "", "text": "", "lines": ""},  # the dump really starts with an empty page
        _page("Unused_page", ["Nobody cites this."]),
        _page("Savages_-LRB-2012_film-RRB-",
              ["Savages is a 2012 film -LRB- thriller -RRB- .", "", "It stars Taylor Kitsch -COLON- yes ."]),
        _page("Nikolaj_Coster-Waldau", ["Nikolaj Coster-Waldau is a Danish actor .",
                                        "He starred in `` Game of Thrones '' .", "He was born in 1970 ."]),
    ])
    write_jsonl(wiki / "wiki-002.jsonl", [
        _page("Another_unused", ["Still nobody ."]),
        # keys in another order: found through the full-decode fallback
        json.dumps({"lines": "0\tFox is a network .\n1\tIt broadcasts shows .", "text": "x", "id": "Fox_Broadcasting_Company"}),
    ])
    claims = write_jsonl(tmp_path / "train.jsonl", [
        _fever_claim(1, "SUPPORTS", [[("Nikolaj_Coster-Waldau", 1), ("Fox_Broadcasting_Company", 0)],
                                     [("Nikolaj_Coster-Waldau", 1), ("Fox_Broadcasting_Company", 0)],  # duplicate
                                     [("Nikolaj_Coster-Waldau", 0)]]),
        _fever_claim(2, "REFUTES", [[("Savages_-LRB-2012_film-RRB-", 2)]]),
        _fever_claim(3, "NOT ENOUGH INFO", []),
        _fever_claim(4, "SUPPORTS", [[("Missing_page", 0)]]),
        _fever_claim(5, "SUPPORTS", [[("Savages_-LRB-2012_film-RRB-", 1)]]),  # empty gold line
        _fever_claim(6, "REFUTES", [[("Nikolaj_Coster-Waldau", 7)]]),  # beyond the page
    ])
    return claims, wiki


def test_fever_converter(fever_files, tmp_path, capsys):
    claims, wiki = fever_files
    out = tmp_path / "fever.jsonl"
    rc, stdout, _ = convert(capsys, "--dataset", "fever", "--claims", claims, "--wiki-pages", wiki, "--output", out)
    assert rc == 0
    recs = {r.id: r for r in load_records(out)}
    assert set(recs) == {"fever-1", "fever-2"}
    r1 = recs["fever-1"]
    # pages in order of first citation, all their non-empty lines, running ids
    assert [(s.id, s.doc) for s in r1.sentences] == [
        (0, "Nikolaj_Coster-Waldau"), (1, "Nikolaj_Coster-Waldau"), (2, "Nikolaj_Coster-Waldau"),
        (3, "Fox_Broadcasting_Company"), (4, "Fox_Broadcasting_Company")]
    assert r1.evidence == [[1, 3], [0]]  # duplicate group removed
    assert r1.sentences[1].text == 'He starred in " Game of Thrones " .'
    r2 = recs["fever-2"]
    # the empty line 1 is not part of the pool; line 2 becomes pool id 1
    assert [s.text for s in r2.sentences] == ["Savages is a 2012 film ( thriller ) .", "It stars Taylor Kitsch : yes ."]
    assert r2.label == "REFUTE" and r2.evidence == [[1]]
    s = summary_of(out)
    assert s["dropped"] == {"NOT_ENOUGH_INFO claim (use --include-nei to keep)": 1, "page not in wiki-pages": 1,
                            "gold line is empty": 1, "evidence line not on the page": 1}
    assert s["dropped_examples"]["page not in wiki-pages"] == [f"{claims}:4: field 'evidence': 'Missing_page'"]
    assert s["wiki_pages_scanned"] == 6 and s["wiki_pages_found"] == 3
    assert "page not in wiki-pages" in stdout


def test_fever_keeps_only_cited_pages(fever_files):
    claims, wiki = fever_files
    needed = needed_pages([claims])
    assert needed == {"Nikolaj_Coster-Waldau", "Fox_Broadcasting_Company", "Savages_-LRB-2012_film-RRB-",
                      "Missing_page"}
    pages = load_pages(wiki, needed)
    assert set(pages) == needed - {"Missing_page"}  # never the uncited ones
    assert pages["Savages_-LRB-2012_film-RRB-"][1] == ""


def test_unescape():
    assert unescape("A -LRB- b -RRB- -LSB- c -RSB- -LCB- d -RCB- e -COLON- f ``g''") == 'A ( b ) [ c ] { d } e : f "g"'


# ---------------------------------------------------------------- input errors: file, line, field

def _cc_corpus(tmp_path):
    return write_jsonl(tmp_path / "corpus.json", [{"cord_id": "abc", "title": "t", "abstract": ["S0.", "S1.", "S2."]}])


def _cc_claim(i, **kw):
    c = {"id": f"c{i}", "claim": f"Claim {i}.", "cord_id": "abc", "label": "SUPPORT",
         "evidence_set": [{"sent_index": 1, "type": "PRIMARY"}], "is_auth": False}
    c.update(kw)
    return c


@pytest.mark.parametrize("bad_line, field, reason", [
    ('{"id": "c2", "claim": "x"', None, "invalid JSON"),
    ({k: v for k, v in _cc_claim(2).items() if k != "claim"}, "claim", "missing required field"),
    (_cc_claim(2, cord_id=7), "cord_id", "must be a string"),
    (_cc_claim(2, label="TRUE"), "label", "unknown label 'TRUE'"),
    (_cc_claim(2, evidence_set=[{"type": "PRIMARY"}]), "sent_index", "missing required field"),
])
def test_check_covid_input_errors_name_file_line_field(tmp_path, capsys, bad_line, field, reason):
    claims = write_jsonl(tmp_path / "claims.json", [_cc_claim(1), bad_line, _cc_claim(3)])
    rc, _, err = convert(capsys, "--dataset", "check-covid", "--claims", claims,
                         "--corpus", _cc_corpus(tmp_path), "--output", tmp_path / "o.jsonl")
    assert rc == 2
    where = f"{claims}:2" + (f": field {field!r}" if field else "")
    assert where in err and reason in err
    # neither the output nor its .tmp is left behind
    assert sorted(tmp_path.iterdir()) == sorted([claims, tmp_path / "corpus.json"])


@pytest.mark.parametrize("dataset, make, field", [
    ("scifact", lambda: {"id": 1, "claim": "c", "evidence": {"5": [{"sentences": [0], "label": "MAYBE"}]},
                         "cited_doc_ids": [5]}, "evidence[5][0].label"),
    ("scifact", lambda: {"id": 1, "claim": "c", "evidence": {}}, "cited_doc_ids"),
    ("climate-fever", lambda: {**_cf_claim(1, "SUPPORTS", ["SUPPORTS"]), "claim": ""}, "claim"),
    ("climate-fever", lambda: _cf_claim(1, "SUPPORTS", ["PROBABLY"]), "evidences[0].evidence_label"),
    ("fever", lambda: {**_fever_claim(1, "SUPPORTS", [[("P", 0)]]), "evidence": [[[1, 2, "P"]]]}, "evidence[0][0]"),
    ("fever", lambda: {k: v for k, v in _fever_claim(1, "SUPPORTS", [[("P", 0)]]).items() if k != "label"}, "label"),
])
def test_input_errors_other_datasets(tmp_path, capsys, dataset, make, field):
    good = {"scifact": {"id": 0, "claim": "ok", "evidence": {}, "cited_doc_ids": [5]},
            "climate-fever": _cf_claim(0, "SUPPORTS", ["SUPPORTS"]),
            "fever": _fever_claim(0, "SUPPORTS", [[("P", 0)]])}[dataset]
    claims = write_jsonl(tmp_path / "claims.jsonl", [good, make()])
    extra = []
    if dataset == "scifact":
        extra = ["--corpus", write_jsonl(tmp_path / "corpus.jsonl", [{"doc_id": 5, "abstract": ["A.", "B."]}])]
    if dataset == "fever":
        extra = ["--wiki-pages", write_jsonl(tmp_path / "wiki" / "wiki-001.jsonl", [_page("P", ["Text ."])]).parent]
    rc, _, err = convert(capsys, "--dataset", dataset, "--claims", claims, *extra, "--output", tmp_path / "o.jsonl")
    assert rc == 2
    assert f"{claims}:2: field {field!r}" in err


def test_corpus_and_wiki_errors_name_their_file(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "corpus.json", [{"cord_id": "abc", "abstract": ["S0."]}, {"cord_id": "x"}])
    claims = write_jsonl(tmp_path / "claims.json", [_cc_claim(1)])
    rc, _, err = convert(capsys, "--dataset", "check-covid", "--claims", claims, "--corpus", corpus,
                         "--output", tmp_path / "o.jsonl")
    assert rc == 2 and f"{corpus}:2: field 'abstract': missing required field" in err

    shard = write_jsonl(tmp_path / "wiki" / "wiki-001.jsonl", [{"id": "P", "text": "t", "lines": "zero\tText ."}])
    claims = write_jsonl(tmp_path / "f.jsonl", [_fever_claim(0, "SUPPORTS", [[("P", 0)]])])
    rc, _, err = convert(capsys, "--dataset", "fever", "--claims", claims, "--wiki-pages", shard.parent,
                         "--output", tmp_path / "o.jsonl")
    assert rc == 2 and f"{shard}:1: field 'lines'" in err


def test_unresolvable_evidence_is_dropped_and_counted(tmp_path, capsys):
    claims = write_jsonl(tmp_path / "claims.json", [
        _cc_claim(1), _cc_claim(2, cord_id="nope"), _cc_claim(3, evidence_set=[{"sent_index": 9}]),
        _cc_claim(4, cord_id="nope"), _cc_claim(5, label="NOTENOUGHINFO"), _cc_claim(1)])
    out = tmp_path / "o.jsonl"
    rc, stdout, _ = convert(capsys, "--dataset", "check-covid", "--claims", claims,
                            "--corpus", _cc_corpus(tmp_path), "--output", out)
    assert rc == 0
    assert [r.id for r in load_records(out)] == ["check-covid-c1"]
    s = summary_of(out)
    assert s["dropped"] == {"cord_id not in corpus": 2, "sent_index outside the abstract": 1,
                            "NOT_ENOUGH_INFO claim (use --include-nei to keep)": 1, "duplicate claim id": 1}
    assert s["dropped_examples"]["cord_id not in corpus"] == [
        f"{claims}:2: field 'cord_id': 'nope'", f"{claims}:4: field 'cord_id': 'nope'"]
    assert s["pool_size"] == {"min": 3, "median": 3, "max": 3}
    assert "2  cord_id not in corpus" in stdout


def test_cli_flag_errors(tmp_path, capsys):
    claims = write_jsonl(tmp_path / "claims.json", [_cc_claim(1)])
    rc, _, err = convert(capsys, "--dataset", "check-covid", "--claims", claims, "--output", tmp_path / "o")
    assert rc == 2 and "needs --corpus" in err
    rc, _, err = convert(capsys, "--dataset", "climate-fever", "--claims", claims, "--corpus", claims,
                         "--output", tmp_path / "o")
    assert rc == 2 and "does not use --corpus" in err
    rc, _, err = convert(capsys, "--dataset", "check-covid", "--claims", claims, "--corpus", claims,
                         "--max-pool-tokens", "10", "--output", tmp_path / "o")
    assert rc == 2 and "--tokenizer" in err
    rc, _, err = convert(capsys, "--dataset", "check-covid", "--claims", claims, "--corpus", claims,
                         "--max-pool-tokens", "10", "--tokenizer", tmp_path / "nope", "--output", tmp_path / "o")
    assert rc == 2 and "not a tokenizer directory" in err
    assert sorted(CONVERTERS) == ["check-covid", "climate-fever", "fever", "scifact"]


# ---------------------------------------------------------------- pool trimming

def test_select_pool_nearest_first_ties_lower_id():
    ids = [0, 1, 2, 3, 4, 5, 6]
    costs = [1] * 7
    # gold 3: neighbours 2 and 4 (tie -> 2 first), then 4, then 1 ...
    assert select_pool(ids, costs, {3}, 2) == [2, 3]
    assert select_pool(ids, costs, {3}, 3) == [2, 3, 4]
    assert select_pool(ids, costs, {0, 6}, 4) == [0, 1, 5, 6]
    # a sentence that does not fit closes the window on its side only:
    # nothing beyond it is pulled in, the other side keeps growing
    assert select_pool(ids, [1, 1, 9, 1, 1, 1, 1], {3}, 3) == [3, 4, 5]
    assert select_pool(ids, [1, 1, 1, 1, 9, 1, 1], {3}, 4) == [0, 1, 2, 3]
    assert select_pool(ids, [1, 1, 1, 1, 9, 1, 1], {3}, 20) == [0, 1, 2, 3, 4, 5, 6]
    assert select_pool(ids, costs, {2, 5}, 1) is None  # gold alone over budget
    assert select_pool(ids, costs, set(), 2) == [0, 1]  # no anchor: from the start


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from tiny_models import build_tokenizer

    path = tmp_path_factory.mktemp("tok")
    build_tokenizer("llama").save_pretrained(path)
    return path


def test_max_pool_tokens_keeps_gold_and_is_deterministic(shared_data, tmp_path, tokenizer_dir, capsys):
    from transformers import AutoTokenizer

    budget = 1000  # tiny byte-level BPE: SciFact dev pools span ~400-9000 tokens
    args = ["--dataset", "scifact", "--claims", shared_data / "scifact/claims_dev.jsonl",
            "--corpus", shared_data / "scifact/corpus_cited.jsonl",
            "--max-pool-tokens", budget, "--tokenizer", tokenizer_dir]
    out1, out2, full = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "full.jsonl"
    assert convert(capsys, *args, "--output", out1)[0] == 0
    assert convert(capsys, *args, "--output", out2)[0] == 0
    assert out1.read_bytes() == out2.read_bytes()
    assert convert(capsys, *args[:6], "--output", full)[0] == 0

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    originals = {r.id: r for r in load_records(full)}
    trimmed = load_records(out1)
    s = summary_of(out1)
    t = s["trimming"]
    assert t["trimmed"] > 0 and t["kept_whole"] > 0
    assert t["trimmed"] + t["kept_whole"] == len(trimmed)
    assert s["dropped"].get("gold evidence alone exceeds --max-pool-tokens", 0) == t["dropped_gold_over_budget"]
    assert len(trimmed) + t["dropped_gold_over_budget"] == len(originals)
    n_cut = 0
    for rec in trimmed:
        orig = originals[rec.id]
        assert rec.evidence == orig.evidence
        assert set(rec.gold_ids) <= set(rec.pool_ids)
        assert rec.pool_ids == [i for i in orig.pool_ids if i in set(rec.pool_ids)]  # order, no renumbering
        assert all(s.text == orig.sentence_map()[s.id].text for s in rec.sentences)
        rows = format_pool(rec).split("\n")
        cost = sum(len(tok(r, add_special_tokens=False)["input_ids"]) + 1 for r in rows)
        assert cost <= budget
        if len(rec.sentences) < len(orig.sentences):
            n_cut += 1
            assert rec.extra["pool_trimmed_from"] == len(orig.sentences)
    assert n_cut == t["trimmed"]


def test_trimmer_drops_when_gold_alone_is_over_budget():
    from data_prep.records import ClaimRecord

    rec = ClaimRecord.from_dict({"id": "x", "claim": "c", "label": "SUPPORT", "evidence": [[0, 2]],
                                 "sentences": [{"id": i, "text": "w " * 5} for i in range(4)]})
    count = lambda rows: [len(r.split()) for r in rows]  # noqa: E731 - whitespace "tokens"
    assert PoolTrimmer(100, count)(rec) is rec  # under budget: untouched
    assert PoolTrimmer(13, count)(rec) is None  # two gold rows cost 7 each
    kept = PoolTrimmer(21, count)(ClaimRecord.from_dict(rec.to_dict()))
    assert kept.pool_ids == [0, 1, 2]


def test_converters_are_usable_as_a_library(shared_data):
    stats = ConvertStats()
    inputs = ConvertInputs(claims=[shared_data / CC_DEV], corpus=shared_data / "check-covid/corpus.json")
    n = sum(1 for _ in CONVERTERS["check-covid"].convert(inputs, stats))
    assert n == CC_DEV_S + CC_DEV_R and stats.claims_read == CC_DEV_S + CC_DEV_R + CC_DEV_NEI


# ---------------------------------------------------------------- hostile bytes (issue #12)

def test_non_utf8_wiki_shard_names_line_and_offset(tmp_path, capsys):
    shard = tmp_path / "wiki" / "wiki-001.jsonl"
    shard.parent.mkdir()
    good = (json.dumps(_page("Q", ["Other ."])) + "\n").encode()
    bad = json.dumps(_page("P", ["Caf\u00e9 ."]), ensure_ascii=False).encode("latin-1") + b"\n"
    shard.write_bytes(good + bad)
    claims = write_jsonl(tmp_path / "f.jsonl", [_fever_claim(0, "SUPPORTS", [[("P", 0)]])])
    rc, _, err = convert(capsys, "--dataset", "fever", "--claims", claims, "--wiki-pages", shard.parent,
                         "--output", tmp_path / "o.jsonl")
    assert rc == 2 and "Traceback" not in err
    offset = len(good) + bad.index(b"\xe9")
    assert f"{shard}:2: not valid UTF-8: byte 0xe9 at byte offset {offset}" in err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("index", ["\u00b2", "\u0663", "9" * 40])
def test_wiki_line_numbers_must_be_plain_ascii(tmp_path, capsys, index):
    shard = write_jsonl(tmp_path / "wiki" / "wiki-001.jsonl", [{"id": "P", "text": "t", "lines": f"{index}\tText ."}])
    claims = write_jsonl(tmp_path / "f.jsonl", [_fever_claim(0, "SUPPORTS", [[("P", 0)]])])
    rc, _, err = convert(capsys, "--dataset", "fever", "--claims", claims, "--wiki-pages", shard.parent,
                         "--output", tmp_path / "o.jsonl")
    assert rc == 2 and f"{shard}:1: field 'lines'" in err and "internal error" not in err


def test_claims_with_a_utf8_bom_convert(tmp_path, capsys):
    claims = tmp_path / "claims.json"
    claims.write_bytes(b"\xef\xbb\xbf" + (json.dumps(_cc_claim(1)) + "\n").encode())
    rc, _, err = convert(capsys, "--dataset", "check-covid", "--claims", claims,
                         "--corpus", _cc_corpus(tmp_path), "--output", tmp_path / "o.jsonl")
    assert rc == 0, err
    assert [r.id for r in load_records(tmp_path / "o.jsonl")] == ["check-covid-c1"]
