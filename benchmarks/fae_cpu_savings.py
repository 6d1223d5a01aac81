"""The FAE engine in bf16 on a CPU with and without the linear weights packed for oneDNN, in one run.

    python benchmarks/packed_linear.py --model models/smollm2-135m-instruct \\
        --records data/check-covid-test.jsonl --claims 32 --json benchmarks/results/packed_linear_cpu.json

Both engines are ``fae run``'s hf backend in bf16 (``load_hf_model``: packed by default, plain with
``REAL_FAE_CPU_PACKED_LINEAR=0``), run over the same claims in interleaved blocks (the order rotating
from block to block) so that the machine's changing load hits them alike. Every claim-round's answer is
compared: the packed layers must give the same tokens. The FLOP rate is counted as in fae_throughput.py
and read against the bf16 matmul peak measured in the same run.
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

from data_prep.records import load_records  # noqa: E402
from fae.backends.packed_linear import OPT_OUT_ENV  # noqa: E402
from real_fae_core.hardware import CPU_ALLOCATOR_ENV, matmul_peak_gflops  # noqa: E402

MODES = ("plain", "packed")


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
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    backends = {m: open_backend(args, m == "packed") for m in MODES}
    layers = {m: sum(1 for x in b.lm.modules() if "_packed_weight" in x.__dict__) for m, b in backends.items()}
    if not layers["packed"]:
        raise SystemExit("packed_linear: this torch build packs no layer (no mkldnn bf16 reorder): nothing to compare")
    run_ablation(records[:2], backends["packed"], 0, lambda c: None, chunk_size=2, progress=False)  # warm-up
    run_ablation(records[:2], backends["plain"], 0, lambda c: None, chunk_size=2, progress=False)
    seconds = {m: 0.0 for m in MODES}
    claims: dict[str, list] = {m: [] for m in MODES}
    for b, start in enumerate(range(0, len(records), args.block)):
        block = records[start:start + args.block]
        for m in (MODES if b % 2 == 0 else MODES[::-1]):
            t = time.perf_counter()
            run_ablation(block, backends[m], args.rounds, claims[m].extend, chunk_size=len(block), progress=False)
            seconds[m] += time.perf_counter() - t
        print(f"  block {b}: " + ", ".join(f"{m} {seconds[m]:.1f} s" for m in MODES), flush=True)
    answers = {m: [(c["id"], r["round"], r["raw_output"]) for c in claims[m] for r in c["rounds"]] for m in MODES}
    differ = [a[:2] for a, b in zip(answers["plain"], answers["packed"]) if a != b]
    peak = matmul_peak_gflops("bf16")
    out = {"model": str(args.model), "adapter": str(args.adapter) if args.adapter else None,
           "claims": len(records), "rounds": args.rounds, "batch_size": args.batch_size,
           "max_new_tokens": args.max_new_tokens, "packed_layers": layers["packed"],
           "claim_rounds": len(answers["packed"]), "claim_rounds_differing": len(differ), "differing": differ,
           "bf16_matmul_peak_gflops": peak,
           "allocator_env": {k: os.environ[k] for k in CPU_ALLOCATOR_ENV if k in os.environ}}
    for m in MODES:
        flops, prompt_tokens, gen_tokens = engine_flops(records, claims[m], backends[m].lm, backends[m].tok)
        out[m] = {"engine_s": seconds[m], "prompt_tokens": prompt_tokens, "generated_tokens": gen_tokens,
                  "engine_gflops": flops / seconds[m] / 1e9, "share_of_bf16_peak": flops / seconds[m] / 1e9 / peak}
    out["speedup_packed_vs_plain"] = seconds["plain"] / seconds["packed"]
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(f"plain {seconds['plain']:.1f} s, packed {seconds['packed']:.1f} s: {out['speedup_packed_vs_plain']:.2f}x; "
          f"{len(differ)} of {out['claim_rounds']} claim-rounds differ; packed "
          f"{out['packed']['engine_gflops']:.0f} GFLOP/s = {out['packed']['share_of_bf16_peak']:.1%} of the bf16 peak "
          f"({peak:.0f} GFLOP/s); peak RSS {out['peak_rss_mib']:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
