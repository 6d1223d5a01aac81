"""`fae probe` and `fae pave` per claim on a CPU: fp32 (what `--dtype auto` gave on a CPU before) against bf16
(what it gives now on a CPU with native bf16), same claims, same settings, and how far the outputs agree.

Both commands are called as functions (their typed configs), each on the same FAE run / counterfactual
records, one after the other on an otherwise idle machine:

- ``fae probe``: seconds per claim, and the DirK values of the two dtypes side by side (per round, and the
  largest per-claim difference): bf16 hidden states round differently, so bitwise equality is not expected.
  fp32 runs as the probe ran before the CPU savings (transformers' own KV cache; fp32 never packs), bf16
  with them (packed linear layers, the reserved KV cache: both bitwise neutral);
- ``fae pave``: seconds per claim, the share of sampled answers whose label is the same in both dtypes (same
  seeds), and PR / CR / Margin of each. ``fp32`` and ``bf16`` run the sampler as it ran before the CPU
  savings; ``bf16_default`` as ``fae pave`` runs it now (the label distribution projecting only the positions
  it scores, the KV cache reserving the answer's room: both leave the samples bitwise as they were);
  ``bf16_one_prefill`` adds the opt-in ``--prefill-once`` (:func:`fae.pave.sampling.one_row_prefill`: one
  prefill for a prompt's N samples). ``*_same_as_bf16`` counts the samples whose text, and whose label
  distribution, each gives exactly as ``bf16`` (every text with the defaults; with one prefill, all of them
  on an AVX-512 CPU, not on an AMX one).

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

from data_prep.counterfactual.runner import CounterfactualConfig  # noqa: E402
from data_prep.counterfactual.runner import run as counterfactual  # noqa: E402
import fae.backends.hf as hf  # noqa: E402
from fae.ablation.runner import run as fae_run  # noqa: E402
from fae.ablation.runner import FaeRunConfig  # noqa: E402
from fae.pave.runner import PaveConfig  # noqa: E402
from fae.pave.runner import run as fae_pave  # noqa: E402
from fae.pave.io import read_samples  # noqa: E402
from fae.pave.sampling import HFSampler  # noqa: E402
from fae.probes.runner import ProbeConfig  # noqa: E402
from fae.probes.runner import run as fae_probe  # noqa: E402

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


# (name, dtype, the sampler's default savings, --prefill-once). The default savings are the label distribution
# projecting only the positions it scores and the KV cache reserving the answer's room, both bitwise neutral for
# the samples; fp32 and bf16 run without them, as the sampler ran before the CPU savings.
PAVE_RUNS = (("fp32", "fp32", False, False), ("bf16", "bf16", False, False), ("bf16_default", "bf16", True, False),
             ("bf16_one_prefill", "bf16", True, True))


def pave_side_by_side(args, records: Path, run_dir: Path, work: Path) -> dict:
    out = {}
    for name, dtype, savings, prefill_once in PAVE_RUNS:
        HFSampler.logits_to_keep = savings
        hf.RESERVE_CACHE = savings
        try:
            result, seconds = timed(fae_pave, PaveConfig(records=records, model=args.model, adapter=args.adapter,
                                                         output=work / f"pave-{name}", limit=args.claims,
                                                         samples=args.samples, jsd_samples=args.samples,
                                                         jsd_temperature=0.3, max_new_tokens=40, check_run=run_dir,
                                                         dtype=dtype, prefill_once=prefill_once, progress=False,
                                                         constrained_decoding=args.constrained_decoding))
        finally:
            HFSampler.logits_to_keep = True
            hf.RESERVE_CACHE = True
        profile = (result.summary.get("profile") or {})
        out[name] = {"seconds": seconds, "seconds_per_claim": seconds / args.claims, "dtype": dtype,
                     "scored_positions_only_and_reserved_cache": savings, "prefill_once": prefill_once,
                     "PR": profile.get("PR"), "CR": profile.get("CR"), "Margin": profile.get("Margin")}
    samples = {name: read_samples(work / f"pave-{name}" / "samples.jsonl") for name, *_ in PAVE_RUNS}
    same, total = compare_samples(samples["fp32"], samples["bf16"])
    for name, *_ in PAVE_RUNS[1:]:
        out[f"speedup_{name}"] = out["fp32"]["seconds"] / out[name]["seconds"]
    out["bf16_same_label_share_as_fp32"] = same / total if total else None
    out["labels_compared"] = total
    out["valid_labels_in_fp32"] = sum(a is not None for line in samples["fp32"].values()
                                      for answers in line["conditions"].values() for a in answers["answers"])
    for name in ("bf16_default", "bf16_one_prefill"):
        same_text, total = compare_samples(samples["bf16"], samples[name], field="raw")
        same_probs, _ = compare_samples(samples["bf16"], samples[name], field="probs")
        out[f"{name}_same_as_bf16"] = {"same_texts": same_text, "same_distributions": same_probs, "samples": total}
    return out


def compare_samples(first: dict, second: dict, field: str = "answers") -> tuple[int, int]:
    """How many sampled answers agree in ``field`` (``answers``: the parsed labels; ``raw``: the texts;
    ``probs``: the label distributions, exactly)."""
    same = total = 0
    for key, line in first.items():
        other = second.get(key)
        if other is None:
            continue
        for condition, answers in line["conditions"].items():
            theirs = other["conditions"].get(condition) or {}
            for a, b in zip(answers[field], theirs.get(field) or []):
                same += a == b
                total += 1
    return same, total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--adapter")
    p.add_argument("--records", required=True, help="claim records (Check-COVID test, converted)")
    p.add_argument("--claims", type=int, default=12)
    p.add_argument("--samples", type=int, default=5, help="PAVE's N = K")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--constrained-decoding", action="store_true",
                   help="FAE and PAVE under the answer grammar (a base model answers prose without it, so every "
                        "label is invalid and PR / CR are undefined)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run_dir = work / "run"
        fae_run(FaeRunConfig(records=args.records, output=run_dir, model=args.model, adapter=args.adapter,
                                limit=args.claims, rounds=4, dtype="fp32", progress=False, label_probs=False,
                                constrained_decoding=args.constrained_decoding))
        cf = work / "counterfactual.jsonl"
        counterfactual(CounterfactualConfig(records=args.records, output=cf, kinds=["entity"], no_progress=True))
        out = {"model": args.model, "adapter": args.adapter, "claims": args.claims, "samples": args.samples,
               "constrained_decoding": args.constrained_decoding,
               "probe": probe_side_by_side(args, run_dir, work),
               "pave": pave_side_by_side(args, cf, run_dir, work),
               "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
