"""`real-data pairs --records FILE --variant V --output DIR`: a :class:`PairsConfig` -> the REAL training set of
one variant (:func:`run`).

Writes ``DIR`` as a ``datasets.DatasetDict`` (``save_to_disk``, split
``train``), the same rows as ``DIR/pairs.jsonl`` and a ``DIR/stats.json``
summary. ``real-train`` reads either form through ``dataset_name``.

``--line-ids`` numbers the prompt's lines (SPEC §3): ``original`` shows record
ids, so a negative's pool has a hole where ``E_train`` was; ``renumbered``
shows 0..n-1. The targets cite the numbers shown; ``evidence`` and
``pool_ids`` keep record ids, and ``stats.json`` records the choice.

``--interface`` picks the answer the rows train (``data_prep.pairs.build``,
``INTERFACES``): ``json`` (the default, the rows above), ``codes`` / ``labels``
(the evaluation-choice study's prompt and bare answer, for format tuning),
``study`` (both). ``stats.json`` records it, with the rows per format.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from real_fae_core.atomicio import atomic_dir
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import UserError
from real_fae_core.jsonl import iter_jsonl_lines
from data_prep.pairs.build import (
    DEFAULT_INTERFACE,
    INTERFACES,
    VARIANTS,
    MissingEnhancedEvidence,
    UnknownStudyDataset,
    build_pairs,
    check_interface,
    drop_over_length,
    pair_stats,
    token_lengths,
)
from data_prep.prompts import DEFAULT_LINE_IDS, LINE_IDS, check_line_ids
from data_prep.records import load_records_or_fail
from data_prep.study_prompts import STUDY_LINE_IDS
from real_fae_core.outputs import Output, claim_dir, only_names

COMMAND = "real-data pairs"


@dataclasses.dataclass
class PairsConfig(CommandConfig):
    """`real-data pairs`: the REAL training pairs of one variant."""

    records: str = option(help="claim records JSONL (e.g. FEVER train)")
    variant: str = option(choices=list(VARIANTS),  # a name in VARIANTS
                          help="sft | no_ablation | no_enhancement | real | no_enhancement_matched | real_matched "
                               "| no_enhancement_sufficient | real_sufficient (SPEC §4; *_matched add, per negative, a positive whose pool lost "
                               "as many lines outside the evidence; *_sufficient add positives on the evidence "
                               "alone and on shorter pools that hold it, and negatives at every pool size)")
    output: str = option(help="output directory (HF dataset + pairs.jsonl + stats.json)")
    seed: int = option(42, help="shuffling seed (default 42)")
    no_shuffle: bool = option(False, help="keep record order (positive before negative)")
    keep_pairs_together: bool = option(False, help="shuffle records, not rows: a record's rows stay together, its "
                                                   "positive right before its negative (train with "
                                                   "train_sampling_strategy: sequential so that one batch holds both)")
    # Checked in run(), not by argparse `choices`: a wrong value is then one line (no usage block), and a
    # Python caller's PairsConfig gets the same check.
    line_ids: str = option(DEFAULT_LINE_IDS, metavar="{" + ",".join(LINE_IDS) + "}",  # a name in LINE_IDS
                           help="how the prompt numbers its lines: original (record ids, the paper's; an ablated "
                                "pool shows a hole) or renumbered (0..n-1 in reading order); targets cite the "
                                f"numbers shown (default {DEFAULT_LINE_IDS})")
    interface: str = option(DEFAULT_INTERFACE, metavar="{" + ",".join(INTERFACES) + "}",  # a name in INTERFACES
                            help="the answer the rows train: json (SPEC §3: label and cited lines, the paper's), "
                                 "codes or labels (the evaluation-choice study's bare answers, its prompt and "
                                 "lines 0..n-1 whatever --line-ids says; needs records of a dataset the study "
                                 "knows) or study (both rows per example) (default json)")
    tokenizer: str | None = option(None, help="tokenizer (local dir or hub id) to measure token lengths with its "
                                              "chat template")
    max_length: int = option(4096, min=1, help="with --tokenizer: drop (and count) pairs longer than this many "
                                               "tokens (default 4096)")
    overwrite: bool = option(False, help="replace an existing output directory")


def _load_tokenizer(path: str):
    from transformers import AutoTokenizer

    if not Path(path).expanduser().exists() and (path.startswith((".", "/", "~")) or path.count("/") > 1):
        raise UserError(f"tokenizer path {path!r} does not exist")
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise UserError(f"could not load a tokenizer from {path!r} ({str(exc).splitlines()[0]})") from None
    if not getattr(tok, "chat_template", None):
        raise UserError(f"tokenizer {path!r} has no chat template, so it cannot render the chat prompts")
    return tok


def _first_line_of(path, record_id: str) -> int | None:
    """The line of ``record_id`` in an already validated records file."""
    for lineno, obj in iter_jsonl_lines(path):
        if isinstance(obj, dict) and str(obj.get("id")) == record_id:
            return lineno
    return None


def _check(config: PairsConfig) -> Path:
    """The output directory, after the checks that need no records."""
    if config.variant not in VARIANTS:
        raise UserError(f"--variant {config.variant!r}: unknown; choose from {', '.join(VARIANTS)}")
    check_line_ids(config.line_ids, error=UserError)
    check_interface(config.interface, "--interface", error=UserError)
    out = Path(config.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {str(out)!r} is a file; give a directory for the dataset")
    earlier = only_names("train", "dataset_dict.json", "pairs.jsonl", "stats.json", needs=["stats.json"])
    return claim_dir(out, COMMAND, inputs=[config.records], overwrite=config.overwrite, legacy=earlier).path


def run(config: PairsConfig) -> CommandResult:
    """`real-data pairs` as a function: the pairs dataset (pairs.jsonl, stats.json) in ``config.output``;
    no pair to write, or records lacking the variant's evidence, is a :class:`UserError`."""
    out = _check(config)
    records = load_records_or_fail(config.records)
    seed = None if config.no_shuffle else config.seed
    try:
        rows, info = build_pairs(records, config.variant, seed=seed, keep_pairs_together=config.keep_pairs_together,
                                 line_ids=config.line_ids, interface=config.interface)
    except MissingEnhancedEvidence as exc:
        raise UserError(str(exc.located(config.records, _first_line_of(config.records, exc.missing[0])))) from None
    except UnknownStudyDataset as exc:
        raise UserError(str(exc.located(config.records, _first_line_of(config.records, exc.record_id)))) from None
    if not rows:
        raise UserError(f"{config.records}: no SUPPORT/REFUTE records, so there are no training pairs")

    over = None
    if config.tokenizer:
        tok = _load_tokenizer(config.tokenizer)
        lengths = token_lengths(rows, tok, progress=len(rows) > 2000)
        rows, over = drop_over_length(rows, lengths, config.max_length)
        if not rows:
            raise UserError(f"every pair is longer than --max-length {config.max_length} tokens")

    stats = pair_stats(rows, info, over_length=over,
                       max_length=config.max_length if config.tokenizer else None,
                       tokenizer=config.tokenizer)
    stats.update({"variant": config.variant, "records_file": os.path.abspath(config.records),
                  "seed": seed, "keep_pairs_together": config.keep_pairs_together,
                  "line_ids": STUDY_LINE_IDS if INTERFACES[config.interface] else config.line_ids,
                  "interface": config.interface})
    write_dataset(out, rows, stats, overwrite=config.overwrite)
    Output(out, COMMAND).mark()
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(stats["by_kind"].items()))
    dropped = ", ".join(f"{k} {n}" for k, n in stats["dropped"].items())
    formats = "".join("; " + ", ".join(f"{f} {n}" for f, n in stats["by_format"].items()) if "by_format" in stats else "")
    print(f"{out}: {len(rows)} pairs ({kinds}{formats}); dropped: {dropped}")
    return CommandResult(outputs={"dataset": str(out), "pairs": str(out / "pairs.jsonl"),
                                  "stats": str(out / "stats.json")}, summary=stats)


def write_dataset(out: Path, rows: list[dict], stats: dict, overwrite: bool = False) -> None:
    """``out`` as a DatasetDict (split ``train``) with ``pairs.jsonl`` and ``stats.json`` beside it."""
    from datasets import Dataset, DatasetDict

    # Everything goes into a temporary directory beside --output that is renamed
    # into place only when complete: a full disk or Ctrl-C never leaves a
    # dataset_dict.json beside a truncated .arrow file under the final name.
    with atomic_dir(out, replace=overwrite) as tmp:
        DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(tmp))
        with (tmp / "pairs.jsonl").open("w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        with (tmp / "stats.json").open("w", encoding="utf-8") as fh:
            json.dump(stats, fh, indent=2)
