"""`fae from-inspect LOG --output RUN_DIR`: an Inspect AI log of ``real_fae/fae`` as a run directory.

The run then reads like any ``fae run`` output: ``fae report``, ``fae compare``, ``fae view``,
``fae pave --check-run``. config.json records the log it came from (``inspect_log``: path, sha256,
eval id). docs/inspect.md.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from real_fae_core.command import CommandConfig, CommandResult, command_line, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import any_of, claim_dir
from fae.ablation.control import control_summary_line


@dataclasses.dataclass
class FromInspectConfig(CommandConfig):
    """`fae from-inspect`: an Inspect AI log as a run directory."""

    log: str = option(positional=True, metavar="LOG",
                      help="an Inspect log (.eval or .json) of `inspect eval real_fae/fae`")
    output: str = option(metavar="RUN_DIR", help="the run directory to write (created; an earlier import of the "
                                                 "same log is rewritten)")
    skip_incomplete: bool = option(False, help="make a run of the complete claims only (default: refuse a log with "
                                               "an incomplete claim)")


def run(config: FromInspectConfig) -> CommandResult:
    """`fae from-inspect` as a function: an Inspect AI log as a FAE run directory in ``config.output``
    (``summary`` its metrics); without Inspect AI installed, a :class:`UserError` saying how to install it."""
    try:
        from fae.harness.logrun import log_to_run  # loads inspect_ai, an optional extra
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "inspect_ai":
            raise UserError("reading Inspect logs needs Inspect AI: pip install -e \".[inspect]\"") from None
        raise
    command = command_line("fae from-inspect", config)
    claim_dir(config.output, "fae from-inspect", inputs=[config.log], legacy=any_of("config.json", "claims.jsonl"))
    metrics = log_to_run(config.log, config.output, command=command, skip_incomplete=config.skip_incomplete)
    summary = {k: metrics[k] for k in ("n_claims", "label_accuracy", "strict_accuracy",
                                        "IS", "ER", "IO", "model_calls", "reused_calls")}
    summary["IS_ctrl"] = (metrics.get("control") or {}).get("IS_ctrl")
    summary["gold_only_accuracy"] = (metrics.get("gold_only") or {}).get("label_accuracy")
    print(json.dumps(summary))
    line = control_summary_line(metrics)
    if line:
        print(f"fae from-inspect: {line}", file=sys.stderr)
    print(f"fae from-inspect: wrote {config.output}/config.json, claims.jsonl, metrics.json, report.md, "
          "trajectory.png", file=sys.stderr)
    out = Path(config.output)
    return CommandResult(outputs={"run_dir": str(out), "claims": str(out / "claims.jsonl"),
                                  "metrics": str(out / "metrics.json"), "report": str(out / "report.md")},
                         summary=metrics)
