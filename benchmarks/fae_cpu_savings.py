"""The FAE engine in bf16 on a CPU with and without each of its CPU savings, in one run.

    python benchmarks/fae_cpu_savings.py --model models/smollm2-135m-instruct \\
        --records data/check-covid-test.jsonl --claims 64 --json benchmarks/results/fae_cpu_savings.json

Three engines, each ``fae run``'s hf backend in bf16:

- ``plain``: linear layers as transformers builds them (``REAL_FAE_CPU_PACKED_LINEAR=0``) and
  transformers' ``DynamicCache`` (``fae.backends.hf.RESERVE_CACHE = False``): the engine before both;
- ``packed``: linear weights packed for oneDNN at load (fae/backends/packed_linear.py);
- ``packed + reserved cache``: also the KV cache with the answer's room reserved (fae/backends/reserved_cache.py),
  the default.

They run over the same claims in interleaved blocks (the order rotating from block to block) so that the
machine's changing load hits them alike. Every claim-round's answer is compared with ``plain``'s: both
savings must give the same tokens (the script exits 1 otherwise). The FLOP rate is counted as in
fae_throughput.py and read against the bf16 matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from fae_throughput import engine_flops  # noqa: E402

import fae.backends.hf as hf  # noqa: E402
from data_prep.records import load_records  # noqa: E402
from fae.backends.packed_linear import OPT_OUT_ENV  # noqa: E402
from real_fae_core.hardware import CPU_ALLOCATOR_ENV, matmul_peak_gflops  # noqa: E402

MODES = {"plain": (False, False), "packed": (True, False), "packed + reserved cache": (True, True)}  # (pack, reserve)


def open_backend(args, packed: bool):
    from fae.backends.hf import HFBackend

    options = {"model": str(args.model), "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
               "device": "cpu", "dtype": "bf16", "label_probs": False}
    if args.adapter:
        options["adapter"] = str(args.adapter)
    saved = os.environ.pop(OPT_OUT_ENV, None)
    if not packed:
        os.environ[OPT_OUT_ENV] = "0"
    try:
        return HFBackend(options)
    finally:
        os.environ.pop(OPT_OUT_ENV, None)
        if saved is not None:
            os.environ[OPT_OUT_ENV] = saved


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--adapter", type=Path)
    p.add_argument("--records", type=Path, required=True, help="converted records (e.g. Check-COVID test)")
    p.add_argument("--claims", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--block", type=int, default=8, help="claims per interleaved timing block")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    from fae.ablation.engine import run_ablation

    records = load_records(args.records)[:args.claims]
    backends = {"plain": open_backend(args, False), "packed": open_backend(args, True)}
    packed_layers = sum(1 for x in backends["packed"].lm.modules() if "_packed_weight" in x.__dict__)
    if not packed_layers:
        raise SystemExit("fae_cpu_savings: this torch build packs no layer (no mkldnn bf16 reorder)")
    names = list(MODES)
    seconds = {m: 0.0 for m in names}
    claims: dict[str, list] = {m: [] for m in names}

    def run(mode: str, block, write) -> None:
        pack, reserve = MODES[mode]
        hf.RESERVE_CACHE = reserve
        run_ablation(block, backends["packed" if pack else "plain"], args.rounds, write, chunk_size=len(block),
                     progress=False)

    for m in names:  # warm-up
        run(m, records[:2], lambda c: None)
    for b, start in enumerate(range(0, len(records), args.block)):
        block = records[start:start + args.block]
        for m in names[b % len(names):] + names[:b % len(names)]:
            t = time.perf_counter()
            run(m, block, claims[m].extend)
            seconds[m] += time.perf_counter() - t
        print(f"  block {b}: " + ", ".join(f"{m} {seconds[m]:.1f} s" for m in names), flush=True)
    hf.RESERVE_CACHE = True
    answers = {m: [(c["id"], r["round"], r["raw_output"]) for c in claims[m] for r in c["rounds"]] for m in names}
    peak = matmul_peak_gflops("bf16")
    out = {"model": str(args.model), "adapter": str(args.adapter) if args.adapter else None,
           "claims": len(records), "rounds": args.rounds, "batch_size": args.batch_size,
           "max_new_tokens": args.max_new_tokens, "packed_layers": packed_layers,
           "claim_rounds": len(answers["plain"]), "bf16_matmul_peak_gflops": peak,
           "allocator_env": {k: os.environ[k] for k in CPU_ALLOCATOR_ENV if k in os.environ}, "engines": {}}
    differing = 0
    for m in names:
        flops, prompt_tokens, gen_tokens = engine_flops(records, claims[m], backends["plain"].lm, backends["plain"].tok)
        differ = [a[:2] for a, b in zip(answers["plain"], answers[m]) if a != b]
        differing += len(differ)
        out["engines"][m] = {"engine_s": seconds[m], "speedup_vs_plain": seconds["plain"] / seconds[m],
                             "claim_rounds_differing_from_plain": len(differ), "differing": differ,
                             "prompt_tokens": prompt_tokens, "generated_tokens": gen_tokens,
                             "engine_gflops": flops / seconds[m] / 1e9,
                             "share_of_bf16_peak": flops / seconds[m] / 1e9 / peak}
        print(f"{m:24s} {seconds[m]:6.1f} s  {seconds['plain'] / seconds[m]:.2f}x plain  {len(differ)} of "
              f"{len(answers['plain'])} claim-rounds differ  {flops / seconds[m] / 1e9:.0f} GFLOP/s = "
              f"{flops / seconds[m] / 1e9 / peak:.1%} of the bf16 peak ({peak:.0f} GFLOP/s)")
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(f"peak RSS {out['peak_rss_mib']:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
