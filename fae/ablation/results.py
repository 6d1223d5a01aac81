"""The files of a finished run: metrics.json, report.md and trajectory.png.

Written by `fae run` (:mod:`fae.ablation.runner`), `fae merge` and the Ray executor, each once
every claim of the run is in claims.jsonl.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from real_fae_core.errors import UserError
from fae.ablation import runio
from fae.ablation.control import control_summary_line
from fae.ablation.metrics import compute_metrics, truncation_note
from fae.ablation.sufficiency import sufficiency_summary_line
from fae.ablation.report import write_report


def write_results(run_dir: Path, claims: list[dict], config: dict, prog: str = "fae run") -> None:
    """metrics.json (stamped with the claims it was computed from), report.md and trajectory.png."""
    if len(claims) != len(config["claim_ids"]):
        raise UserError(f"{run_dir}: {len(config['claim_ids']) - len(claims)} claims missing after the run; "
                        "rerun to resume")
    n_nei = int(config.get("n_excluded_nei") or 0)
    metrics = runio.stamp_metrics(compute_metrics(claims, n_excluded_nei=n_nei), run_dir / runio.CLAIMS, len(claims))
    runio.write_json_atomic(run_dir / runio.METRICS, metrics)
    write_report([run_dir], run_dir)
    print(json.dumps({k: metrics[k] for k in ("n_claims", "label_accuracy", "strict_accuracy",
                                               "IS", "ER", "IO", "model_calls", "reused_calls")}))
    for line in (control_summary_line(metrics), sufficiency_summary_line(metrics)):
        if line:
            print(f"{prog}: {line}", file=sys.stderr)
    note = truncation_note(metrics, (config.get("settings") or {}).get("max_new_tokens"))
    if note:
        print(f"{prog}: warning: {note}", file=sys.stderr)
    print(f"{prog}: wrote {run_dir}/claims.jsonl, metrics.json, report.md, trajectory.png", file=sys.stderr)
