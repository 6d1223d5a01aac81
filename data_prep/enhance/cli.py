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

import shlex
import sys
from pathlib import Path

from real_fae_core.errors import UserError


def add_arguments(p) -> None:
    p.add_argument("--records", required=True, type=Path, help="input claim records (JSONL)")
    p.add_argument("--annotators", type=Path,
                   help="annotators YAML (recipes/annotators/*.yaml); not needed with --revote")
    p.add_argument("--output", required=True, type=Path,
                   help="output JSONL; the summary goes to OUTPUT.summary.json")
    p.add_argument("--cache", type=Path,
                   help="SQLite answer cache (default: OUTPUT.cache.sqlite); reuse it to resume")
    p.add_argument("--dry-run", action="store_true",
                   help="print the number of requests and an input-token estimate; send nothing")
    p.add_argument("--min-votes", type=int, metavar="K",
                   help="votes a sentence needs (default: strict majority of the configured annotators)")
    p.add_argument("--revote", action="store_true",
                   help="recompute enhanced_evidence from the 'annotations' of an enhanced file; no requests")
    p.add_argument("--include-nei", action="store_true",
                   help="also annotate NOT_ENOUGH_INFO claims (default: passed through unchanged)")
    p.add_argument("--retry-abstentions", action="store_true",
                   help="re-ask annotators whose cached answer was an abstention (malformed answer)")
    p.add_argument("--max-in-flight", type=int, metavar="N",
                   help="at most N requests in flight over all annotators (each also has max_concurrency)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def resume_command(args) -> str:
    """The command line that resumes this run (same records, annotators, output, cache, options)."""
    words = ["real-data", "enhance", "--records", str(args.records), "--annotators", str(args.annotators),
             "--output", str(args.output)]
    if args.cache is not None:
        words += ["--cache", str(args.cache)]
    if args.min_votes is not None:
        words += ["--min-votes", str(args.min_votes)]
    if args.max_in_flight is not None:
        words += ["--max-in-flight", str(args.max_in_flight)]
    words += [flag for flag, on in (("--include-nei", args.include_nei),
                                    ("--retry-abstentions", args.retry_abstentions),
                                    ("--no-progress", args.no_progress)) if on]
    return shlex.join(words)


def run(args) -> int:
    # lazy: the runner imports the openai client (~1 s), which `real-data --help` and the other
    # subcommands do not need
    from .runner import (
        EnhanceJob,
        dry_run,
        enhance,
        format_summary,
        revote,
        summary_path,
    )

    if args.min_votes is not None and args.min_votes < 1:
        raise UserError(f"--min-votes must be >= 1, got {args.min_votes}")
    if args.max_in_flight is not None and args.max_in_flight < 1:
        raise UserError(f"--max-in-flight must be >= 1, got {args.max_in_flight}")
    if args.revote:
        if args.dry_run:
            raise UserError("--revote sends no requests; --dry-run does not apply")
        if Path(args.records).resolve() == Path(args.output).resolve():
            raise UserError("--output must differ from --records")
        code, summary = revote(args.records, args.output, args.min_votes)
    else:
        if args.annotators is None:
            raise UserError("--annotators is required (unless --revote)")
        if Path(args.records).resolve() == Path(args.output).resolve():
            raise UserError("--output must differ from --records")
        job = EnhanceJob(
            records=args.records,
            annotators=args.annotators,
            output=args.output,
            cache=args.cache,
            min_votes=args.min_votes,
            include_nei=args.include_nei,
            retry_abstentions=args.retry_abstentions,
            max_in_flight=args.max_in_flight,
            progress=not args.no_progress,
            resume_command=resume_command(args),
        )
        if args.dry_run:
            return dry_run(job)
        # Ctrl-C / SIGTERM propagate to the top-level handler (exit 130 / 143), which
        # prints the note the runner leaves: what was kept and the command to resume.
        code, summary = enhance(job)
    print(format_summary(summary))
    print(f"summary: {summary_path(Path(args.output))}")
    if code:
        print(
            f"enhance: {summary['claims_failed']} claims failed (requests exhausted their retries); "
            f"completed records are in {summary['partial_output']}. Run the same command again to retry them.",
            file=sys.stderr,
        )
    return code
