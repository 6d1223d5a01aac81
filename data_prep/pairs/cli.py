"""`real-data pairs --records FILE --variant V --output DIR`: the REAL training set.

Writes ``DIR`` as a ``datasets.DatasetDict`` (``save_to_disk``, split
``train``), the same rows as ``DIR/pairs.jsonl`` and a ``DIR/stats.json``
summary. ``real-train`` reads either form through ``dataset_name``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from real_fae_core.atomicio import atomic_dir
from real_fae_core.errors import UserError
from real_fae_core.jsonl import iter_jsonl_lines
from data_prep.pairs.build import (
    VARIANTS,
    MissingEnhancedEvidence,
    build_pairs,
    drop_over_length,
    pair_stats,
    token_lengths,
)
from data_prep.records import load_records_or_fail


def add_arguments(p):
    p.add_argument("--records", required=True, help="claim records JSONL (e.g. FEVER train)")
    p.add_argument("--variant", required=True, choices=list(VARIANTS),
                   help="sft | no_ablation | no_enhancement | real (SPEC §4)")
    p.add_argument("--output", required=True, help="output directory (HF dataset + pairs.jsonl + stats.json)")
    p.add_argument("--seed", type=int, default=42, help="shuffling seed (default 42)")
    p.add_argument("--no-shuffle", action="store_true", help="keep record order (positive before negative)")
    p.add_argument("--keep-pairs-together", action="store_true",
                   help="shuffle records, not rows: each record's positive stays right before its negative (train "
                        "with train_sampling_strategy: sequential so that one batch holds both)")
    p.add_argument("--tokenizer", help="tokenizer (local dir or hub id) to measure token lengths with its chat template")
    p.add_argument("--max-length", type=int, default=4096,
                   help="with --tokenizer: drop (and count) pairs longer than this many tokens (default 4096)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")


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


def run(args) -> int:
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {str(out)!r} is a file; give a directory for the dataset")
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise UserError(f"output directory {str(out)!r} is not empty (pass --overwrite to replace it)")
    if args.max_length is not None and args.max_length <= 0:
        raise UserError("--max-length must be a positive number of tokens")
    records = load_records_or_fail(args.records)
    try:
        rows, info = build_pairs(records, args.variant, seed=None if args.no_shuffle else args.seed,
                                 keep_pairs_together=args.keep_pairs_together)
    except MissingEnhancedEvidence as exc:
        raise UserError(str(exc.located(args.records, _first_line_of(args.records, exc.missing[0])))) from None
    if not rows:
        raise UserError(f"{args.records}: no SUPPORT/REFUTE records, so there are no training pairs")

    over = None
    if args.tokenizer:
        tok = _load_tokenizer(args.tokenizer)
        lengths = token_lengths(rows, tok, progress=len(rows) > 2000)
        rows, over = drop_over_length(rows, lengths, args.max_length)
        if not rows:
            raise UserError(f"every pair is longer than --max-length {args.max_length} tokens")

    stats = pair_stats(rows, info, over_length=over,
                       max_length=args.max_length if args.tokenizer else None,
                       tokenizer=args.tokenizer)
    stats.update({"variant": args.variant, "records_file": os.path.abspath(args.records),
                  "seed": None if args.no_shuffle else args.seed, "keep_pairs_together": args.keep_pairs_together})

    from datasets import Dataset, DatasetDict

    # Everything goes into a temporary directory beside --output that is renamed
    # into place only when complete: a full disk or Ctrl-C never leaves a
    # dataset_dict.json beside a truncated .arrow file under the final name.
    with atomic_dir(out, replace=args.overwrite) as tmp:
        DatasetDict({"train": Dataset.from_list(rows)}).save_to_disk(str(tmp))
        with (tmp / "pairs.jsonl").open("w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        with (tmp / "stats.json").open("w", encoding="utf-8") as fh:
            json.dump(stats, fh, indent=2)
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(stats["by_kind"].items()))
    dropped = ", ".join(f"{k} {n}" for k, n in stats["dropped"].items())
    print(f"{out}: {len(rows)} pairs ({kinds}); dropped: {dropped}")
    return 0
