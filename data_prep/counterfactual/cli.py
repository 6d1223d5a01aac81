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

The parser is generated from the options in :mod:`data_prep.counterfactual.config`; what the command
checks, asks and writes is :mod:`data_prep.counterfactual.runner`.
"""

from __future__ import annotations

from real_fae_core.command import CommandResult, add_config_arguments

from .config import CounterfactualConfig

CONFIG = CounterfactualConfig


def add_arguments(p) -> None:
    """The options of `real-data counterfactual`, one per field of :class:`CounterfactualConfig`."""
    add_config_arguments(p, CounterfactualConfig)


def run(config: CounterfactualConfig) -> CommandResult:
    """`real-data counterfactual` as a function (:func:`data_prep.counterfactual.runner.run`); the LLM client
    is imported only here, so ``--help`` stays fast."""
    from .runner import run as run_counterfactual  # the openai client: only when run

    return run_counterfactual(config)
