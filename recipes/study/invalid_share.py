"""The INVALID share per dataset x model x answer format of a `fae study-report` (its study_report.json).

The share is over every primary answer of a study (greedy and sampled replicates, both budgets and
sources), read strictly as the study reads it: the report's ``panels[i].lenient.invalid[format]``
(``strict_invalid`` of ``responses``). Format tuning (recipes/study/format_tune.sh, docs/study.md) aims
at most 5% per format for every tuned model:

    python recipes/study/invalid_share.py study-work/report-format-tuning/study_report.json \\
        --max 5 --models smollm2-135m-instruct-format gemma3-270m-format

prints one row per dataset x model x format and exits 1 when a model named by --models is over --max in
some format (every model of the report is printed; the others are not checked), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def shares(report: dict) -> list[dict]:
    """One row per panel (dataset x model) and format: responses, strict INVALID answers, their share (%)."""
    rows = []
    for panel in report["panels"]:
        for fmt, r in sorted(panel["lenient"]["invalid"].items()):
            rows.append({"dataset": panel["dataset"], "model": panel["model"], "format": fmt,
                         "responses": r["responses"], "invalid": r["strict_invalid"],
                         "share": 100.0 * r["strict_invalid"] / r["responses"] if r["responses"] else None})
    return rows


def check(rows: list[dict], models: list[str], limit: float) -> list[dict]:
    """The rows of ``models`` (a report's model name or its last path part) over ``limit`` %, or without
    answers."""
    picked = [r for r in rows if r["model"] in models or Path(r["model"]).name in models]
    return [r for r in picked if r["share"] is None or r["share"] > limit]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("report", help="study_report.json of `fae study-report`")
    p.add_argument("--max", type=float, default=5.0, help="the largest INVALID share (%%) allowed (default 5)")
    p.add_argument("--models", nargs="*", default=[], help="the models checked against --max (default: none)")
    args = p.parse_args(argv)
    try:
        report = json.loads(Path(args.report).read_text(encoding="utf-8"))
        rows = shares(report)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"invalid_share: {args.report}: not a study report ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    unknown = [m for m in args.models if not any(m in (r["model"], Path(r["model"]).name) for r in rows)]
    if unknown:
        print(f"invalid_share: {args.report} has no panel of {', '.join(unknown)}", file=sys.stderr)
        return 2
    checked = {r["model"] for r in rows if r["model"] in args.models or Path(r["model"]).name in args.models}
    over = check(rows, args.models, args.max)
    print("| dataset | model | format | responses | INVALID | share (%) | |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        share = "-" if r["share"] is None else f"{r['share']:.2f}"
        mark = ("over" if r in over else "ok") if r["model"] in checked else ""
        print(f"| {r['dataset']} | {r['model']} | {r['format']} | {r['responses']} | {r['invalid']} | {share} | {mark} |")
    if over:
        print(f"{len(over)} format(s) of {', '.join(sorted(checked))} over {args.max:g}% INVALID", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
