"""Constrained vs free decoding: valid-answer rate, a_0 and seconds per claim, same model, same claims.

Both passes run in this process on the same claims with the ``hf`` backend and
the FAE engine (``fae.ablation.engine.ablate``, R rounds): first unconstrained,
then with ``constrained_decoding`` (xgrammar, docs/structured.md). Also prints
the constraint's own cost: grammar compilation (once per pool shape) and the
per-step masking, per prompt.

    python benchmarks/constrained_decoding.py                 # 20 Check-COVID claims, R = 2
    python benchmarks/constrained_decoding.py --claims 50 --weight-scale 1

The model is the random tiny Llama of ``tests/tiny_models.py`` (weights scaled by
``--weight-scale``, default 5, as in fae_throughput.py; at scale 1 it answers
blank lines). A random model's labels are noise, so a_0 only shows that the
constraint makes its answers count; valid-answer rate is the number to read.
Results of one run are in benchmarks/results/constrained_decoding.txt.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))  # tests/tiny_models.py, tests/fae_helpers.py (test-only helpers)

from fae_throughput import build_model, checkcovid  # noqa: E402


def one_pass(records, model: Path, rounds: int, constrained: bool, args) -> dict:
    from fae.ablation.engine import ablate
    from fae.ablation.metrics import compute_metrics
    from fae.backends.hf import HFBackend

    backend = HFBackend({"model": str(model), "device": "cpu", "batch_size": args.batch_size,
                         "max_new_tokens": args.max_new_tokens, "constrained_decoding": constrained})
    t0 = time.perf_counter()
    claims = ablate(records, backend, rounds)
    seconds = time.perf_counter() - t0
    m = compute_metrics(claims)
    r0 = [c["rounds"][0] for c in claims]
    prompts = max(1, backend.stats.get("prompts", 0))
    return {
        "valid_r0": sum(r["valid"] for r in r0) / len(r0),
        "valid_all": sum(r["valid"] for c in claims for r in c["rounds"]) / sum(len(c["rounds"]) for c in claims),
        "a0": m.get("label_accuracy"),
        "s_per_claim": seconds / len(records),
        "prompts": backend.stats.get("prompts", 0),
        "s_per_prompt": seconds / prompts,
        "compile_ms_per_prompt": 1000 * backend.stats.get("compile_seconds", 0.0) / prompts,
        "mask_ms_per_prompt": 1000 * backend.stats.get("mask_seconds", 0.0) / prompts,
        "grammars": backend.stats.get("grammars_compiled", 0),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path(os.environ.get("REAL_SHARED_DATA", REPO / "tests" / "data"))
                   / "check-covid", help="Check-COVID files (default: $REAL_SHARED_DATA/check-covid, else the test samples)")
    p.add_argument("--claims", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--weight-scale", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    records = checkcovid(args.data, args.claims)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp), args.weight_scale)
        rows = {"free": one_pass(records, model, args.rounds, False, args),
                "constrained": one_pass(records, model, args.rounds, True, args)}
    print(f"{len(records)} Check-COVID claims, R = {args.rounds}, tiny random Llama x{args.weight_scale}, "
          f"batch {args.batch_size}, max_new_tokens {args.max_new_tokens}, {args.threads} thread(s)")
    print(f"{'decoding':<12} {'valid r0':>9} {'valid all':>10} {'a_0':>6} {'s/claim':>8} {'prompts':>8} {'s/prompt':>9} "
          f"{'compile ms/prompt':>18} {'mask ms/prompt':>15} {'grammars':>9}")
    for name, r in rows.items():
        a0 = "n/a" if r["a0"] is None else f"{r['a0']:.3f}"
        print(f"{name:<12} {r['valid_r0']:>9.1%} {r['valid_all']:>10.1%} {a0:>6} {r['s_per_claim']:>8.3f} "
              f"{r['prompts']:>8} {r['s_per_prompt']:>9.3f} "
              f"{r['compile_ms_per_prompt']:>18.2f} {r['mask_ms_per_prompt']:>15.2f} {r['grammars']:>9}")
    free, cd = rows["free"], rows["constrained"]
    print(f"constrained/free: {cd['s_per_claim'] / free['s_per_claim']:.2f}x seconds per claim, "
          f"{cd['s_per_prompt'] / free['s_per_prompt']:.2f}x seconds per prompt (valid answers shrink the pool, "
          "so the constrained pass makes more model calls; invalid ones are reused)")


if __name__ == "__main__":
    main()
