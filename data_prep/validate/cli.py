"""`real-data validate FILE [--keep-going] [--report PATH]`.

Exit 0 when every record is valid, 2 when the file is not (in both modes;
``--keep-going`` prints every bad line to stdout, then one error line).
The report is written before anything is printed, so `| head -1` closing
stdout early can never cost it.
"""

from __future__ import annotations

import json

from real_fae_core.atomicio import atomic_write_text
from real_fae_core.errors import UserError
from real_fae_core.jsonl import RecordFileError
from data_prep.records import RecordError, load_records, validate_file


def add_arguments(p):
    p.add_argument("records", help="records JSONL file")
    p.add_argument("--keep-going", action="store_true",
                   help="check every line and report all bad ones instead of stopping at the first")
    p.add_argument("--report", help="write the bad lines as a JSON report here (implies --keep-going)")


def run(args) -> int:
    if not args.keep_going and not args.report:
        try:
            records = load_records(args.records)
        except RecordError as exc:
            raise UserError(str(exc)) from None
        except FileNotFoundError:
            raise UserError(f"{args.records}: records file not found") from None
        print(f"{args.records}: {len(records)} valid records")
        return 0
    try:
        report = validate_file(args.records)
    except RecordFileError as exc:
        raise UserError(str(exc)) from None
    except FileNotFoundError:
        raise UserError(f"{args.records}: records file not found") from None
    if args.report:
        atomic_write_text(args.report, json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    print(report.summary())
    if not report.ok:
        raise UserError(f"{args.records}: {len(report.errors)} invalid of {report.n_lines} records"
                        + (f" (report: {args.report})" if args.report else ""))
    return 0
