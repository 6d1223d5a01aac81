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

import shlex
from pathlib import Path

from real_fae_core.errors import UserError
from real_fae_core.flags import SpacedList

from . import KINDS


def add_arguments(p) -> None:
    p.add_argument("--records", required=True, type=Path, help="input claim records (JSONL)")
    p.add_argument("--output", required=True, type=Path, help="output JSONL (summary: OUTPUT.summary.json)")
    p.add_argument("--kinds", action=SpacedList, nargs="+", default=list(KINDS), metavar="KIND",
                   help=f"kinds to build: {', '.join(KINDS)} (default all: --kinds {' '.join(KINDS)})")
    p.add_argument("--entity-method", choices=["rules", "llm"], default="rules",
                   help="rules: swap spans from the records' own sentences, no model (default); llm: ask the annotator")
    p.add_argument("--annotators", type=Path,
                   help="annotators YAML, as for `real-data enhance` (needed for semantic and --entity-method llm)")
    p.add_argument("--annotator", metavar="NAME", help="which entry of --annotators to use (default: the first)")
    p.add_argument("--judge", metavar="NAME",
                   help="entry of --annotators that checks each counterfactual's verdict (default: --annotator)")
    p.add_argument("--cache", type=Path, help="SQLite answer cache (default OUTPUT.cache.sqlite)")
    p.add_argument("--seed", type=int, default=0, help="seed of the rule-based swaps and of the requests' seeds at temperature > 0")
    p.add_argument("--min-overlap", type=float, metavar="FRACTION",
                   help="share of the original's content words a semantic rewrite must keep (default 0.3)")
    p.add_argument("--no-progress", action="store_true")


def run(args) -> int:
    from .runner import (  # the openai client: only when run
        CounterfactualJob,
        run_counterfactual,
        summary_path,
    )

    kinds = tuple(args.kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise UserError(f"--kinds: unknown kind {bad[0] if bad else '(none)'!r}; choose from {', '.join(KINDS)}")
    if args.min_overlap is not None and not 0 <= args.min_overlap <= 1:
        raise UserError(f"--min-overlap must be a fraction in [0, 1], got {args.min_overlap}")
    if Path(args.records).resolve() == Path(args.output).resolve():
        raise UserError("--output must differ from --records")
    job = CounterfactualJob(records=args.records, output=args.output, kinds=kinds,
                            entity_method=args.entity_method, annotators=args.annotators,
                            annotator=args.annotator, judge=args.judge, cache=args.cache, seed=args.seed,
                            min_overlap=args.min_overlap, progress=not args.no_progress)
    job.resume_command = shlex.join(["real-data", "counterfactual", *_argv(args)])
    if args.judge and args.annotators is None:
        raise UserError("--judge needs --annotators")
    if job.llm_kinds() and args.annotators is None:
        raise UserError(f"--annotators is required for {', '.join(job.llm_kinds())} "
                        "(or use --kinds entity with the default --entity-method rules)")
    code, summary = run_counterfactual(job)
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
    print(f"summary: {summary_path(Path(args.output))}")
    if code:
        raise_note = (f"counterfactual: {summary['transport_failures']} requests failed "
                      f"({'; '.join(summary['failure_examples'][:1])}); answers so far are cached, "
                      "run the same command again")
        import sys

        print(raise_note, file=sys.stderr)
    return code


def _argv(args) -> list[str]:
    words = ["--records", str(args.records), "--output", str(args.output), "--kinds", *args.kinds,
             "--entity-method", args.entity_method, "--seed", str(args.seed)]
    for flag, value in (("--annotators", args.annotators), ("--annotator", args.annotator), ("--judge", args.judge),
                        ("--cache", args.cache), ("--min-overlap", args.min_overlap)):
        if value is not None:
            words += [flag, str(value)]
    return words
