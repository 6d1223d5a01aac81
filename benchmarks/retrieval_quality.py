"""Retrieval quality on the shipped data (SPEC §10): recall of gold documents at k, of gold sentences inside
each packed budget, index build time and queries per second; and SQLite FTS5 against bm25s.

    python benchmarks/retrieval_quality.py --data DATA --tokenizer real/demo/base \
        --output benchmarks/results/retrieval_quality.json [--reranker BAAI/bge-reranker-base]
        [--reranker-kind bi-encoder]

SciFact dev runs over the shipped ``corpus_cited.jsonl`` (the 667 abstracts cited by train + dev
claims), Check-COVID test over ``corpus.json`` (347 abstracts) with both test files (composed +
extracted). Without ``--reranker`` only source 0 (BM25) is measured: source 1 needs the real
reranker, and no number is written for it. ``--reranker-kind bi-encoder`` measures a
sentence-transformers bi-encoder (all-MiniLM-L6-v2) as source 1 instead: a stand-in, not the paper's
ordering. Each set records the seconds its retrieval took (index excluded). The bm25s comparison (when bm25s is installed) indexes
the same title + body text with the same tokens and k1 = 1.2, b = 0.75, and reports how many claims
get the same top pages as FTS5.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from real_fae_core.atomicio import atomic_write_json
from real_fae_core.modelref import portable_name
from data_prep.retrieval.claims import read_claims
from data_prep.retrieval.corpus import iter_documents
from data_prep.retrieval.index import Index, build_index
from data_prep.retrieval.lexical import query_tokens
from data_prep.retrieval.rerank import CROSS_ENCODER, KINDS
from data_prep.retrieval.retrieve_runner import RetrieveConfig, run

SETS = {
    "scifact-dev": ("scifact", ["scifact/claims_dev.jsonl"], "scifact/corpus_cited.jsonl"),
    "check-covid-test": ("check-covid", ["check-covid/covidCheck_test_composed.json",
                                         "check-covid/covidCheck_test_extracted.json"], "check-covid/corpus.json"),
}
_WORD = re.compile(r"[^\W_]+")


def measure(name: str, data: Path, tmp: Path, args) -> dict:
    """Build the index, retrieve with budgets (and the reranker if given), time the BM25 queries alone."""
    dataset, claims, corpus = SETS[name]
    claims = [str(data / c) for c in claims]
    corpus = str(data / corpus)
    index_file = tmp / f"{name}.sqlite"
    built = build_index(corpus, dataset, index_file)
    config = RetrieveConfig(dataset=dataset, claims=claims, corpus=corpus, index=str(index_file),
                            output=str(tmp / name), budgets=args.budgets, tokenizer=[args.tokenizer],
                            reranker=args.reranker, reranker_kind=args.reranker_kind)
    start = time.perf_counter()
    summary = run(config).summary
    retrieve_seconds = time.perf_counter() - start
    read = read_claims(dataset, claims, corpus)
    index = Index(index_file)
    start = time.perf_counter()
    for claim in read.claims:
        index.top_pages(query_tokens(claim.claim), summary["pages"])
    qps = len(read.claims) / (time.perf_counter() - start)
    index.close()
    keep = ("claims", "records", "records_by_label", "claims_with_gold", "misses", "gold_groups_retrieved",
            "gold_doc_recall_at_k", "gold_sentence_recall", "retained_share", "reranker", "pages", "budgets",
            "tokenizers", "units_per_record")
    return {"index": {"documents": built["documents"], "units": built["units"], "build_seconds": built["seconds"],
                      "bytes": index_file.stat().st_size},
            "retrieve_seconds": round(retrieve_seconds, 2),
            "page_queries_per_second": round(qps, 1), **{k: summary[k] for k in keep},
            "bm25s": compare_bm25s(dataset, corpus, read.claims, index_file, summary["pages"])}


def compare_bm25s(fmt: str, corpus: str, claims, index_file: Path, k: int) -> dict | None:
    """bm25s on the same text and tokens: build time, queries per second, claims whose top-k pages agree."""
    try:
        import bm25s
    except ImportError:
        return None
    docs = list(iter_documents(corpus, fmt))
    start = time.perf_counter()
    tokens = [_WORD.findall((d.title + " " + " ".join(d.units)).casefold()) for d in docs]
    model = bm25s.BM25(k1=1.2, b=0.75, method="robertson")
    model.index(tokens, show_progress=False)
    build = time.perf_counter() - start
    index = Index(index_file)
    same = 0
    start = time.perf_counter()
    results = []
    for claim in claims:
        q = query_tokens(claim.claim)
        hits, scores = model.retrieve([q], k=k, show_progress=False, n_threads=1)
        results.append([docs[int(i)].id for i in hits[0]])
    qps = len(claims) / (time.perf_counter() - start)
    for claim, got in zip(claims, results):
        same += got == [p.doc for p in index.top_pages(query_tokens(claim.claim), k)]
    index.close()
    return {"version": bm25s.__version__, "build_seconds": round(build, 3), "queries_per_second": round(qps, 1),
            "same_top_k_pages": same, "claims": len(claims)}


def _source_1(args) -> str | None:
    """What source 1 is, where it is not the paper's reranker."""
    if not args.reranker:
        return "not measured: needs the real reranker (--reranker BAAI/bge-reranker-base, from the hub or a local copy)"
    if args.reranker_kind != CROSS_ENCODER:
        return ("a bi-encoder stand-in: claim and unit embedded apart, ordered by cosine; the paper's cross-encoder "
                "reads them together, so this ordering is not the paper's")
    return None


MODEL_FLAGS = ("--tokenizer", "--reranker")  # their values are models: written by name (portable_name)


def portable_command(argv: list[str]) -> str:
    """The command as the JSON records it: the models named without this machine's paths and ``--data`` as
    ``DATA`` (docs/retrieval.md's placeholder), so a committed result says what ran, not where it sat."""
    out, flag = [], None
    for arg in argv:
        name, eq, value = arg.partition("=")
        if eq and name in (*MODEL_FLAGS, "--data"):
            out.append(f"{name}={'DATA' if name == '--data' else portable_name(value)}")
        elif flag == "--data":
            out.append("DATA")
        elif flag in MODEL_FLAGS:
            out.append(portable_name(arg))
        else:
            out.append(arg)
        flag = arg
    return " ".join(["python", "benchmarks/retrieval_quality.py", *out])


def portable_results(result: dict) -> dict:
    """One set's result with its tokenizers and reranker model named by :func:`portable_name`."""
    reranker = result.get("reranker")
    return {**result, "tokenizers": [portable_name(t) for t in result.get("tokenizers", [])],
            "reranker": {**reranker, "model": portable_name(reranker["model"])} if reranker else reranker}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--data", required=True,
                   help="directory holding scifact/ (claims_dev.jsonl, corpus_cited.jsonl: the abstracts the claims cite) and "
                        "check-covid/ (covidCheck_test_*.json, corpus.json): the official releases")
    p.add_argument("--tokenizer", required=True, help="the tokenizer the budgets are counted in")
    p.add_argument("--budgets", type=int, nargs="+", default=[256, 2048])
    p.add_argument("--reranker", default=None, help="the model of source 1 (BAAI/bge-reranker-base)")
    p.add_argument("--reranker-kind", choices=KINDS, default=CROSS_ENCODER,
                   help="cross-encoder (default, the paper's) or bi-encoder (a stand-in: all-MiniLM-L6-v2)")
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: measure(name, Path(args.data), Path(tmp), args) for name in SETS}
    atomic_write_json(args.output, {
        "command": portable_command(sys.argv[1:] if argv is None else argv),
        "machine": {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
                    "processor": platform.processor() or platform.machine(),
                    "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "wall_seconds": round(time.perf_counter() - start, 1),
        "tokenizer": portable_name(args.tokenizer), "reranker": args.reranker and portable_name(args.reranker),
        "reranker_kind": args.reranker_kind if args.reranker else None,
        "source_1": _source_1(args),
        "results": {name: portable_results(r) for name, r in results.items()}})
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
