"""`real-data enhance`: annotate evidence with several LLMs and keep the majority picks.

    real-data enhance --records in.jsonl --annotators recipes/annotators/paper.yaml --output out.jsonl
    real-data enhance ... --dry-run                 # request count + token estimate, nothing sent
    real-data enhance --records out.jsonl --revote --min-votes 1 --output out2.jsonl   # no requests

Re-running the same command resumes: answers come from the cache, only what
is missing is requested. Exit codes (docs/errors.md): 0 complete, 1 some
requests failed (everything else written; run again to retry them), 2 bad
input or the output/cache is in use by another enhance, 130 interrupted,
143 terminated; on 130/143 one line says what was kept and the command to resume.
"""

from __future__ import annotations

from real_fae_core.command import CommandResult, add_config_arguments
from .options import EnhanceConfig

CONFIG = EnhanceConfig


def add_arguments(p) -> None:
    """The options of `real-data enhance`, one per field of :class:`EnhanceConfig`."""
    add_config_arguments(p, EnhanceConfig)


def run(config: EnhanceConfig) -> CommandResult:
    """`real-data enhance` as a function (:func:`data_prep.enhance.runner.run`); the openai client is imported
    only here, so ``--help`` and the other subcommands stay fast."""
    # imported here: the runner imports the openai client (~1 s), which `real-data --help` and the other
    # subcommands do not need
    from .runner import run as run_enhance

    return run_enhance(config)
