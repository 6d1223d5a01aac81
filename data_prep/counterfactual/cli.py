"""`real-data counterfactual`: counter-entity and counter-semantic evidence pools for `fae pave`.

    real-data counterfactual --records in.jsonl --output cf.jsonl --kinds entity        # rules, no model
    real-data counterfactual --records in.jsonl --output cf.jsonl \\
        --annotators recipes/annotators/local.yaml                                      # + LLM semantic

Each SUPPORT/REFUTE record gains ``counterfactual_sentences: {"entity": [...],
"semantic": [...]}``: its gold sentences transformed so that they carry the
opposite verdict (checked by rule or by an LLM judge), ids and docs kept.
Re-running resumes from the answer cache. Exit codes: 0 done, 1 some
requests failed (answers so far are cached; run again), 2 bad input,
130/143 interrupted.

The parser and its flags live here; the options are :mod:`data_prep.counterfactual.config`, what the command
checks, asks and writes is :mod:`data_prep.counterfactual.runner`.
"""

from __future__ import annotations

from real_fae_core.command import CommandResult
from real_fae_core.flags import SpacedList

from . import KINDS
from .config import CounterfactualConfig

CONFIG = CounterfactualConfig


def add_arguments(p) -> None:
    p.add_argument("--records", required=True, help="input claim records (JSONL)")
    p.add_argument("--output", required=True, help="output JSONL (summary: OUTPUT.summary.json)")
    p.add_argument("--kinds", action=SpacedList, nargs="+", default=list(KINDS), metavar="KIND",
                   help=f"kinds to build: {', '.join(KINDS)} (default all: --kinds {' '.join(KINDS)})")
    p.add_argument("--entity-method", choices=["rules", "llm"], default="rules",
                   help="rules: swap spans from the records' own sentences, no model (default); llm: ask the annotator")
    p.add_argument("--annotators",
                   help="annotators YAML, as for `real-data enhance` (needed for semantic and --entity-method llm)")
    p.add_argument("--annotator", metavar="NAME", help="which entry of --annotators to use (default: the first)")
    p.add_argument("--judge", metavar="NAME",
                   help="entry of --annotators that checks each counterfactual's verdict (default: --annotator)")
    p.add_argument("--cache", help="SQLite answer cache (default OUTPUT.cache.sqlite)")
    p.add_argument("--seed", type=int, default=0, help="seed of the rule-based swaps and of the requests' seeds at temperature > 0")
    p.add_argument("--min-overlap", type=float, metavar="FRACTION",
                   help="share of the original's content words a semantic rewrite must keep (default 0.3)")
    p.add_argument("--no-progress", action="store_true")


def run(config: CounterfactualConfig) -> CommandResult:
    from .runner import run as run_counterfactual  # the openai client: only when run

    return run_counterfactual(config)
