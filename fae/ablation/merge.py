"""`fae merge RUN_DIR`: the shards of a run (``fae run --shard I/N``) joined into one run.

Every shard must be there, complete, and run with the same fingerprint (model,
adapter content, prompt version, decoding options, records, deal); otherwise
one line names the shard and what to do. Then ``claims.jsonl`` (record order),
``config.json``, ``metrics.json`` and the report are written, as a
single-process run would have written them. Merging again is harmless.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from real_fae_core.command import CommandConfig, CommandResult, command_line, option
from real_fae_core.errors import UserError
from real_fae_core.runlock import RunLock
from fae.ablation import runio
from fae.ablation.results import write_results
from fae.ablation.shards import merge


@dataclasses.dataclass
class MergeConfig(CommandConfig):
    """`fae merge`: the shards of a run joined into one run."""

    run_dir: str = option(positional=True, metavar="RUN_DIR", help="the --output directory the shards were run into")
    shards: int | None = option(None, min=1, metavar="N", help="merge the split into N shards (default: the one split "
                                                              "found under RUN_DIR/shards)")


def run(config: MergeConfig) -> CommandResult:
    """`fae merge` as a function: every shard checked (count, fingerprint, complete) and joined into the run
    directory under its lock; refused when a shard is missing or differs."""
    run_dir = Path(config.run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} not found")
    if config.shards is not None and config.shards < 1:
        raise UserError(f"--shards {config.shards}: at least 1")
    command = command_line("fae merge", config)
    with RunLock(run_dir, "fae merge", is_dir=True):
        merged, claims = merge(run_dir, count=config.shards, command=command)
        write_results(run_dir, claims, merged, prog="fae merge")
    print(f"fae merge: {merged['shards']['count']} shards, {len(claims)} claims -> {run_dir}/claims.jsonl",
          file=sys.stderr)
    metrics = json.loads((run_dir / runio.METRICS).read_text(encoding="utf-8"))
    return CommandResult(outputs={"run_dir": str(run_dir), "claims": str(run_dir / runio.CLAIMS),
                                  "metrics": str(run_dir / runio.METRICS), "report": str(run_dir / "report.md")},
                         summary={"shards": merged["shards"]["count"], "n_claims": len(claims), "metrics": metrics})
