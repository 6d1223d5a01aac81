"""`fae merge RUN_DIR`: the shards of a run (``fae run --shard I/N``) joined into one run.

Every shard must be there, complete, and run with the same fingerprint (model,
adapter content, prompt version, decoding options, records, deal); otherwise
one line names the shard and what to do. Then ``claims.jsonl`` (record order),
``config.json``, ``metrics.json`` and the report are written, as a
single-process run would have written them. Merging again is harmless.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from real_fae_core.errors import UserError
from real_fae_core.runlock import RunLock
from fae.ablation.cli import write_results
from fae.ablation.shards import merge


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="the --output directory the shards were run into")
    p.add_argument("--shards", type=int, metavar="N",
                   help="merge the split into N shards (default: the one split found under RUN_DIR/shards)")


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} not found")
    if args.shards is not None and args.shards < 1:
        raise UserError(f"--shards {args.shards}: at least 1")
    command = shlex.join(["fae", "merge", *sys.argv[2:]]) if sys.argv[1:2] == ["merge"] else f"fae merge {run_dir}"
    with RunLock(run_dir, "fae merge", is_dir=True):
        config, claims = merge(run_dir, count=args.shards, command=command)
        write_results(run_dir, claims, config, prog="fae merge")
    print(f"fae merge: {config['shards']['count']} shards, {len(claims)} claims -> {run_dir}/claims.jsonl",
          file=sys.stderr)
    return 0
