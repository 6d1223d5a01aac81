"""`real-data convert --dataset NAME --claims ... [--corpus|--wiki-pages] --output records.jsonl`.

Streams the converter's records through validation (and optional pool
trimming) into an atomically written JSONL file, then prints a summary and
writes it beside the output as ``<output>.summary.json``.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

from real_fae_core.atomicio import atomic_write_json
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import claim_file
from data_prep.records import LABELS, ClaimRecord, RecordError, save_records

from . import CONVERTERS
from .base import ConvertInputs, ConvertStats, InputError
from .trim import PoolTrimmer, hf_token_counter

_OPTION = {"corpus": "--corpus", "wiki_pages": "--wiki-pages"}
GOLD_OVER_BUDGET = "gold evidence alone exceeds --max-pool-tokens"


@dataclasses.dataclass
class ConvertConfig(CommandConfig):
    """`real-data convert`: one official dataset release as claim records."""

    dataset: str = option(choices=sorted(CONVERTERS),  # a name in CONVERTERS
                          help="; ".join(c.help for c in CONVERTERS.values()))
    claims: list[str] = option(help="claim file(s) of the official release, converted in order")
    output: str = option(help="records JSONL to write")
    corpus: str | None = option(None, help="abstracts file (check-covid, scifact)")
    wiki_pages: str | None = option(None, help="FEVER wiki-pages directory of wiki-NNN.jsonl shards")
    include_nei: bool = option(False, deprecated=("--keep-nei",),
                               help="keep NOT_ENOUGH_INFO claims (evidence: []); dropped by default")
    max_pool_tokens: int | None = option(None, min=1, metavar="N", help="trim pools longer than N tokens, always "
                                         "keeping the gold sentences (needs --tokenizer)")
    tokenizer: str | None = option(None, help="HF tokenizer directory used to count pool tokens")

    def __post_init__(self) -> None:
        if isinstance(self.claims, (list, tuple)):  # claim files given as paths
            self.claims = [os.fspath(c) if isinstance(c, os.PathLike) else c for c in self.claims]
        super().__post_init__()


def _inputs(config: ConvertConfig) -> ConvertInputs:
    if config.dataset not in CONVERTERS:
        raise UserError(f"--dataset {config.dataset!r}: unknown; choose from {', '.join(sorted(CONVERTERS))}")
    conv = CONVERTERS[config.dataset]
    for opt in ("corpus", "wiki_pages"):
        given = getattr(config, opt) is not None
        if opt in conv.needs and not given:
            raise UserError(f"--dataset {config.dataset} needs {_OPTION[opt]}")
        if opt not in conv.needs and given:
            raise UserError(f"--dataset {config.dataset} does not use {_OPTION[opt]}")
    if not config.claims:
        raise UserError("--claims: give at least one claim file")
    claims = [Path(c) for c in config.claims]
    needed = {o: Path(getattr(config, o)) for o in conv.needs}
    for path in claims + list(needed.values()):
        if not path.exists():
            raise UserError(f"{path}: no such file or directory")
    if Path(config.output).is_dir():
        raise UserError(f"--output {config.output}: is a directory; give the records file to write")
    claim_file(config.output, "real-data convert", inputs=[*claims, *needed.values(), config.tokenizer])
    if (config.max_pool_tokens is None) != (config.tokenizer is None):
        raise UserError("--max-pool-tokens and --tokenizer go together")
    if config.tokenizer is not None and not Path(config.tokenizer).is_dir():
        raise UserError(f"--tokenizer {config.tokenizer}: not a tokenizer directory")
    return ConvertInputs(claims=claims, corpus=needed.get("corpus"),
                         wiki_pages=needed.get("wiki_pages"), include_nei=config.include_nei)


def convert_to_file(dataset: str, inputs: ConvertInputs, output: Path,
                    trimmer: PoolTrimmer | None = None) -> dict:
    """Run one converter end to end; returns the summary (also written as JSON)."""
    conv = CONVERTERS[dataset]
    stats = ConvertStats()
    labels: Counter = Counter()
    pool_sizes: list[int] = []
    seen: dict[str, str] = {}
    t0 = time.perf_counter()

    def records() -> Iterator[ClaimRecord]:
        for rec, path, lineno in conv.convert(inputs, stats):
            if rec.id in seen:
                stats.drop("duplicate claim id", path, lineno, None, f"{rec.id} (first at {seen[rec.id]})")
                continue
            seen[rec.id] = f"{path}:{lineno}"
            if trimmer is not None:
                rec = trimmer(rec)
                if rec is None:
                    stats.drop(GOLD_OVER_BUDGET, path, lineno, "evidence")
                    continue
            try:
                rec = rec.validate()
            except RecordError as err:
                raise InputError(path, lineno, err.field, f"record {err.record_id!r}: {err.reason}") from None
            labels[rec.label] += 1
            pool_sizes.append(len(rec.sentences))
            yield rec

    # save_records writes a temporary file beside the output and renames it on
    # success; on any failure (bad input, a full disk) the temporary is removed.
    written = save_records(records(), output)
    summary = {
        "dataset": dataset,
        "inputs": {"claims": [str(p) for p in inputs.claims],
                   **({"corpus": str(inputs.corpus)} if inputs.corpus else {}),
                   **({"wiki_pages": str(inputs.wiki_pages)} if inputs.wiki_pages else {})},
        "output": str(output),
        "claims_read": stats.claims_read,
        "records_written": written,
        "labels": {lab: labels.get(lab, 0) for lab in LABELS},
        "pool_size": ({"min": min(pool_sizes), "median": statistics.median(pool_sizes),
                       "max": max(pool_sizes)} if pool_sizes else None),
        "dropped": dict(sorted(stats.dropped.items(), key=lambda kv: (-kv[1], kv[0]))),
        "dropped_examples": stats.examples,
        **({"trimming": trimmer.stats.to_dict()} if trimmer is not None else {}),
        **stats.info,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    atomic_write_json(summary_path(output), summary, ensure_ascii=False)
    return summary


def summary_path(output: Path) -> Path:
    """Where the summary of ``output`` goes: ``<output>.summary.json``."""
    return output.with_name(output.name + ".summary.json")


def format_summary(s: dict) -> str:
    """The conversion summary as the lines printed: records, labels, pool sizes, trimming and drops with
    an example of each."""
    lines = [f"{s['dataset']}: {s['records_written']} records written to {s['output']} "
             f"({s['claims_read']} claims read)"]
    lines.append("  labels: " + ", ".join(f"{k} {v}" for k, v in s["labels"].items()))
    if s["pool_size"]:
        p = s["pool_size"]
        lines.append(f"  pool size (sentences): min {p['min']}, median {p['median']:g}, max {p['max']}")
    if s.get("trimming"):
        t = s["trimming"]
        lines.append(f"  trimming to {t['max_pool_tokens']} tokens: {t['trimmed']} trimmed, "
                     f"{t['kept_whole']} kept whole, {t['dropped_gold_over_budget']} dropped (gold over budget)")
    if s["dropped"]:
        lines.append(f"  dropped {sum(s['dropped'].values())}:")
        for reason, n in s["dropped"].items():
            lines.append(f"    {n:>7}  {reason}   e.g. {s['dropped_examples'][reason][0]}")
    else:
        lines.append("  dropped: none")
    lines.append(f"  summary: {s['output']}.summary.json")
    return "\n".join(lines)


def run(config: ConvertConfig) -> CommandResult:
    """`real-data convert` as a function: the records file and its .summary.json (``summary``); a tokenizer
    that cannot be loaded for ``--max-pool-tokens`` is a :class:`UserError`."""
    inputs = _inputs(config)
    trimmer = None
    if config.max_pool_tokens is not None:
        try:
            counter = hf_token_counter(config.tokenizer)
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot load tokenizer {config.tokenizer}: {exc}") from None
        trimmer = PoolTrimmer(config.max_pool_tokens, counter)
    output = Path(config.output)
    summary = convert_to_file(config.dataset, inputs, output, trimmer)
    print(format_summary(summary))
    sys.stdout.flush()
    return CommandResult(outputs={"records": str(output), "summary": str(summary_path(output))}, summary=summary)
