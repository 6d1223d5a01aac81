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
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Literal

from real_fae_core.command import CommandConfig, CommandResult
from real_fae_core.errors import UserError
from real_fae_core.flags import SpacedList

from . import KINDS


@dataclasses.dataclass
class CounterfactualConfig(CommandConfig):
    """`real-data counterfactual`: counterfactual evidence pools for `fae pave`."""

    records: str
    output: str
    kinds: list[str] = dataclasses.field(default_factory=lambda: list(KINDS))
    entity_method: Literal["rules", "llm"] = "rules"
    annotators: str | None = None  # needed for semantic and entity_method llm
    annotator: str | None = None
    judge: str | None = None
    cache: str | None = None  # default OUTPUT.cache.sqlite
    seed: int = 0
    min_overlap: float | None = dataclasses.field(default=None, metadata={"min": 0, "max": 1})
    no_progress: bool = False


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


def _job(config: CounterfactualConfig):
    """The runner's job for ``config``, after the checks of its options."""
    from .runner import CounterfactualJob  # the openai client: only when run

    kinds = tuple(config.kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise UserError(f"--kinds: unknown kind {bad[0] if bad else '(none)'!r}; choose from {', '.join(KINDS)}")
    if Path(config.records).resolve() == Path(config.output).resolve():
        raise UserError("--output must differ from --records")
    job = CounterfactualJob(records=Path(config.records), output=Path(config.output), kinds=kinds,
                            entity_method=config.entity_method, annotators=_path(config.annotators),
                            annotator=config.annotator, judge=config.judge, cache=_path(config.cache),
                            seed=config.seed, min_overlap=config.min_overlap, progress=not config.no_progress)
    job.resume_command = shlex.join(["real-data", "counterfactual", *_argv(config)])
    if config.judge and config.annotators is None:
        raise UserError("--judge needs --annotators")
    if job.llm_kinds() and config.annotators is None:
        raise UserError(f"--annotators is required for {', '.join(job.llm_kinds())} "
                        "(or use --kinds entity with the default --entity-method rules)")
    return job


def run(config: CounterfactualConfig) -> CommandResult:
    from .runner import run_counterfactual, summary_path

    code, summary = run_counterfactual(_job(config))
    for kind, k in summary["kinds"].items():
        why = "; ".join(f"{n} {reason}" for reason, n in k["dropped_by_reason"].items())
        print(f"{kind} ({k['method']}): {k['kept']}/{k['sentences']} gold sentences kept with the opposite verdict "
              f"({k['label_check']['rule']} by rule, {k['label_check']['judge']} by the judge), "
              f"{k['dropped']} dropped{': ' + why if why else ''}; "
              f"{k['records_with_pool']}/{summary['claims']} claims have a pool")
    if summary["requests_by_task"]:
        r, t = summary["requests"], summary["tokens"]
        print(f"requests: {r['made']} made, {r['served_from_cache']} served from cache, {r['failed']} failed; "
              f"tokens in/out {t['in']}/{t['out']}")
    output = Path(config.output)
    print(f"summary: {summary_path(output)}")
    if code:
        print(f"counterfactual: {summary['transport_failures']} requests failed "
              f"({'; '.join(summary['failure_examples'][:1])}); answers so far are cached, "
              "run the same command again", file=sys.stderr)
    outputs = {"records": str(summary["output"])} if summary.get("output") else {}
    outputs["summary"] = str(summary_path(output))
    return CommandResult(exit_code=code, outputs=outputs, summary=summary)


def _path(value: str | None) -> Path | None:
    return None if value is None else Path(value)


def _argv(config: CounterfactualConfig) -> list[str]:
    words = ["--records", str(config.records), "--output", str(config.output), "--kinds", *config.kinds,
             "--entity-method", config.entity_method, "--seed", str(config.seed)]
    for flag, value in (("--annotators", config.annotators), ("--annotator", config.annotator),
                        ("--judge", config.judge), ("--cache", config.cache), ("--min-overlap", config.min_overlap)):
        if value is not None:
            words += [flag, str(value)]
    return words
