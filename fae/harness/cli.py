"""`fae from-inspect LOG --output RUN_DIR`: an Inspect AI log of ``real_fae/fae`` as a run directory.

The run then reads like any ``fae run`` output: ``fae report``, ``fae compare``, ``fae view``,
``fae pave --check-run``. config.json records the log it came from (``inspect_log``: path, sha256,
eval id). docs/inspect.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from real_fae_core.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", metavar="LOG", help="an Inspect log (.eval or .json) of `inspect eval real_fae/fae`")
    p.add_argument("--output", required=True, metavar="RUN_DIR",
                   help="the run directory to write (created; an earlier import of the same log is rewritten)")
    p.add_argument("--skip-incomplete", action="store_true",
                   help="make a run of the complete claims only (default: refuse a log with an incomplete claim)")


def run(args: argparse.Namespace) -> int:
    try:
        from fae.harness.logrun import log_to_run  # loads inspect_ai, an optional extra
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "inspect_ai":
            raise UserError("reading Inspect logs needs Inspect AI: pip install -e \".[inspect]\"") from None
        raise
    command = shlex.join(["fae", "from-inspect", args.log, "--output", args.output]
                         + (["--skip-incomplete"] if args.skip_incomplete else []))
    metrics = log_to_run(args.log, args.output, command=command, skip_incomplete=args.skip_incomplete)
    print(json.dumps({k: metrics[k] for k in ("n_claims", "label_accuracy", "strict_accuracy",
                                               "IS", "ER", "IO", "model_calls", "reused_calls")}))
    print(f"fae from-inspect: wrote {args.output}/config.json, claims.jsonl, metrics.json, report.md, "
          "trajectory.png", file=sys.stderr)
    return 0
