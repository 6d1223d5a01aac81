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

Measured on the 2-core CPU build machine (torch 2.13 CPU, 1 thread, batch 8):
naive 76.9 s, engine 12.5 s, ratio 6.16x; reuse answered 80.0% of the 1000
claim-rounds; 0 of 1000 claim-rounds differ. The random model never answers
validly, so its pools never shrink: reuse gives 5x, length-sorted batching the
rest (padded prefill costs ~3x a causal bs-1 prefill on CPU, batched decoding
saves ~3x). On a GPU batching dominates instead.

The model is the random tiny Llama of ``tests/tiny_models.py`` with its weights
scaled by ``--weight-scale`` (default 5): unscaled, it answers blank lines to
every prompt, which would make the comparison of answers meaningless.

A real model: ``--model DIR`` (e.g. SmolLM2-135M-Instruct after ``real-import-gguf``;
``--adapter`` for a LoRA adapter) on real-length Check-COVID prompts. The run then
also measures this CPU's fp32 matmul peak (torch, same threads) and prints the
engine's achieved FLOP/s against it: 2 x (non-embedding parameters) per token of
every prompt prefilled and every token generated, plus the output layer once per
generated token (attention's own FLOPs left out, so the figure is a lower bound).

    python benchmarks/fae_throughput.py --model models/smollm2-135m-instruct --claims 40 \
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


def matmul_peak_gflops(n: int = 2048, repeats: int = 10) -> float:
    """This CPU's fp32 matmul rate through torch (best of ``repeats``), the ceiling for dense inference."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeats + 1):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    args = p.parse_args(argv)

    import torch

    from fae.ablation.engine import run_ablation
    from fae.backends.hf import HFBackend

    if args.threads:
        torch.set_num_threads(args.threads)
    if not (args.data_dir / "corpus.json").is_file():
        p.error(f"Check-COVID not found in {args.data_dir} (pass --data-dir)")
    records = checkcovid(args.data_dir, args.claims)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or build_model(Path(tmp), args.weight_scale)
        options = {"model": str(model), "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
                   "device": "cpu", "dtype": "fp32", "label_probs": False}
        if args.adapter:
            options["adapter"] = str(args.adapter)
        backend = HFBackend(options)
        lens = [len(encode_chat(backend.tok, render_evidence_prompt(r))) for r in records]
        print(f"{len(records)} Check-COVID claims, R={args.rounds}, prompt tokens {min(lens)}-{max(lens)} "
              f"(mean {sum(lens) / len(lens):.0f}), max_new_tokens={args.max_new_tokens}, "
              f"batch {args.batch_size}, torch threads {torch.get_num_threads()}")

        # warm-up outside the timings (first-call allocations)
        naive_loop(records[:1], backend.lm, backend.tok, backend.gc, 0)

        # Interleave the two in blocks (alternating which goes first) so that a
        # shared machine's changing load hits both alike.
        engine_claims: list[dict] = []
        naive: list[list[str]] = []
        t_engine = t_naive = 0.0
        stats = {"model_calls": 0, "reused_calls": 0}
        for b, start in enumerate(range(0, len(records), args.block)):
            block = records[start:start + args.block]
            for which in (("engine", "naive") if b % 2 == 0 else ("naive", "engine")):
                t = time.perf_counter()
                if which == "engine":
                    st = run_ablation(block, backend, args.rounds, engine_claims.extend,
                                      chunk_size=len(block), progress=False)
                    t_engine += time.perf_counter() - t
                    for k in stats:
                        stats[k] += st[k]
                else:
                    naive += naive_loop(block, backend.lm, backend.tok, backend.gc, args.rounds)
                    t_naive += time.perf_counter() - t
            print(f"  block {b}: {len(engine_claims)} claims, engine {t_engine:.1f} s, naive {t_naive:.1f} s",
                  flush=True)

        flops, prompt_tokens, gen_tokens = engine_flops(records, engine_claims, backend.lm, backend.tok)
        peak = matmul_peak_gflops() if args.model else None

    total = len(records) * (args.rounds + 1)
    differ = sum(
        c["rounds"][r]["raw_output"] != naive[k][r] for k, c in enumerate(engine_claims) for r in range(args.rounds + 1)
    )
    valid = sum(rd["valid"] for c in engine_claims for rd in c["rounds"])
    print(f"naive loop : {t_naive:8.2f} s  ({total} generate calls)")
    print(f"engine     : {t_engine:8.2f} s  ({stats['model_calls']} prompts generated, "
          f"{stats['reused_calls']} reused)")
    print(f"speed ratio: {t_naive / t_engine:.2f}x")
    print(f"calls saved by reuse: {stats['reused_calls'] / total:.1%} of {total} claim-rounds")
    print(f"valid answers: {valid / total:.1%} of claim-rounds")
    print(f"claim-rounds differing from the naive loop: {differ} of {total} ({differ / total:.2%})")
    achieved = flops / t_engine / 1e9
    print(f"engine work: {prompt_tokens} prompt + {gen_tokens} generated tokens, {flops / 1e12:.2f} TFLOP "
          f"(lower bound) -> {achieved:.1f} GFLOP/s")
    if peak:
        print(f"fp32 matmul peak of this CPU (torch, {torch.get_num_threads()} threads): {peak:.1f} GFLOP/s; "
              f"the engine runs at {achieved / peak:.1%} of it")
    if args.json:
        args.json.write_text(json.dumps({
            "model": str(args.model or "tiny random llama"), "adapter": str(args.adapter) if args.adapter else None,
            "claims": len(records), "rounds": args.rounds, "batch_size": args.batch_size,
            "max_new_tokens": args.max_new_tokens, "threads": torch.get_num_threads(),
            "naive_s": t_naive, "engine_s": t_engine, "speed_ratio": t_naive / t_engine,
            "claim_rounds": total, "reused": stats["reused_calls"], "valid_share": valid / total,
            "differing_claim_rounds": differ, "prompt_tokens": prompt_tokens, "generated_tokens": gen_tokens,
            "engine_gflops": achieved, "matmul_peak_gflops": peak,
            "share_of_peak": achieved / peak if peak else None}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
