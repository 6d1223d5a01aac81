"""`real-data retrieve --dataset D --claims FILE --corpus FILE --index FILE --output DIR`: the command line of
the evidence pools (SPEC §10).

The parser and its flags live here; what is retrieved and written is :mod:`data_prep.retrieval.retrieve_runner`.
"""

from __future__ import annotations

from data_prep.retrieval.claims import DATASETS
from data_prep.retrieval.rerank import CROSS_ENCODER, KINDS
from data_prep.retrieval.retrieve import DEFAULT_PAGES, DEFAULT_PAGES_OTHER, MAX_UNITS
from data_prep.retrieval.retrieve_runner import RetrieveConfig
from data_prep.retrieval.retrieve_runner import run  # noqa: F401 - the command's run(config), for the dispatcher

CONFIG = RetrieveConfig


def add_arguments(p):
    p.add_argument("--dataset", required=True, metavar="{" + ",".join(DATASETS) + "}",
                   help="whose claims and corpus: scifact, check-covid or fever")
    p.add_argument("--claims", required=True, nargs="+", help="the dataset's claim files (as `real-data convert` reads)")
    p.add_argument("--corpus", required=True, help="the corpus the index was built from (checked by its SHA-256)")
    p.add_argument("--index", required=True, help="the index file of `real-data index`")
    p.add_argument("--output", required=True, help="output directory: records.jsonl, misses.jsonl, summary.json")
    p.add_argument("--pages", type=int, default=None,
                   help=f"top pages per claim (default {DEFAULT_PAGES_OTHER}; scifact {DEFAULT_PAGES['scifact']} "
                        "abstracts, one record each)")
    p.add_argument("--max-units", type=int, default=MAX_UNITS, help=f"units kept per pool (default {MAX_UNITS})")
    p.add_argument("--reranker", default=None,
                   help="model of the second ordering, hub name or local directory: a cross-encoder (the paper's: "
                        "BAAI/bge-reranker-base) or, with --reranker-kind bi-encoder, a sentence-transformers "
                        "bi-encoder; without it only the BM25 ordering is written")
    p.add_argument("--reranker-kind", choices=KINDS, default=CROSS_ENCODER,
                   help="what --reranker is: cross-encoder (default; reads claim and unit together, the paper's) or "
                        "bi-encoder (a sentence-transformers embedding model: cosine of claim and unit embedded apart, "
                        "a stand-in where no cross-encoder can be reached)")
    p.add_argument("--reranker-batch-size", type=int, default=32,
                   help="texts per reranker batch: pairs (cross-encoder) or units (bi-encoder) (default 32)")
    p.add_argument("--budgets", type=int, nargs="+", default=None, metavar="TOKENS",
                   help="evidence-token budgets; each ordering's packed units are saved per budget (the paper's: 256 2048)")
    p.add_argument("--tokenizer", action="append", default=None,
                   help="a tokenizer (hub name or directory) of a model of the study; repeat for each; a unit is "
                        "kept only while it fits every budget under every tokenizer")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
