"""`real-data validate FILE [--keep-going] [--report PATH]`.

Exit 0 when every record is valid, 2 when the file is not (in both modes;
``--keep-going`` prints every bad line to stdout, then one error line).
The report is written before anything is printed, so `| head -1` closing
stdout early can never cost it.

From Python, ``run(ValidateConfig(records=...))`` returns the exit code in the
:class:`~real_fae_core.command.CommandResult` (2 for a file with bad lines)
rather than raising; a file that cannot be read as records at all (missing, a
directory, compressed) is a :class:`~real_fae_core.errors.UserError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from typing import Iterator

from real_fae_core.atomicio import atomic_write_text
from real_fae_core.command import CommandConfig, CommandResult, option
from real_fae_core.errors import EXIT_USAGE, UserError
from real_fae_core.jsonl import RecordFileError
from real_fae_core.secrets import scrub
from data_prep.records import RecordError, load_records, validate_file

PROG = "real-data validate"


@dataclasses.dataclass
class ValidateConfig(CommandConfig):
    """`real-data validate`: check a records file."""

    records: str = option(positional=True, help="records JSONL file")
    keep_going: bool = option(False, help="check every line and report all bad ones instead of stopping at the first")
    report: str | None = option(None, help="write the bad lines as a JSON report here (implies --keep-going)")


@contextlib.contextmanager
def records_file(path: str) -> Iterator[None]:
    """A missing file or one unreadable as records becomes one UserError line naming it."""
    try:
        yield
    except RecordFileError as exc:  # a directory, a compressed file, ...: not a records file at all
        raise UserError(str(exc)) from None
    except FileNotFoundError:
        raise UserError(f"{path}: records file not found") from None


def _invalid(message: str, summary: dict) -> CommandResult:
    """The file has bad lines: one error line (as the dispatcher prints a UserError) and exit 2."""
    print(f"{PROG}: error: {scrub(message)}", file=sys.stderr)
    return CommandResult(exit_code=EXIT_USAGE, summary={**summary, "ok": False, "message": message})


def run(config: ValidateConfig) -> CommandResult:
    """`real-data validate` as a function: exit code 2 with the first bad line (every bad line with
    ``--keep-going`` or ``--report``), 0 when every record is valid; the JSON report when asked."""
    if not config.keep_going and not config.report:
        try:
            with records_file(config.records):
                records = load_records(config.records)
        except RecordError as exc:  # the first bad line
            return _invalid(str(exc), {"records": config.records, "first_error": exc.to_dict()})
        print(f"{config.records}: {len(records)} valid records")
        return CommandResult(summary={"records": config.records, "ok": True, "valid": len(records)})
    with records_file(config.records):
        report = validate_file(config.records)
    outputs = {}
    if config.report:
        atomic_write_text(config.report, json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
        outputs["report"] = config.report
    print(report.summary())
    counts = {k: v for k, v in report.to_dict().items() if k != "errors"}
    if not report.ok:
        result = _invalid(f"{config.records}: {len(report.errors)} invalid of {report.n_lines} records"
                          + (f" (report: {config.report})" if config.report else ""), counts)
        result.outputs = outputs
        return result
    return CommandResult(outputs=outputs, summary={**counts, "ok": True})
