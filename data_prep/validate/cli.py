"""`real-data validate FILE [--keep-going] [--report PATH]`.

Exit 0 when every record is valid, 2 when the file is not (in both modes;
``--keep-going`` prints every bad line to stdout, then one error line).
The report is written before anything is printed, so `| head -1` closing
stdout early can never cost it.
"""

from __future__ import annotations

import contextlib
import json
from typing import Iterator

from real_fae_core.atomicio import atomic_write_text
from real_fae_core.errors import UserError
from data_prep.records import RecordError, load_records, validate_file


def add_arguments(p):
    p.add_argument("records", help="records JSONL file")
    p.add_argument("--keep-going", action="store_true",
                   help="check every line and report all bad ones instead of stopping at the first")
    p.add_argument("--report", help="write the bad lines as a JSON report here (implies --keep-going)")


@contextlib.contextmanager
def records_file(path: str) -> Iterator[None]:
    """A bad or missing records file becomes one UserError line naming it."""
    try:
        yield
    except RecordError as exc:  # a bad record, or a file unreadable as records (RecordFileError)
        raise UserError(str(exc)) from None
    except FileNotFoundError:
        raise UserError(f"{path}: records file not found") from None


def run(args) -> int:
    if not args.keep_going and not args.report:
        with records_file(args.records):
            records = load_records(args.records)
        print(f"{args.records}: {len(records)} valid records")
        return 0
    with records_file(args.records):
        report = validate_file(args.records)
    if args.report:
        atomic_write_text(args.report, json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    print(report.summary())
    if not report.ok:
        raise UserError(f"{args.records}: {len(report.errors)} invalid of {report.n_lines} records"
                        + (f" (report: {args.report})" if args.report else ""))
    return 0
