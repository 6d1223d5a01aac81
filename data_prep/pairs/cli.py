"""`real-data pairs --records FILE --variant V --output DIR`: the command line of the REAL training set.

The parser and its flags live here; what the pairs are and what is written is :mod:`data_prep.pairs.runner`.
"""

from __future__ import annotations

from data_prep.pairs.build import VARIANTS
from data_prep.pairs.runner import PairsConfig
from data_prep.pairs.runner import run  # noqa: F401 - the command's run(config), for the dispatcher
from data_prep.prompts import DEFAULT_LINE_IDS, LINE_IDS

CONFIG = PairsConfig


def add_arguments(p):
    p.add_argument("--records", required=True, help="claim records JSONL (e.g. FEVER train)")
    p.add_argument("--variant", required=True, choices=list(VARIANTS),
                   help="sft | no_ablation | no_enhancement | real | no_enhancement_matched | real_matched (SPEC "
                        "§4; *_matched add, per negative, a positive whose pool lost as many lines outside the "
                        "evidence)")
    p.add_argument("--output", required=True, help="output directory (HF dataset + pairs.jsonl + stats.json)")
    p.add_argument("--seed", type=int, default=42, help="shuffling seed (default 42)")
    p.add_argument("--no-shuffle", action="store_true", help="keep record order (positive before negative)")
    p.add_argument("--keep-pairs-together", action="store_true",
                   help="shuffle records, not rows: a record's rows stay together, its positive right before its "
                        "negative (train with train_sampling_strategy: sequential so that one batch holds both)")
    # Checked in run(), not by argparse `choices`: a wrong value is then one line (no usage block), and a
    # Python caller's PairsConfig gets the same check.
    p.add_argument("--line-ids", default=DEFAULT_LINE_IDS, metavar="{" + ",".join(LINE_IDS) + "}",
                   help="how the prompt numbers its lines: original (record ids, the paper's; an ablated pool "
                        "shows a hole) or renumbered (0..n-1 in reading order); targets cite the numbers shown "
                        f"(default {DEFAULT_LINE_IDS})")
    p.add_argument("--tokenizer", help="tokenizer (local dir or hub id) to measure token lengths with its chat template")
    p.add_argument("--max-length", type=int, default=4096,
                   help="with --tokenizer: drop (and count) pairs longer than this many tokens (default 4096)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
