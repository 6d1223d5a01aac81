"""`real-data retrieve --dataset D --claims FILE --corpus FILE --index FILE --output DIR`: evidence pools for
claims from an index (SPEC §10), in two orderings, packed to budgets.

:func:`run` takes a :class:`RetrieveConfig`; the command line (its parser generated from the config) and Python
callers call it.

Writes ``OUTPUT/records.jsonl`` (SPEC §2 records, read by `fae run --records` unchanged),
``OUTPUT/misses.jsonl`` (one line per claim whose gold was not all retrieved) and
``OUTPUT/summary.json`` (docs/retrieval.md). The output directory appears only when complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Literal

from real_fae_core.atomicio import atomic_dir, atomic_write_json
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import Output, claim_dir, only_names
from data_prep.records import save_records
from data_prep.retrieval.build import Options, retrieve_all, summary
from data_prep.retrieval.claims import DATASETS, ClaimsRead, check_unique_ids, read_claims
from data_prep.retrieval.index import Index
from data_prep.retrieval.pack import check_budgets, load_tokenizers
from data_prep.retrieval.rerank import CROSS_ENCODER, KINDS, make_reranker
from data_prep.retrieval.retrieve import DEFAULT_PAGES, DEFAULT_PAGES_OTHER, MAX_UNITS

CORPUS_FORMAT = {"scifact": "scifact", "check-covid": "check-covid", "fever": "fever"}


@dataclasses.dataclass
class RetrieveConfig(CommandConfig):
    """`real-data retrieve`: pools of one dataset's claims from an index of its corpus."""

    dataset: str = option(metavar="{" + ",".join(DATASETS) + "}",  # a name in DATASETS
                          help="whose claims and corpus: scifact, check-covid or fever")
    claims: list[str] = option(help="the dataset's claim files (as `real-data convert` reads)")
    corpus: str = option(help="the corpus the index was built from (checked by its SHA-256)")
    index: str = option(help="the index file of `real-data index`")
    output: str = option(help="output directory: records.jsonl, misses.jsonl, summary.json")
    pages: int | None = option(None, min=1, help=f"top pages per claim (default {DEFAULT_PAGES_OTHER}; scifact "
                                                 f"{DEFAULT_PAGES['scifact']} abstracts, one record each)")
    max_units: int = option(MAX_UNITS, min=1, help=f"units kept per pool (default {MAX_UNITS})")
    reranker: str | None = option(None, help="model of the second ordering, hub name or local directory: a "
                                             "cross-encoder (the paper's: BAAI/bge-reranker-base) or, with "
                                             "--reranker-kind bi-encoder, a sentence-transformers bi-encoder; "
                                             "without it only the BM25 ordering is written")
    reranker_kind: Literal["cross-encoder", "bi-encoder"] = option(
        CROSS_ENCODER, choices=KINDS,
        help="what --reranker is: cross-encoder (default; reads claim and unit together, the paper's) or bi-encoder "
             "(a sentence-transformers embedding model: cosine of claim and unit embedded apart, a stand-in where "
             "no cross-encoder can be reached)")
    reranker_batch_size: int = option(32, min=1, help="texts per reranker batch: pairs (cross-encoder) or units "
                                                      "(bi-encoder) (default 32)")
    budgets: list[int] | None = option(None, metavar="TOKENS", help="evidence-token budgets; each ordering's packed "
                                       "units are saved per budget (the paper's: 256 2048)")
    tokenizer: list[str] | None = option(None, action="append", help="a tokenizer (hub name or directory) of a model "
                                         "of the study; repeat for each; a unit is kept only while it fits every "
                                         "budget under every tokenizer")
    overwrite: bool = option(False, help="replace an existing output directory")

def _check(config: RetrieveConfig) -> Output:
    if config.dataset not in DATASETS:
        raise UserError(f"--dataset {config.dataset!r}: unknown; choose from {', '.join(DATASETS)}")
    for path in [*config.claims, config.corpus, config.index]:
        if not Path(path).exists():
            raise UserError(f"{path}: no such file or directory")
    if config.reranker_kind != CROSS_ENCODER and not config.reranker:
        raise UserError(f"--reranker-kind {config.reranker_kind} names the kind of --reranker, which is not given")
    if bool(config.budgets) != bool(config.tokenizer):
        raise UserError("--budgets and --tokenizer go together: a budget is counted in a tokenizer's tokens")
    return claim_dir(config.output, "real-data retrieve", inputs=[*config.claims, config.corpus, config.index],
                     overwrite=config.overwrite, legacy=only_names("records.jsonl", "misses.jsonl", "summary.json",
                                                                   needs=["summary.json"]))


def check_claims_read(claim_files: list[str], read: ClaimsRead) -> None:
    """An empty claims file, or claims files of which no claim is left, would write empty pools: one line."""
    for path in claim_files:
        p = Path(path)
        if p.is_file() and not p.read_bytes().strip():
            raise UserError(f"{path}: --claims: the file is empty (no claim to retrieve for)")
    if not read.claims:
        why = f"; every one dropped ({dropped_line(read)})" if read.dropped else ""
        raise UserError(f"{' '.join(claim_files)}: --claims: no claim to retrieve for ({read.read} read{why})")


def dropped_line(read: ClaimsRead, limit: int = 10) -> str:
    """The dropped claims as one line: reason, count and ids (the first ``limit`` per reason)."""
    parts = []
    for reason, rows in read.dropped_claims.items():
        ids = [r["id"] or r["at"] for r in rows]
        more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
        parts.append(f"{reason}: {len(rows)} ({', '.join(ids[:limit])}{more})")
    return "; ".join(parts)


def run(config: RetrieveConfig) -> CommandResult:
    """`real-data retrieve` as a function: records.jsonl, misses.jsonl and summary.json in ``config.output``,
    written as one directory (a kill leaves none); an index of another corpus is a :class:`UserError`."""
    guard = _check(config)
    out = guard.path
    budgets = check_budgets(config.budgets or [])
    index = Index(config.index)
    try:
        index.check_corpus(config.corpus, CORPUS_FORMAT[config.dataset])
        read = read_claims(config.dataset, config.claims, config.corpus)
        check_claims_read(config.claims, read)
        check_unique_ids(read.claims)
        opts = Options(pages=config.pages or DEFAULT_PAGES.get(config.dataset, DEFAULT_PAGES_OTHER),
                       max_units=config.max_units, budgets=budgets,
                       tokenizers=load_tokenizers(config.tokenizer or []),
                       reranker=make_reranker(config.reranker, config.reranker_kind, config.reranker_batch_size)
                       if config.reranker else None)
        records, misses, tally = retrieve_all(index, read.claims, opts)
    finally:
        index.close()
    stats = {"dataset": config.dataset, "claims_files": [os.path.basename(p) for p in config.claims],
             "corpus_sha256": index.meta["corpus_sha256"], "claims_read": read.read, "claims": len(read.claims),
             "dropped_by_converter": read.dropped, "dropped_claims": read.dropped_claims, "pages": opts.pages, "max_units": opts.max_units,
             "budgets": budgets, "tokenizers": list(config.tokenizer or []),
             **summary(tally, records, misses, opts)}
    with atomic_dir(out, replace=config.overwrite) as tmp:
        save_records(records, tmp / "records.jsonl")
        with open(tmp / "misses.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(m, ensure_ascii=False) + "\n" for m in misses)
        atomic_write_json(tmp / "summary.json", stats, ensure_ascii=False)
        guard.mark(tmp)
    if read.dropped_claims:
        print(f"real-data retrieve: dropped {sum(read.dropped.values())} claims ({dropped_line(read)}); "
              f"listed under dropped_claims in {out / 'summary.json'}", file=sys.stderr)
    print(f"{out}: {len(records)} records from {len(read.claims)} claims; {len(misses)} with gold missed; "
          f"gold doc recall@{opts.pages} {stats['gold_doc_recall_at_k'].get(str(opts.pages))}")
    return CommandResult(outputs={"records": str(out / "records.jsonl"), "misses": str(out / "misses.jsonl"),
                                  "summary": str(out / "summary.json")}, summary=stats)
