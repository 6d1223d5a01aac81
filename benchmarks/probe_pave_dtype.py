"""`fae probe` and `fae pave` per claim on a CPU: fp32 (what `--dtype auto` gave on a CPU before) against bf16
(what it gives now on a CPU with native bf16), same claims, same settings, and how far the outputs agree.

Both commands are called as functions (their typed configs), each on the same FAE run / counterfactual
records, one after the other on an otherwise idle machine:

- ``fae probe``: seconds per claim, and the DirK values of the two dtypes side by side (per round, and the
  largest per-claim difference): bf16 hidden states round differently, so bitwise equality is not expected.
  fp32 runs as the probe ran before the CPU savings (transformers' own KV cache; fp32 never packs), bf16
  with them (packed linear layers, the reserved KV cache: both bitwise neutral);
- ``fae pave``: seconds per claim, the share of sampled answers whose label is the same in both dtypes (same
  seeds), and PR / CR / Margin of each; then bf16 again with the sampler's two savings
  (:func:`fae.pave.sampling.one_row_prefill`: one prefill for a prompt's N samples; the label distribution
  projecting only the positions it scores; the second is the default, the first is opt-in, ``--prefill-once``): ``fp32`` and
  ``bf16`` run without them, as the sampler did before, and ``one_prefill_same_as_bf16`` counts the samples
  ``bf16_one_prefill`` gives exactly as ``bf16`` (all of them on an AVX-512 CPU, not on an AMX one).

    python benchmarks/probe_pave_dtype.py --model models/smollm2-135m-instruct \\
        --adapter outputs/smollm2-135m-instruct/sft --records data/check-covid-test.jsonl --claims 12 \\
        --json benchmarks/results/probe_pave_dtype_cpu.json
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from data_prep.counterfactual.cli import CounterfactualConfig  # noqa: E402
from data_prep.counterfactual.cli import run as counterfactual  # noqa: E402
import fae.backends.hf as hf  # noqa: E402
from fae.ablation.cli import run as fae_run  # noqa: E402
from fae.ablation.options import FaeRunArguments  # noqa: E402
from fae.pave.cli import PaveConfig  # noqa: E402
from fae.pave.cli import run as fae_pave  # noqa: E402
from fae.pave.io import read_samples  # noqa: E402
from fae.pave.sampling import HFSampler  # noqa: E402
from fae.probes.cli import ProbeConfig  # noqa: E402
from fae.probes.cli import run as fae_probe  # noqa: E402

DTYPES = ("fp32", "bf16")


def timed(fn, config):
    t = time.perf_counter()
    result = fn(config)
    return result, time.perf_counter() - t


def probe_side_by_side(args, run_dir: Path, work: Path) -> dict:
    out = {}
    for dtype in DTYPES:
        hf.RESERVE_CACHE = dtype != "fp32"  # fp32: the probe as it ran before the CPU savings (bf16 also packs)
        try:
            result, seconds = timed(fae_probe, ProbeConfig(run_dir=run_dir, model=args.model, adapter=args.adapter,
                                                           output=work / f"probe-{dtype}", limit=args.claims,
                                                           bootstrap=200, batch_size=args.batch_size, dtype=dtype))
        finally:
            hf.RESERVE_CACHE = True
        rounds = result.summary.get("rounds") or []
        out[dtype] = {"seconds": seconds, "seconds_per_claim": seconds / args.claims,
                      "dirk_by_round": [r.get("mean") for r in rounds]}
    per_claim = [claim_values(work / f"probe-{d}" / "dirk_claims.jsonl") for d in DTYPES]
    diffs = [abs(a - b) for cid in per_claim[0] for a, b in zip(per_claim[0][cid], per_claim[1].get(cid, []))
             if a is not None and b is not None]
    out["speedup"] = out["fp32"]["seconds"] / out["bf16"]["seconds"]
    out["max_abs_claim_dirk_difference"] = max(diffs) if diffs else None
    return out


def claim_values(path: Path) -> dict:
    values = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        values[str(row["id"])] = row.get("dirk") or []
    return values


PAVE_RUNS = (("fp32", "fp32", False), ("bf16", "bf16", False), ("bf16_one_prefill", "bf16", True))


def pave_side_by_side(args, records: Path, run_dir: Path, work: Path) -> dict:
    out = {}
    for name, dtype, savings in PAVE_RUNS:
        HFSampler.logits_to_keep = savings  # the one prefill is the command's --prefill-once
        try:
            result, seconds = timed(fae_pave, PaveConfig(records=records, model=args.model, adapter=args.adapter,
                                                         output=work / f"pave-{name}", limit=args.claims,
                                                         samples=args.samples, jsd_samples=args.samples,
                                                         jsd_temperature=0.3, max_new_tokens=40, check_run=run_dir,
                                                         dtype=dtype, prefill_once=savings, progress=False))
        finally:
            HFSampler.logits_to_keep = True
        profile = (result.summary.get("profile") or {})
        out[name] = {"seconds": seconds, "seconds_per_claim": seconds / args.claims, "dtype": dtype,
                     "one_prefill_and_scored_positions_only": savings,
                     "PR": profile.get("PR"), "CR": profile.get("CR"), "Margin": profile.get("Margin")}
    samples = {name: read_samples(work / f"pave-{name}" / "samples.jsonl") for name, _, _ in PAVE_RUNS}
    same, total = compare_samples(samples["fp32"], samples["bf16"])
    out["speedup"] = out["fp32"]["seconds"] / out["bf16"]["seconds"]
    out["speedup_one_prefill"] = out["fp32"]["seconds"] / out["bf16_one_prefill"]["seconds"]
    out["same_label_share"] = same / total if total else None
    out["labels_compared"] = total
    same, total = compare_samples(samples["bf16"], samples["bf16_one_prefill"], whole=True)
    out["one_prefill_same_as_bf16"] = {"same_samples": same, "samples": total}
    return out


def compare_samples(first: dict, second: dict, whole: bool = False) -> tuple[int, int]:
    """How many sampled answers agree (their labels; ``whole``: the entire sample line per condition)."""
    same = total = 0
    for key, line in first.items():
        other = second.get(key)
        if other is None:
            continue
        for condition, answers in line["conditions"].items():
            theirs = other["conditions"].get(condition) or {}
            if whole:
                same += answers == theirs
                total += 1
                continue
            for a, b in zip(answers["answers"], theirs.get("answers") or []):
                same += a == b
                total += 1
    return same, total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--adapter")
    p.add_argument("--records", required=True, help="claim records (Check-COVID test, converted)")
    p.add_argument("--claims", type=int, default=12)
    p.add_argument("--samples", type=int, default=5, help="PAVE's N = K")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run_dir = work / "run"
        fae_run(FaeRunArguments(records=args.records, output=run_dir, model=args.model, adapter=args.adapter,
                                limit=args.claims, rounds=4, dtype="fp32", progress=False, label_probs=False))
        cf = work / "counterfactual.jsonl"
        counterfactual(CounterfactualConfig(records=args.records, output=cf, kinds=["entity"], no_progress=True))
        out = {"model": args.model, "adapter": args.adapter, "claims": args.claims, "samples": args.samples,
               "probe": probe_side_by_side(args, run_dir, work),
               "pave": pave_side_by_side(args, cf, run_dir, work),
               "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
