"""`real-data validate FILE [--keep-going] [--report PATH]`."""

from __future__ import annotations

import json

from data_prep._dispatch import UserError
from data_prep.records import RecordError, load_records, validate_file


def add_arguments(p):
    p.add_argument("records", help="records JSONL file")
    p.add_argument("--keep-going", action="store_true",
                   help="check every line and report all bad ones instead of stopping at the first")
    p.add_argument("--report", help="write the bad lines as a JSON report here")


def run(args) -> int:
    if not args.keep_going:
        try:
            records = load_records(args.records)
        except (RecordError, FileNotFoundError) as exc:
            raise UserError(str(exc)) from None
        print(f"{args.records}: {len(records)} valid records")
        return 0
    try:
        report = validate_file(args.records)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    print(report.summary())
    if args.report:
        with open(args.report, "w", encoding="utf-8") as fh:
            json.dump(report.to_dict(), fh, indent=2, ensure_ascii=False)
    return 0 if report.ok else 1
