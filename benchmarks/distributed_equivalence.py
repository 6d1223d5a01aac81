"""DDP, DeepSpeed ZeRO-2/3 and FSDP on two CPU processes, each measured against one process.

Every engine trains the same LoRA adapter (same recipe, seed, data order and
global batch) through ``accelerate launch -m real.train``, the way a user
launches it; this script only reads what the runs write:

- per-step loss (``trainer_state.json``) of each engine against one process:
  the largest relative difference over the steps;
- the final adapters (``adapter_model.safetensors``): relative difference of
  all LoRA tensors, and of the ``lora_B`` tensors alone (they start at zero,
  so their norm is what training moved);
- FAE (``fae run``) of each adapter on the first N Check-COVID test claims:
  the share of claim-rounds whose label equals the one-process adapter's;
- each rank's memory at the end of training (``per_rank_memory`` in
  ``train_results.json``): bytes of parameters and optimizer state it holds
  (a shard counts its local part only) and its peak RSS.

``lora_dropout`` is 0 here: dropout masks are drawn per rank, so one process
and two would draw different ones and differ by more than the engines do.
Run from the repository root (it takes tens of minutes on two CPU cores)::

    python benchmarks/distributed_equivalence.py --model models/smollm2-135m-instruct \\
        --check-covid data/raw/check-covid --work runs/dist-eq \\
        --output benchmarks/results/distributed_equivalence_smollm2.json

``--tiny`` trains the 2-layer test Llama instead (minutes; no FAE).
``train_runtime_s`` is the Trainer's own figure, written but not compared: on a shared machine it says little.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from real_fae_core.modelref import portable_name  # noqa: E402

BIN = Path(sys.executable).parent
ENGINES = {"single": "cpu.yaml", "ddp": "cpu_2proc.yaml", "zero2": "cpu_deepspeed_zero2.yaml",
           "zero3": "cpu_deepspeed_zero3.yaml", "fsdp": "cpu_fsdp.yaml"}
SMOLLM2_RECIPE = REPO / "recipes" / "smollm2-135m-instruct" / "no_enhancement.yaml"
TINY_RECIPE = REPO / "recipes" / "tiny" / "llama-real.yaml"
# Stated before measuring: fp32 on every engine, the same samples in every optimizer step, so the runs
# differ only in the order of float additions (one process accumulates four micro-batches in turn; two
# ranks accumulate two each and all-reduce, ZeRO in flat buckets); Adam divides each update by the root of
# its second moment, which lets such 1e-7 differences grow in small-gradient coordinates over the steps.
TOLERANCE = {"loss_rel": 1e-4, "adapter_rel": 1e-3}
TOLERANCE_WHY = ("fp32, same samples per optimizer step: only the order of float additions differs "
                 "(micro-batch accumulation, all-reduce, ZeRO buckets), amplified by Adam's normalisation")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` from the repository root, output to ``log`` (a failure stops the script)."""
    with log.open("w") as fh:
        code = subprocess.run(cmd, cwd=REPO, env=ENV, stdout=fh, stderr=subprocess.STDOUT).returncode
    if code:
        sys.exit(f"distributed_equivalence: {' '.join(cmd[:8])} ... failed ({code}); see {log}")


def prepare_data(args, work: Path) -> tuple[Path, Path | None]:
    """(pairs dataset, test records): Check-COVID converted and paired as recipes/smollm2-135m-instruct does."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        sys.path.insert(0, str(REPO / "tests"))
        from helpers import toy_training_records
        from tiny_models import build_tiny_model

        model = build_tiny_model(data / "tiny-llama", "llama") if not (data / "tiny-llama").is_dir() \
            else data / "tiny-llama"
        args.model = str(model)
        recs = toy_training_records(48)
        train = data / "train.jsonl"
        train.write_text("".join(json.dumps(r) + "\n" for r in recs))
        variant, test = "real", None
    else:
        cc = Path(args.check_covid)
        train, test = data / "train.jsonl", data / "test.jsonl"
        convert = [str(BIN / "real-data"), "convert", "--dataset", "check-covid", "--corpus", str(cc / "corpus.json"),
                   "--max-pool-tokens", str(args.max_pool_tokens), "--tokenizer", args.model]
        if not train.is_file():
            run([*convert, "--claims", str(cc / "covidCheck_train_composed+extracted.json"), "--output", str(train)],
                data / "convert-train.log")
        if not test.is_file():
            run([*convert[:-4], "--max-pool-tokens", "200", "--tokenizer", args.model, "--claims",
                 str(cc / "covidCheck_test_composed.json"), str(cc / "covidCheck_test_extracted.json"),
                 "--output", str(test)], data / "convert-test.log")
        variant = "no_enhancement"
    head = data / f"train-{args.train_claims}.jsonl"
    head.write_text("".join(train.read_text().splitlines(keepends=True)[:args.train_claims]))
    pairs = data / "pairs"
    if not pairs.is_dir():
        run([str(BIN / "real-data"), "pairs", "--records", str(head), "--variant", variant, "--tokenizer", args.model,
             "--max-length", "1024", "--output", str(pairs), "--keep-pairs-together"], data / "pairs.log")
    return pairs, test


def train(engine: str, args, pairs: Path, out: Path) -> dict:
    recipe = TINY_RECIPE if args.tiny else SMOLLM2_RECIPE
    cmd = [str(BIN / "accelerate"), "launch", "--config_file", f"accelerate_configs/{ENGINES[engine]}",
           "--main_process_port", str(free_port()), "-m", "real.train", "--config", str(recipe),
           "--model_name_or_path", args.model, "--dataset_name", str(pairs), "--output_dir", str(out),
           "--max_steps", str(args.steps), "--per_device_train_batch_size", "1",
           "--global_batch_size", str(args.global_batch), "--lora_dropout", "0", "--logging_steps", "1",
           "--save_strategy", "no", "--seed", "42", "--data_seed", "42",
           "--train_sampling_strategy", "sequential"]  # one process and a distributed sampler: the same batches
    if not args.tiny:
        cmd += ["--cpu_bf16", "false"]  # fp32 everywhere: the engines' arithmetic compared, not bf16 rounding
    if not (out / "run_fingerprint.json").is_file():  # written last by a finished run: reused as it is
        run(cmd, out.with_suffix(".log"))
    state = json.loads((out / "trainer_state.json").read_text())
    results = json.loads((out / "train_results.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    return {"losses": losses, "train_runtime_s": results.get("train_runtime"), "world_size": results["world_size"],
            "global_batch_size": results["global_batch_size"], "per_rank_memory": results.get("per_rank_memory")}


def adapter(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "adapter_model.safetensors"))


def rel_diff(a: dict, b: dict, keys) -> float:
    num = math.sqrt(sum(float(((a[k] - b[k]).double() ** 2).sum()) for k in keys))
    den = math.sqrt(sum(float((b[k].double() ** 2).sum()) for k in keys))
    return num / den if den else float("inf")


def fae(args, test: Path, out: Path, fae_dir: Path) -> dict:
    run([str(BIN / "fae"), "run", "--records", str(test), "--output", str(fae_dir), "--model", args.model,
         "--adapter", str(out), "--limit", str(args.fae_claims), "--rounds", str(args.fae_rounds),
         "--max-new-tokens", "64", "--batch-size", "8", "--no-progress"], fae_dir.with_suffix(".log"))
    claims = [json.loads(line) for line in (fae_dir / "claims.jsonl").read_text().splitlines() if line.strip()]
    return {c["id"]: [r.get("label", r.get("pred")) for r in c["rounds"]] for c in claims}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "models" / "smollm2-135m-instruct"))
    ap.add_argument("--check-covid", default=str(REPO / "data" / "raw" / "check-covid"),
                    help="the Check-COVID release (corpus.json, covidCheck_*.json)")
    ap.add_argument("--work", required=True, help="folder for the data, the runs and their logs (reused)")
    ap.add_argument("--output", required=True, help="the results JSON")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--train-claims", type=int, default=50, help="training pairs from the first N train claims")
    ap.add_argument("--max-pool-tokens", type=int, default=120, help="train pools trimmed to keep pairs short")
    ap.add_argument("--fae-claims", type=int, default=30)
    ap.add_argument("--fae-rounds", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="the 2-layer test Llama instead of --model (no FAE)")
    args = ap.parse_args(argv)
    if "single" not in args.engines:
        args.engines = ["single", *args.engines]
    work = Path(args.work).resolve()
    pairs, test = prepare_data(args, work)
    n_pairs = json.loads((pairs / "stats.json").read_text())["pairs"]
    if n_pairs < args.steps * args.global_batch:  # past one epoch, the distributed sampler pads: other batches
        sys.exit(f"distributed_equivalence: {n_pairs} pairs, fewer than {args.steps} steps x {args.global_batch}; "
                 "raise --train-claims so that every step stays in the first epoch")

    runs = {e: train(e, args, pairs, work / e) for e in args.engines}
    base_losses = runs["single"]["losses"]
    ref = adapter(work / "single")
    lora_b = [k for k in ref if "lora_B" in k]
    answers = {e: fae(args, test, work / e, work / f"fae-{e}") for e in args.engines} if test is not None else {}
    engines = {}
    for e, r in runs.items():
        if len(r["losses"]) != len(base_losses):
            sys.exit(f"distributed_equivalence: {e} logged {len(r['losses'])} losses, one process {len(base_losses)}")
        row = {"world_size": r["world_size"], "global_batch_size": r["global_batch_size"],
               "train_runtime_s": r["train_runtime_s"],
               "losses": r["losses"],
               "max_rel_loss_diff": max(abs(x - y) / abs(y) for x, y in zip(r["losses"], base_losses)),
               "adapter_rel_diff": rel_diff(adapter(work / e), ref, list(ref)),
               "lora_B_rel_diff": rel_diff(adapter(work / e), ref, lora_b),
               "per_rank_memory": r["per_rank_memory"]}
        if answers:
            same = total = 0
            for cid, labels in answers["single"].items():
                for x, y in zip(labels, answers[e].get(cid, [])):
                    total += 1
                    same += x == y
            row.update(fae_claim_rounds=total, fae_same_label=same, fae_same_share=same / total if total else None)
        row["within_tolerance"] = (row["max_rel_loss_diff"] <= TOLERANCE["loss_rel"]
                                   and row["adapter_rel_diff"] <= TOLERANCE["adapter_rel"])
        engines[e] = row
    import accelerate
    import deepspeed
    import peft
    import torch
    import transformers
    import trl

    report = {
        "what": "one process vs DDP / DeepSpeed ZeRO-2 / ZeRO-3 / FSDP2 on 2 CPU processes (gloo), same seed, "
                "data order and global batch; lora_dropout 0, fp32",
        "model": "tiny-llama (tests/tiny_models.py)" if args.tiny else portable_name(args.model),
        "steps": args.steps, "global_batch": args.global_batch, "per_device_batch": 1,
        "train_records": len((work / "data" / f"train-{args.train_claims}.jsonl").read_text().splitlines()),
        "train_pairs": n_pairs, "max_pool_tokens": args.max_pool_tokens,
        "fae": None if args.tiny else {"claims": args.fae_claims, "rounds": args.fae_rounds,
                                       "records": "Check-COVID test"},
        "tolerance": {**TOLERANCE, "why": TOLERANCE_WHY},
        "optimizer": "torch AdamW (the recipe's adamw_torch; DeepSpeed wraps it as a client optimizer)",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
                     "peft": peft.__version__, "accelerate": accelerate.__version__,
                     "deepspeed": deepspeed.__version__},
        "engines": engines,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    for e, r in engines.items():
        mem = r["per_rank_memory"] or []
        print(f"{e:7s} {'ok ' if r['within_tolerance'] else 'OUT'} loss {r['max_rel_loss_diff']:.2e}  adapter {r['adapter_rel_diff']:.2e}  "
              f"lora_B {r['lora_B_rel_diff']:.2e}  fae same {r.get('fae_same_share')}  "
              f"params/rank {[m['param_bytes'] for m in mem]}  rss/rank {[m['peak_rss_bytes'] >> 20 for m in mem]} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
