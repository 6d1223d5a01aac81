"""`real-data retrieve` as a library: evidence pools for claims from an index, in two orderings, packed to
budgets.

:func:`run` takes a :class:`RetrieveConfig`; the command (:mod:`data_prep.retrieval.retrieve_cli`: its parser)
and Python callers call it.

Writes ``OUTPUT/records.jsonl`` (SPEC §2 records, read by `fae run --records` unchanged),
``OUTPUT/misses.jsonl`` (one line per claim whose gold was not all retrieved) and
``OUTPUT/summary.json`` (docs/retrieval.md). The output directory appears only when complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Literal

from real_fae_core.atomicio import atomic_dir, atomic_write_json
from real_fae_core.command import CommandConfig, CommandResult
from real_fae_core.errors import UserError
from data_prep.records import save_records
from data_prep.retrieval.build import Options, retrieve_all, summary
from data_prep.retrieval.claims import DATASETS, check_unique_ids, read_claims
from data_prep.retrieval.index import Index
from data_prep.retrieval.pack import check_budgets, load_tokenizers
from data_prep.retrieval.rerank import CROSS_ENCODER, make_reranker
from data_prep.retrieval.retrieve import DEFAULT_PAGES, DEFAULT_PAGES_OTHER, MAX_UNITS

CORPUS_FORMAT = {"scifact": "scifact", "check-covid": "check-covid", "fever": "fever"}


@dataclasses.dataclass
class RetrieveConfig(CommandConfig):
    """`real-data retrieve`: pools of one dataset's claims from an index of its corpus."""

    dataset: str  # a name in DATASETS
    claims: list[str]
    corpus: str
    index: str
    output: str
    pages: int | None = dataclasses.field(default=None, metadata={"min": 1})
    max_units: int = dataclasses.field(default=MAX_UNITS, metadata={"min": 1})
    reranker: str | None = None
    reranker_kind: Literal["cross-encoder", "bi-encoder"] = "cross-encoder"  # rerank.KINDS
    reranker_batch_size: int = dataclasses.field(default=32, metadata={"min": 1})
    budgets: list[int] | None = None
    tokenizer: list[str] | None = None
    overwrite: bool = False


def _check(config: RetrieveConfig) -> Path:
    if config.dataset not in DATASETS:
        raise UserError(f"--dataset {config.dataset!r}: unknown; choose from {', '.join(DATASETS)}")
    for path in [*config.claims, config.corpus, config.index]:
        if not Path(path).exists():
            raise UserError(f"{path}: no such file or directory")
    if config.reranker_kind != CROSS_ENCODER and not config.reranker:
        raise UserError(f"--reranker-kind {config.reranker_kind} names the kind of --reranker, which is not given")
    if bool(config.budgets) != bool(config.tokenizer):
        raise UserError("--budgets and --tokenizer go together: a budget is counted in a tokenizer's tokens")
    out = Path(config.output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not config.overwrite:
        raise UserError(f"--output {config.output}: exists and is not empty (pass --overwrite to replace it)")
    return out


def run(config: RetrieveConfig) -> CommandResult:
    out = _check(config)
    budgets = check_budgets(config.budgets or [])
    index = Index(config.index)
    try:
        index.check_corpus(config.corpus, CORPUS_FORMAT[config.dataset])
        read = read_claims(config.dataset, config.claims, config.corpus)
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
             "dropped_by_converter": read.dropped, "pages": opts.pages, "max_units": opts.max_units,
             "budgets": budgets, "tokenizers": list(config.tokenizer or []),
             **summary(tally, records, misses, opts)}
    with atomic_dir(out, replace=config.overwrite) as tmp:
        save_records(records, tmp / "records.jsonl")
        with open(tmp / "misses.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(m, ensure_ascii=False) + "\n" for m in misses)
        atomic_write_json(tmp / "summary.json", stats, ensure_ascii=False)
    print(f"{out}: {len(records)} records from {len(read.claims)} claims; {len(misses)} with gold missed; "
          f"gold doc recall@{opts.pages} {stats['gold_doc_recall_at_k'].get(str(opts.pages))}")
    return CommandResult(outputs={"records": str(out / "records.jsonl"), "misses": str(out / "misses.jsonl"),
                                  "summary": str(out / "summary.json")}, summary=stats)
