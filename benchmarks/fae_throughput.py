"""FAE engine throughput against a naive loop, same tiny model, same claims, same prompts.

The naive loop is what one writes first: one claim at a time, one
``model.generate`` per round (batch of 1, no padding), no reuse. The engine is
``fae.ablation.engine.run_ablation`` with the ``hf`` backend: rounds batched across
claims, batches sorted by prompt length and left-padded, and a round whose pool
did not change reuses the previous answer. Both use the same greedy generation
config and ``max_new_tokens``.

Prints the speed ratio, the share of claim-rounds answered by reuse, and how
many claim-rounds differ between the two (left-padded fp32 batches can flip a
near-tied greedy token of a random model; more than 1% would be a bug).

    python benchmarks/fae_throughput.py                # 200 Check-COVID claims, R = 4
    python benchmarks/fae_throughput.py --claims 50    # quicker

The random model never answers validly, so its pools never shrink: round reuse and
length-sorted batching are all the engine has to gain there (on a CPU a padded prefill
costs more than a causal batch-of-1 one, batched decoding less); on a GPU batching
dominates instead. The committed runs are SmolLM2's
(benchmarks/results/fae_throughput_smollm2*.json, docs/fae.md).

The model is the random tiny Llama of ``tests/tiny_models.py`` with its weights
scaled by ``--weight-scale`` (default 5): unscaled, it answers blank lines to
every prompt, which would make the comparison of answers meaningless.

A real model: ``--model DIR`` (e.g. SmolLM2-135M-Instruct after ``real-import-gguf``;
``--adapter`` for a LoRA adapter) on real-length Check-COVID prompts. The run then
also measures this CPU's fp32 and bf16 matmul peaks (torch, same threads) and prints the
engine's achieved FLOP/s against each: 2 x (non-embedding parameters) per token of
every prompt prefilled and every token generated, plus the output layer once per
generated token (attention's own FLOPs left out, so the figure is a lower bound).

The engine runs in every dtype of ``--dtypes`` (default: fp32 and, on a CPU with native
bf16, bf16 — what ``--dtype auto`` now picks there), each timed against the same naive
fp32 loop in interleaved blocks; the claim-rounds whose answer differs between bf16 and
fp32 are counted and their claims named (greedy bf16 can flip a near tie).

    python benchmarks/fae_throughput.py --model models/smollm2-135m-instruct \
        --adapter outputs/smollm2-135m-instruct/sft --claims 16 --batch-size 16 --max-new-tokens 48 \
        --threads 0 --json benchmarks/results/fae_throughput_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# The test-only model builders and the Check-COVID loader live with the tests (tests/tiny_models.py,
# tests/fae_helpers.py); evaluation benchmarks never import the trainer package for them.
sys.path.insert(0, str(REPO / "tests"))

from fae_helpers import convert_checkcovid  # noqa: E402

from data_prep.prompts import encode_chat, parse_answer, render_evidence_prompt  # noqa: E402
from data_prep.records import ClaimRecord  # noqa: E402
from real_fae_core.hardware import CPU_ALLOCATOR_ENV, matmul_peak_gflops  # noqa: E402
from real_fae_core.modelref import portable_name  # noqa: E402


def checkcovid(data_dir: Path, n: int) -> list[ClaimRecord]:
    """The first ``n`` SUPPORT/REFUTE Check-COVID claims, read by the check-covid converter."""
    return convert_checkcovid(data_dir, n, "Check-COVID_all.json")


def build_model(workdir: Path, scale: float) -> Path:
    import torch
    from tiny_models import build_tiny_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = build_tiny_model(workdir / "tiny", "llama")
    lm = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        for p in lm.parameters():
            p.mul_(scale)
    out = workdir / "tiny-scaled"
    lm.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def engine_flops(records, claims, lm, tok) -> tuple[float, int, int]:
    """(FLOPs, prompt tokens, generated tokens) of the calls the engine made (reused rounds cost nothing)."""
    cfg = lm.config
    embed = cfg.vocab_size * cfg.hidden_size
    body = sum(p.numel() for p in lm.parameters()) - embed * (1 if cfg.tie_word_embeddings else 2)
    by_id = {r.id: r for r in records}
    prompt_tokens = gen_tokens = 0
    for c in claims:
        rec = by_id[c["id"]]
        for rd in c["rounds"]:
            if rd["reused"]:
                continue
            prompt_tokens += len(encode_chat(tok, render_evidence_prompt(rec, rd["pool_ids"])))
            gen_tokens += len(tok(rd["raw_output"], add_special_tokens=False)["input_ids"]) + 1
    flops = 2 * body * (prompt_tokens + gen_tokens) + 2 * embed * gen_tokens
    return flops, prompt_tokens, gen_tokens


def naive_loop(records, lm, tok, gc, rounds: int) -> list[list[str]]:
    """One claim at a time, one generate per round, no reuse."""
    import torch

    from fae.ablation.engine import next_pool

    outs = []
    for rec in records:
        pool = rec.pool_ids
        raws = []
        for _ in range(rounds + 1):
            ids = torch.tensor([encode_chat(tok, render_evidence_prompt(rec, pool))])
            with torch.inference_mode():
                gen = lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
            raw = tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
            raws.append(raw)
            parsed = parse_answer(raw, pool)
            pool = next_pool(pool, parsed.cited if parsed.valid else ())
        outs.append(raws)
    return outs


def parse_args(argv=None) -> argparse.Namespace:
    from real_fae_core.hardware import native_bf16_cpu_flags

    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--claims", type=int, default=200)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--block", type=int, default=50, help="claims per interleaved timing block")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--weight-scale", type=float, default=5.0)
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("REAL_SHARED_DATA", REPO / "tests" / "data"))
                   / "check-covid", help="Check-COVID files (default: $REAL_SHARED_DATA/check-covid, else the "
                   "test samples, which hold too few claims for the default --claims)")
    p.add_argument("--model", type=Path, help="a saved HF model directory instead of the tiny random model")
    p.add_argument("--adapter", type=Path, help="a LoRA adapter for --model")
    p.add_argument("--json", type=Path, help="write the measurements here")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a shared few-core machine more threads oversubscribe "
                        "and time the load, not the code; 0 = torch's default)")
    p.add_argument("--dtypes", nargs="+", choices=("fp32", "bf16"),
                   default=["fp32", "bf16"] if native_bf16_cpu_flags() else ["fp32"],
                   help="the engine's dtypes, each timed against the same naive fp32 loop (default: fp32 and, "
                        "on a CPU with native bf16, bf16)")
    args = p.parse_args(argv)
    if "fp32" not in args.dtypes:
        p.error("--dtypes must include fp32: the naive loop and the answer comparison are fp32's")
    if not (args.data_dir / "corpus.json").is_file():
        p.error(f"Check-COVID not found in {args.data_dir} (pass --data-dir)")
    return args


def open_backends(args, model: Path) -> dict:
    """{dtype: the hf backend of ``fae run`` with that dtype}."""
    from fae.backends.hf import HFBackend

    out = {}
    for dtype in args.dtypes:
        options = {"model": str(model), "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
                   "device": "cpu", "dtype": dtype, "label_probs": False}
        if args.adapter:
            options["adapter"] = str(args.adapter)
        out[dtype] = HFBackend(options)
    return out


def timed_blocks(records, backends: dict, args) -> dict:
    """The naive fp32 loop and the engine in each dtype, interleaved in blocks (the order rotating from block
    to block) so that a shared machine's changing load hits them alike."""
    from fae.ablation.engine import run_ablation

    fp32 = backends["fp32"]
    contenders = ["naive", *backends]
    seconds = {c: 0.0 for c in contenders}
    claims: dict[str, list] = {d: [] for d in backends}
    stats = {d: {"model_calls": 0, "reused_calls": 0} for d in backends}
    naive: list[list[str]] = []
    for b, start in enumerate(range(0, len(records), args.block)):
        block = records[start:start + args.block]
        for which in contenders[b % len(contenders):] + contenders[:b % len(contenders)]:
            t = time.perf_counter()
            if which == "naive":
                naive += naive_loop(block, fp32.lm, fp32.tok, fp32.gc, args.rounds)
            else:
                st = run_ablation(block, backends[which], args.rounds, claims[which].extend,
                                  chunk_size=len(block), progress=False)
                for k in stats[which]:
                    stats[which][k] += st[k]
            seconds[which] += time.perf_counter() - t
        print(f"  block {b}: " + ", ".join(f"{c} {seconds[c]:.1f} s" for c in contenders), flush=True)
    return {"seconds": seconds, "claims": claims, "stats": stats, "naive": naive}


def differing_rounds(a: list[dict], b: list[dict]) -> dict:
    """Claim-rounds whose raw answer differs between two runs of the same claims, and the claims they are in."""
    ids = sorted({x["id"] for x, y in zip(a, b)
                  for ra, rb in zip(x["rounds"], y["rounds"]) if ra["raw_output"] != rb["raw_output"]})
    n = sum(ra["raw_output"] != rb["raw_output"] for x, y in zip(a, b) for ra, rb in zip(x["rounds"], y["rounds"]))
    labels = sum(ra.get("label") != rb.get("label") for x, y in zip(a, b) for ra, rb in zip(x["rounds"], y["rounds"]))
    return {"claim_rounds": n, "label_differs": labels, "claims": ids}


def measure(args) -> dict:
    import resource

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    records = checkcovid(args.data_dir, args.claims)
    with tempfile.TemporaryDirectory() as tmp:
        backends = open_backends(args, args.model or build_model(Path(tmp), args.weight_scale))
        fp32 = backends["fp32"]
        lens = [len(encode_chat(fp32.tok, render_evidence_prompt(r))) for r in records]
        print(f"{len(records)} Check-COVID claims, R={args.rounds}, prompt tokens {min(lens)}-{max(lens)} "
              f"(mean {sum(lens) / len(lens):.0f}), max_new_tokens={args.max_new_tokens}, "
              f"batch {args.batch_size}, torch threads {torch.get_num_threads()}, engine dtypes {args.dtypes}")
        naive_loop(records[:1], fp32.lm, fp32.tok, fp32.gc, 0)  # warm-up outside the timings
        for backend in backends.values():
            backend.generate([render_evidence_prompt(records[0])])
        timed = timed_blocks(records, backends, args)
        flops = {d: engine_flops(records, timed["claims"][d], b.lm, b.tok) for d, b in backends.items()}
        peaks = {d: matmul_peak_gflops(d) for d in ("fp32", "bf16")} if args.model else {}
    timed.update(records=records, flops=flops, peaks=peaks, threads=torch.get_num_threads(),
                 peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return timed


def summarize(args, m: dict) -> dict:
    """The JSON: per dtype the engine's time, ratio to the naive loop, FLOP/s and share of each peak."""
    from fae.ablation.metrics import compute_metrics

    total = len(m["records"]) * (args.rounds + 1)
    engines = {}
    for d, claims in m["claims"].items():
        flops, prompt_tokens, gen_tokens = m["flops"][d]
        achieved = flops / m["seconds"][d] / 1e9
        engines[d] = {
            "engine_s": m["seconds"][d], "speed_ratio": m["seconds"]["naive"] / m["seconds"][d],
            "reused": m["stats"][d]["reused_calls"],
            "metrics": {k: v for k, v in compute_metrics(claims).items()
                        if k in ("label_accuracy", "strict_accuracy", "IS", "ER", "IO")},
            "valid_share": sum(rd["valid"] for c in claims for rd in c["rounds"]) / total,
            "prompt_tokens": prompt_tokens, "generated_tokens": gen_tokens, "engine_gflops": achieved,
            "share_of_fp32_peak": achieved / m["peaks"]["fp32"] if m["peaks"] else None,
            "share_of_bf16_peak": achieved / m["peaks"]["bf16"] if m["peaks"] else None}
    fp32_claims = m["claims"]["fp32"]
    naive_differs = sum(c["rounds"][r]["raw_output"] != m["naive"][k][r]
                        for k, c in enumerate(fp32_claims) for r in range(args.rounds + 1))
    return {
        "model": portable_name(str(args.model)) if args.model else "tiny random llama",
        "adapter": portable_name(str(args.adapter)) if args.adapter else None,
        "claims": len(m["records"]), "rounds": args.rounds, "batch_size": args.batch_size,
        "max_new_tokens": args.max_new_tokens, "threads": m["threads"], "claim_rounds": total,
        "naive_s": m["seconds"]["naive"], "naive_dtype": "fp32",
        "engine_fp32_vs_naive_differing_claim_rounds": naive_differs,
        "engines": engines,
        "bf16_vs_fp32_answers": differing_rounds(fp32_claims, m["claims"]["bf16"]) if "bf16" in engines else None,
        "matmul_peak_gflops": m["peaks"] or None, "peak_rss_mib": round(m["peak_rss_mib"], 1),
        "allocator_env": {k: os.environ[k] for k in CPU_ALLOCATOR_ENV if k in os.environ}}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = summarize(args, measure(args))
    print(f"naive loop (fp32, one claim at a time): {out['naive_s']:8.2f} s  ({out['claim_rounds']} generate calls)")
    for d, e in out["engines"].items():
        peak = (f", {e['share_of_bf16_peak']:.1%} of the bf16 and {e['share_of_fp32_peak']:.1%} of the fp32 "
                f"matmul peak" if e["share_of_bf16_peak"] is not None else "")
        print(f"engine {d}: {e['engine_s']:8.2f} s, {e['speed_ratio']:.2f}x the naive loop, {e['reused']} rounds "
              f"reused, {e['valid_share']:.1%} valid, {e['engine_gflops']:.1f} GFLOP/s (lower bound){peak}; "
              f"Acc {e['metrics']['label_accuracy']}, IS {e['metrics']['IS']}")
    print(f"engine fp32 vs naive: {out['engine_fp32_vs_naive_differing_claim_rounds']} of {out['claim_rounds']} "
          "claim-rounds differ")
    if out["bf16_vs_fp32_answers"]:
        d = out["bf16_vs_fp32_answers"]
        print(f"bf16 vs fp32: {d['claim_rounds']} of {out['claim_rounds']} claim-rounds answer differently "
              f"({d['label_differs']} with another label), in claims {d['claims']}")
    if out["matmul_peak_gflops"]:
        print("matmul peaks of this CPU (torch, same threads): "
              + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in out["matmul_peak_gflops"].items()))
    print(f"peak RSS {out['peak_rss_mib']} MiB")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
