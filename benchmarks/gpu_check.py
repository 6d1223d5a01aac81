"""GPU check (issue #17): one command that proves the GPU paths in under 8 minutes, offline.

    python benchmarks/gpu_check.py --output OUT --data DATA_DIR          # on one CUDA GPU
    python benchmarks/gpu_check.py --output OUT --data DATA_DIR --dry-run  # CPU, scaled down (CI)

``DATA_DIR`` holds ``scifact/claims_train.jsonl`` and ``scifact/corpus_cited.jsonl``
(default: ``$REAL_SHARED_DATA``, else ``.gpu_data`` inside the repo, else the samples in ``tests/data``).
Writes ``OUT/gpu_check.json``, ``OUT/gpu_check.md`` and ``OUT/logs.tar.gz``;
models and data go to a temporary work folder (``--work``), deleted at the end.

Steps, each isolated (a failing step records its error and the check goes on)
and each under its own time budget (the whole run under ``--time-limit``):

1. ``environment``: versions, GPU name and memory, which optional packages import.
2. ``train_single_gpu`` / ``train_zero2`` / ``train_zero3``: ``accelerate launch -m real.train`` in
   bf16 (``single_gpu.yaml``; ``deepspeed_zero2.yaml`` / ``deepspeed_zero3.yaml`` with one process per GPU,
   at most 2; ZeRO-3's saved adapter gathered from the shards, every tensor non-empty) on a
   random ~1B Llama built in code and REAL pairs of SciFact (``real-data convert``
   + ``real-data pairs``): the loss falls, tokens/s and model FLOPs utilisation.
3. ``demo``: ``real-demo`` (device chosen automatically); its ``summary.json``
   against the CPU result in ``benchmarks/results/demo_cpu_summary.json``:
   every a_r within two claims.
4. ``eval_hf`` / ``eval_vllm``: ``fae run`` (R = 4, batch 32) on an 8B-shaped
   random Llama, 64 claims, prompts of ~1k tokens: prefill tokens/s and
   utilisation; vLLM only where it imports.
5. ``shards``: the same evaluation as two shards (``fae run --shard 0/2`` and
   ``1/2``, one after the other on the one GPU, then ``fae merge``) with vLLM on
   a GPU (hf in the dry run): the merged claims against the one-process run of
   step 4 (rounds equal, or the share that differs: vLLM batches are not
   batch-invariant), and each shard's wall time.
6. ``pave_vllm``: ``fae pave --backend vllm`` (each prompt's N answers as one
   request with ``n = N`` and its own seed) on 8 claims of step 4's records:
   every prompt got its N answers, and a rerun resumes without a new sample.
7. ``probes``: ``fae probe`` (DirK) on the demo's runs on CUDA and on CPU (fp32
   both): per-round means agree within 1e-3.

``--dry-run`` runs the same steps on CPU with everything scaled down (tiny
models, 2 training steps, a reduced demo, 8 claims); GPU-only parts are skipped
with their reason. Exit code 1 when a step failed, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELPER = Path(__file__).resolve().parent / "gpu_check_helper.py"
DEMO_CPU_SUMMARY = REPO / "benchmarks" / "results" / "demo_cpu_summary.json"
FORMAT = "real-fae-gpu-check/1"

# Dense bf16 peak (TFLOP/s, no sparsity) by GPU name; the first matching entry wins, so
# specific names come before general ones. An unknown GPU gets null utilisation.
PEAK_BF16_TFLOPS = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("A100", 312.0),
)
OPTIONAL_PACKAGES = ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "deepspeed", "vllm",
                     "openai", "scipy", "matplotlib")
DEMO_TOLERANCE_CLAIMS = 2
DIRK_TOLERANCE = 1e-3


def peak_bf16_tflops(gpu_name: str | None) -> float | None:
    """Dense bf16 peak of a GPU from its name (``torch.cuda.get_device_name``), or None."""
    if not gpu_name:
        return None
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in gpu_name.lower():
            return tflops
    return None


@dataclass
class Scale:
    """How big each step is: the GPU run and the CPU dry run share every code path."""

    train_shape: str = "1b"
    train_steps: int = 30
    train_batch: int = 8
    train_lr: float = 1e-3
    max_length: int = 2048
    eval_shape: str = "8b"
    eval_claims: int = 64
    eval_batch: int = 32
    prompt_tokens: int = 1024
    rounds: int = 4
    reduced_demo: bool = False
    probe_bootstrap: int = 200
    time_limit: float = 470.0
    budgets: dict = field(default_factory=lambda: {
        "environment": 60, "train_single_gpu": 150, "train_zero2": 120, "train_zero3": 120,
        "demo": 200,
        "eval_hf": 200, "eval_vllm": 150, "shards": 200, "pave_vllm": 150, "probes": 90,
    })


FULL = Scale()
DRY = Scale(train_shape="tiny", train_steps=2, train_batch=2, eval_shape="tiny", eval_claims=8, eval_batch=4,
            prompt_tokens=256, reduced_demo=True, probe_bootstrap=50, time_limit=1500.0,
            # generous: CI machines are slow and shared; the dry run proves code paths, not speed
            budgets={"environment": 120, "train_single_gpu": 360, "train_zero2": 60, "train_zero3": 60,
                     "demo": 480,
                     "eval_hf": 240, "eval_vllm": 60, "shards": 240, "pave_vllm": 60, "probes": 240})


class Skip(Exception):
    """The step cannot run here (no GPU, package missing); carries what did run."""

    def __init__(self, reason: str, details: dict | None = None):
        super().__init__(reason)
        self.details = details or {}


class CheckFailed(Exception):
    """The step ran but its check did not hold."""

    def __init__(self, reason: str, details: dict | None = None):
        super().__init__(reason)
        self.details = details or {}


class CommandFailed(Exception):
    def __init__(self, reason: str, log_tail: str):
        super().__init__(reason)
        self.log_tail = log_tail


# ---------------------------------------------------------------------------
# pure checks (unit-tested on CPU)
# ---------------------------------------------------------------------------

def loss_trend(losses: list[float]) -> dict:
    """Mean of the first and last fifth of the logged losses; falls = last < first."""
    if len(losses) < 2:
        return {"first": None, "last": None, "falls": None, "n": len(losses)}
    k = max(1, len(losses) // 5)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    return {"first": first, "last": last, "falls": last < first, "n": len(losses), "window": k}


def train_flops_per_token(linear_params: int, layers: int, hidden: int, seq_len: float) -> float:
    """Model FLOPs per trained token with LoRA on a frozen base.

    Frozen linear weights cost 2·N forward + 2·N backward (input gradients only;
    LoRA's own weights are negligible); causal attention 2·L·s·d forward and
    twice that backward. Recomputation (activation checkpointing) is not counted.
    """
    return 4.0 * linear_params + 3.0 * 2.0 * layers * seq_len * hidden


def prefill_flops_per_token(linear_params: int, layers: int, hidden: int, seq_len: float) -> float:
    """Forward FLOPs per prompt token: 2·N plus causal attention 2·L·s·d."""
    return 2.0 * linear_params + 2.0 * layers * seq_len * hidden


def utilisation(tokens_per_s: float | None, flops_per_token: float, peak_tflops: float | None) -> float | None:
    if not tokens_per_s or not peak_tflops:
        return None
    return tokens_per_s * flops_per_token / (peak_tflops * 1e12)


def compare_demo(gpu: dict, cpu: dict, tolerance_claims: int = DEMO_TOLERANCE_CLAIMS) -> dict:
    """Per variant and round, |a_r(GPU) - a_r(CPU)| in claims; ok when all are within tolerance.

    ``a_r`` is ``round_accuracy`` (a fraction of the claims) of each variant's
    ``metrics.json`` in the demo's ``summary.json``. Runs of different sizes are
    not comparable.
    """
    out: dict = {"tolerance_claims": tolerance_claims, "variants": {}, "comparable": True, "ok": True}
    for name, ref in cpu["variants"].items():
        got = gpu["variants"].get(name)
        if got is None:
            return {**out, "comparable": False, "ok": False, "reason": f"variant {name!r} missing"}
        n = ref["n_claims"]
        if got["n_claims"] != n or len(got["round_accuracy"]) != len(ref["round_accuracy"]):
            return {**out, "comparable": False, "ok": False,
                    "reason": f"{name}: {got['n_claims']} claims x {len(got['round_accuracy'])} rounds here, "
                              f"{n} x {len(ref['round_accuracy'])} in the CPU result"}
        diffs = [abs(g - c) * n for g, c in zip(got["round_accuracy"], ref["round_accuracy"])]
        ok = all(d <= tolerance_claims + 1e-9 for d in diffs)
        out["variants"][name] = {"cpu": ref["round_accuracy"], "here": got["round_accuracy"],
                                 "diff_claims": [round(d, 3) for d in diffs], "ok": ok}
        out["ok"] = out["ok"] and ok
    return out


def dirk_means(dirk: dict) -> dict[int, float | None]:
    return {int(r["round"]): r["mean"] for r in dirk["rounds"]}


def compare_dirk(a: dict, b: dict, tolerance: float = DIRK_TOLERANCE) -> dict:
    """Largest per-round difference of the DirK means of two ``dirk.json``; ok within tolerance."""
    ma, mb = dirk_means(a), dirk_means(b)
    if set(ma) != set(mb):
        return {"ok": False, "max_abs_diff": None, "reason": f"rounds differ: {sorted(ma)} vs {sorted(mb)}"}
    diffs = []
    for r in sorted(ma):
        if (ma[r] is None) != (mb[r] is None):
            return {"ok": False, "max_abs_diff": None, "reason": f"round {r}: defined on one side only"}
        if ma[r] is not None:
            diffs.append(abs(ma[r] - mb[r]))
    worst = max(diffs) if diffs else 0.0
    return {"ok": worst <= tolerance, "max_abs_diff": worst, "tolerance": tolerance}


def prefill_stats(batches: list[dict]) -> dict:
    """Throughput over the timed generate batches; the first batch (CUDA warm-up) is left out when there are more."""
    steady = batches[1:] if len(batches) > 1 else batches
    secs = sum(b["seconds"] for b in steady)
    tokens = sum(b["tokens"] or 0 for b in steady)
    padded = sum(b["padded_tokens"] or 0 for b in steady)
    return {"batches": len(batches), "batches_timed": len(steady), "prompts": sum(b["prompts"] for b in steady),
            "tokens": tokens, "padded_tokens": padded, "seconds": secs,
            "tokens_per_s": tokens / secs if secs else None,
            "padded_tokens_per_s": padded / secs if secs else None,
            "first_batch_seconds": batches[0]["seconds"] if batches else None}


def render_markdown(result: dict) -> str:
    env = result.get("environment") or {}
    lines = [
        f"# GPU check ({result['mode']})",
        "",
        f"- started {result['started']}, {result['total_seconds']:.0f} s in all (limit {result['time_limit_s']:.0f} s)",
        f"- GPU: {env.get('gpu_name') or 'none'}"
        + (f", {env['gpu_memory_gib']:.0f} GiB" if env.get("gpu_memory_gib") else "")
        + (f"; bf16 dense peak {env['peak_bf16_tflops']} TFLOP/s" if env.get("peak_bf16_tflops") else ""),
        f"- torch {env.get('versions', {}).get('torch')}, CUDA {env.get('cuda_version')}",
        "",
        "| step | status | seconds | result | reason |",
        "|---|---|---:|---|---|",
    ]
    for s in result["steps"]:
        reason = (s.get("reason") or "").replace("|", "/").replace("\n", " ")
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.1f} | {s.get('summary', '')} | {reason} |")
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fmt(x, spec=".3g"):
    return "n/a" if x is None else format(x, spec)


class GpuCheck:
    def __init__(self, args, scale: Scale):
        self.args, self.scale = args, scale
        self.dry = args.dry_run
        self.out = Path(args.output)
        self.work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu_check_"))
        self.data = Path(args.data) if args.data else default_data_dir()
        self.logs = self.work / "logs"
        self.time_limit = args.time_limit or scale.time_limit
        self.t0 = time.time()
        self.steps: list[dict] = []
        self.env_info: dict = {}
        self.cache: dict = {}
        self.step_deadline = float("inf")
        self.n_cmd = 0
        base = dict(os.environ)
        base["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else []))
        base.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
                    HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        if self.dry:
            base["CUDA_VISIBLE_DEVICES"] = ""  # the dry run is the CPU run, also on a GPU machine
        self.env = base

    # -- plumbing -----------------------------------------------------------
    @property
    def cuda(self) -> bool:
        return bool(self.env_info.get("cuda_available"))

    @property
    def peak(self) -> float | None:
        return self.env_info.get("peak_bf16_tflops")

    def remaining(self) -> float:
        return min(self.t0 + self.time_limit, self.step_deadline) - time.time()

    def sh(self, cmd: list[str], tag: str, cwd: Path | None = None) -> str:
        """Run one command under the step's remaining budget; its output goes to a log file."""
        self.n_cmd += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{self.n_cmd:02d}-{tag}.log"
        timeout = self.remaining()
        if timeout <= 1:
            raise CommandFailed(f"no time left in the step's budget for {tag}", "")
        with log.open("w") as fh:
            fh.write("$ " + " ".join(map(str, cmd)) + "\n")
            fh.flush()
            proc = subprocess.Popen([str(c) for c in cmd], stdout=fh, stderr=subprocess.STDOUT, env=self.env,
                                    cwd=str(cwd or REPO), start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # accelerate's workers too
                proc.wait()
                raise CommandFailed(f"{tag}: over its time budget ({timeout:.0f} s left), killed",
                                    _tail(log)) from None
        text = log.read_text(errors="replace")
        if rc != 0:
            raise CommandFailed(f"{tag}: exit code {rc} (log {log.name})", _tail(log))
        return text

    def step(self, name: str, fn) -> dict:
        budget = float(self.scale.budgets[name])
        t0 = time.time()
        self.step_deadline = t0 + budget
        rec = {"name": name, "status": "passed", "budget_s": budget, "reason": None, "details": {}}
        try:
            if self.t0 + self.time_limit - t0 < 5:
                raise Skip(f"the check's time limit ({self.time_limit:.0f} s) was reached before this step")
            rec["details"] = fn() or {}
        except Skip as exc:
            rec.update(status="skipped", reason=str(exc), details=exc.details)
        except CheckFailed as exc:
            rec.update(status="failed", reason=str(exc), details=exc.details)
        except CommandFailed as exc:
            rec.update(status="failed", reason=str(exc), log_tail=exc.log_tail)
        except Exception as exc:  # a broken step must not stop the others
            rec.update(status="failed", reason=f"{type(exc).__name__}: {exc}",
                       log_tail="".join(traceback.format_exc().splitlines(True)[-15:]))
        rec["seconds"] = round(time.time() - t0, 2)
        rec["summary"] = summarize(name, rec)
        self.steps.append(rec)
        print(f"[gpu_check {time.time() - self.t0:6.1f}s] {name}: {rec['status']}"
              + (f" ({rec['reason']})" if rec["reason"] else ""), flush=True)
        self.step_deadline = float("inf")
        return rec

    # -- 1. environment -------------------------------------------------------
    def environment(self) -> dict:
        text = self.sh([sys.executable, "-c", ENV_PROBE, *OPTIONAL_PACKAGES], "environment")
        info = json.loads(text.strip().splitlines()[-1])
        info["peak_bf16_tflops"] = peak_bf16_tflops(info.get("gpu_name"))
        info["python"] = sys.version.split()[0]
        info["platform"] = platform.platform()
        info["dry_run"] = self.dry
        self.env_info = info
        return info

    # -- shared inputs ----------------------------------------------------------
    def memo(self, key, fn):
        if key not in self.cache:
            try:
                self.cache[key] = ("ok", fn())
            except Exception as exc:
                self.cache[key] = ("error", exc)
        kind, value = self.cache[key]
        if kind == "error":
            raise value
        return value

    def scifact_records(self) -> Path:
        def make():
            src = self.data / "scifact"
            claims, corpus = src / "claims_train.jsonl", src / "corpus_cited.jsonl"
            if not corpus.exists():
                corpus = src / "corpus.jsonl"
            for p in (claims, corpus):
                if not p.is_file():
                    raise CheckFailed(f"{p}: not found; pass --data DIR holding scifact/claims_train.jsonl and "
                               "scifact/corpus_cited.jsonl (docs/gpu.md)")
            out = self.work / "scifact.jsonl"
            self.sh([sys.executable, "-m", "data_prep.cli", "convert", "--dataset", "scifact", "--claims", claims,
                     "--corpus", corpus, "--output", out], "real-data-convert")
            return out
        return self.memo("records", make)

    def llama(self, shape: str) -> dict:
        def make():
            out = self.work / f"llama-{shape}"
            self.sh([sys.executable, HELPER, "build-llama", "--shape", shape, "--out", out], f"build-llama-{shape}")
            return {"path": out, **json.loads((out / "shape.json").read_text())}
        return self.memo(("llama", shape), make)

    def pairs(self) -> Path:
        def make():
            model = self.llama(self.scale.train_shape)["path"]
            out = self.work / "pairs"
            self.sh([sys.executable, "-m", "data_prep.cli", "pairs", "--records", self.scifact_records(),
                     "--variant", "no_enhancement", "--output", out, "--tokenizer", model,
                     "--max-length", str(self.scale.max_length), "--seed", "0", "--overwrite"], "real-data-pairs")
            return out
        return self.memo("pairs", make)

    # -- 2. training ----------------------------------------------------------
    def train(self, name: str, config: str) -> dict:
        s = self.scale
        processes = 1
        if config.startswith("deepspeed_zero"):
            stage = config[len("deepspeed_zero")]
            if not self.cuda:
                raise Skip(f"DeepSpeed ZeRO-{stage} needs a CUDA device (none here; on CPU: "
                           "tests/test_distributed.py)")
            ds = self.env_info.get("packages", {}).get("deepspeed", {})
            if not ds.get("importable"):
                raise Skip(f"deepspeed is not importable ({ds.get('error')}); bring its wheel (docs/gpu.md)")
            if stage == "3":  # shards across the GPUs there are (two at most, to stay in budget)
                import torch

                processes = max(1, min(2, torch.cuda.device_count()))
        if not self.cuda and config == "single_gpu.yaml":
            config = "cpu.yaml"  # same launcher and trainer, fp32 on CPU
        model = self.llama(s.train_shape)
        pairs = self.pairs()
        out = self.work / name
        shutil.rmtree(out, ignore_errors=True)
        recipe = {
            "model_name_or_path": str(model["path"]), "dtype": "bfloat16" if self.cuda else "float32",
            "attn_implementation": "sdpa", "dataset_name": str(pairs), "variant": "no_enhancement",
            "output_dir": str(out), "use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
            "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "optim": "adamw_torch",
            "learning_rate": s.train_lr, "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 2,
            "max_steps": s.train_steps, "per_device_train_batch_size": s.train_batch,
            "gradient_accumulation_steps": 1, "max_length": s.max_length, "seed": 0, "data_seed": 0,
            "bf16": self.cuda, "activation_checkpointing": True,
            "activation_checkpointing_kwargs": {"use_reentrant": False}, "ddp_find_unused_parameters": False,
            "dataloader_num_workers": 0, "logging_steps": 1, "save_strategy": "no", "report_to": "none",
        }
        recipe_path = self.work / f"{name}.yaml"
        recipe_path.write_text(json.dumps(recipe, indent=1))  # JSON is YAML
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               REPO / "accelerate_configs" / config, "--num_processes", str(processes),
               "--main_process_port", str(free_port()),
               "-m", "real.train", "--config", recipe_path]
        t0 = time.time()
        self.sh(cmd, name)
        wall = time.time() - t0
        state = json.loads((out / "trainer_state.json").read_text())
        logs = [e for e in state["log_history"] if "loss" in e]
        losses = [float(e["loss"]) for e in logs]
        final = next((e for e in reversed(state["log_history"]) if "train_runtime" in e), {})
        tokens = max((e.get("num_tokens") or 0 for e in state["log_history"]), default=0) or None
        runtime = final.get("train_runtime")
        tps = tokens / runtime if tokens and runtime else None
        seq = tokens / (state["global_step"] * s.train_batch) if tokens and state.get("global_step") else 0.0
        fpt = train_flops_per_token(model["linear_parameters"], model["num_hidden_layers"], model["hidden_size"], seq)
        trend = loss_trend(losses)
        details = {
            "accelerate_config": f"accelerate_configs/{config}", "recipe": recipe, "model": _model_view(model),
            "pairs": json.loads((pairs / "stats.json").read_text()).get("pairs"),
            "steps": state.get("global_step"), "losses": losses, "loss_trend": trend,
            "loss_check_enforced": s.train_steps >= 10,
            "tokens": tokens, "train_runtime_s": runtime, "wall_s": round(wall, 2), "tokens_per_s": tps,
            "mean_tokens_per_sample": seq, "model_flops_per_token": fpt,
            "mfu": utilisation(tps, fpt, self.peak), "peak_bf16_tflops": self.peak,
            "mfu_formula": "tokens/s x (4 N_linear + 6 L s d) / peak (LoRA: no weight gradients for the frozen "
                           "base; recomputation not counted)",
        }
        if config == "deepspeed_zero3.yaml":  # the adapter gathered from the shards, not empty placeholders
            from safetensors.torch import load_file

            tensors = load_file(str(out / "adapter_model.safetensors"))
            details.update(processes=processes, adapter_tensors=len(tensors),
                           empty_adapter_tensors=sorted(k for k, v in tensors.items() if v.numel() == 0))
            if not tensors or details["empty_adapter_tensors"]:
                raise CheckFailed("ZeRO-3 saved an empty adapter (weights not gathered from the shards)", details)
        if state.get("global_step") != s.train_steps:
            raise CheckFailed(f"trained {state.get('global_step')} steps, expected {s.train_steps}", details)
        if details["loss_check_enforced"] and not trend["falls"]:
            raise CheckFailed(f"the loss did not fall ({_fmt(trend['first'])} -> {_fmt(trend['last'])})", details)
        return details

    # -- 3. demo -------------------------------------------------------------
    def demo(self) -> dict:
        out = self.work / "demo"
        if self.scale.reduced_demo:
            code = ("from real.demo.pipeline import DemoSize, run_demo; import sys; "
                    "run_demo(sys.argv[1], DemoSize(n_train=40, n_test=16, max_steps=2, bootstrap=100), seed=0)")
            self.sh([sys.executable, "-c", code, out], "demo-reduced")
        else:
            self.sh([sys.executable, "-c", "from real.demo import main; raise SystemExit(main())",
                     "--output", out], "real-demo")
        self.cache["demo"] = ("ok", out)
        summary = json.loads((out / "summary.json").read_text())
        cpu = json.loads(DEMO_CPU_SUMMARY.read_text())
        comparison = compare_demo(summary, cpu)
        details = {"summary": summary, "cpu_reference": str(DEMO_CPU_SUMMARY.relative_to(REPO)),
                   "cpu_wall_seconds": cpu.get("wall_seconds"), "comparison": comparison,
                   "device": "cuda" if self.cuda else "cpu", "reduced": self.scale.reduced_demo}
        if comparison["comparable"] and not comparison["ok"]:
            raise CheckFailed("a_r differs from the CPU result by more than "
                              f"{DEMO_TOLERANCE_CLAIMS} claims in some round", details)
        if not comparison["comparable"] and not self.scale.reduced_demo:
            raise CheckFailed(f"not comparable with the CPU result: {comparison['reason']}", details)
        return details

    # -- 4. evaluation throughput ------------------------------------------------
    def eval_records(self) -> Path:
        def make():
            model = self.llama(self.scale.eval_shape)
            out = self.work / "eval-records.jsonl"
            n, mean = write_long_prompt_records(self.scifact_records(), model["path"], out,
                                                self.scale.eval_claims, self.scale.prompt_tokens)
            self.cache["eval_prompt_tokens"] = ("ok", mean)
            return out
        return self.memo("eval_records", make)

    def evaluate(self, backend: str) -> dict:
        s = self.scale
        if backend == "vllm":
            if not self.cuda:
                raise Skip("vLLM needs a CUDA device (none here)")
            pkg = self.env_info.get("packages", {}).get("vllm", {})
            if not pkg.get("importable"):
                raise Skip(f"vllm is not importable ({pkg.get('error')})")
        model = self.llama(s.eval_shape)
        records = self.eval_records()
        run_dir = self.work / f"eval-{backend}"
        shutil.rmtree(run_dir, ignore_errors=True)
        timing = self.work / f"eval-{backend}-timing.json"
        argv = ["run", "--records", records, "--output", run_dir, "--backend", backend, "--model", model["path"],
                "--rounds", str(s.rounds), "--max-new-tokens", "1", "--no-progress"]
        if backend == "hf":
            argv += ["--batch-size", str(s.eval_batch), "--dtype", "bfloat16" if self.cuda else "float32"]
        else:
            argv += ["--max-model-len", str(s.max_length + 64), "--gpu-memory-utilization", "0.85"]
        self.sh([sys.executable, HELPER, "fae-run", "--timing", timing, "--", *argv], f"fae-run-{backend}")
        t = json.loads(timing.read_text())
        metrics = json.loads((run_dir / "metrics.json").read_text())
        stats = prefill_stats(t["batches"])
        seq = stats["tokens"] / stats["prompts"] if stats["prompts"] else 0.0
        fpt = prefill_flops_per_token(model["linear_parameters"], model["num_hidden_layers"],
                                      model["hidden_size"], seq)
        details = {
            "backend": backend, "model": _model_view(model), "claims": metrics["n_claims"],
            "rounds": metrics["rounds"], "batch_size": s.eval_batch if backend == "hf" else None,
            "mean_prompt_tokens": self.cache.get("eval_prompt_tokens", (None, None))[1],
            "model_calls": metrics.get("model_calls"), "reused_calls": metrics.get("reused_calls"),
            "fae_run_wall_s": round(t["wall_seconds"], 2), "prefill": stats, "model_flops_per_token": fpt,
            "mfu": utilisation(stats["tokens_per_s"], fpt, self.peak), "peak_bf16_tflops": self.peak,
            "dtype": "bfloat16" if self.cuda else "float32",
            "note": "--max-new-tokens 1: each generate call is one prefill; rounds whose pool did not change "
                    "reuse the previous answer (the random model never cites a line), so they cost no call",
        }
        if metrics["n_claims"] != s.eval_claims or metrics["rounds"] != s.rounds:
            raise CheckFailed(f"fae run wrote {metrics['n_claims']} claims x {metrics['rounds']} rounds, "
                              f"expected {s.eval_claims} x {s.rounds}", details)
        return details

    # -- 5. shards -------------------------------------------------------------
    def shards(self) -> dict:
        """Step 4's evaluation as 2 shards + ``fae merge``, compared with its one-process run."""
        backend = "vllm" if self.cache.get("eval_vllm_ran") else "hf"
        one = self.work / f"eval-{backend}"
        if not (one / "claims.jsonl").is_file():
            raise Skip(f"needs step 4's {backend} run, which did not finish")
        s = self.scale
        config = json.loads((one / "config.json").read_text())
        argv = shlex.split(config["command"])[2:]  # "fae run ...": the one-process run's own options
        out = self.work / f"eval-{backend}-shards"
        shutil.rmtree(out, ignore_errors=True)
        argv[argv.index("--output") + 1] = str(out)
        walls = []
        for i in range(2):
            t0 = time.time()
            self.sh([sys.executable, "-m", "fae.cli", "run", *argv, "--shard", f"{i}/2"], f"fae-shard{i}-{backend}")
            walls.append(round(time.time() - t0, 2))
        self.sh([sys.executable, "-m", "fae.cli", "merge", out], f"fae-merge-{backend}")
        got = [json.loads(x) for x in (out / "claims.jsonl").read_text().splitlines()]
        want = [json.loads(x) for x in (one / "claims.jsonl").read_text().splitlines()]
        pairs = [(rg, rw) for cg, cw in zip(got, want) for rg, rw in zip(cg["rounds"], cw["rounds"])]
        differ = sum(rg["raw_output"] != rw["raw_output"] or rg["pool_ids"] != rw["pool_ids"] for rg, rw in pairs)
        shard_claims = [len(json.loads((out / "shards" / f"{i}-of-2" / "config.json").read_text())["shard"]
                            ["claim_ids"]) for i in range(2)]
        details = {"backend": backend, "claims": len(got), "claims_per_shard": shard_claims,
                   "shard_wall_s": walls, "same_claim_order": [c["id"] for c in got] == [c["id"] for c in want],
                   "rounds_compared": len(pairs), "rounds_differing": differ,
                   "rounds_equal_share": round(1 - differ / len(pairs), 4) if pairs else None}
        if len(got) != s.eval_claims or not details["same_claim_order"]:
            raise CheckFailed(f"the merged run has {len(got)} claims (expected {s.eval_claims} in record order)",
                              details)
        if backend == "hf" and differ:
            raise CheckFailed(f"{differ} rounds differ between 2 shards and one process (hf is deterministic)",
                              details)
        return details

    # -- 6. PAVE on vLLM ---------------------------------------------------------
    def pave_vllm(self) -> dict:
        if not self.cache.get("eval_vllm_ran"):
            raise Skip("needs vLLM on a CUDA device (step eval_vllm did not run)")
        model = self.llama(self.scale.eval_shape)
        out = self.work / "pave-vllm"
        shutil.rmtree(out, ignore_errors=True)
        argv = [sys.executable, "-m", "fae.cli", "pave", "--backend", "vllm", "--model", model["path"],
                "--records", self.eval_records(), "--output", out, "--limit", "8", "--samples", "4",
                "--jsd-samples", "2", "--max-new-tokens", "8", "--max-model-len", str(self.scale.max_length + 64),
                "--gpu-memory-utilization", "0.85", "--no-progress"]
        t0 = time.time()
        self.sh(argv, "pave-vllm")
        wall = round(time.time() - t0, 2)
        samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
        answers = [len(c.get("raw") or []) for line in samples for c in (line.get("conditions") or {}).values()]
        details = {"claims": len(samples), "wall_s": wall, "answers_per_prompt": sorted(set(answers)),
                   "pave_json": (out / "pave.json").is_file()}
        if not samples or not details["pave_json"]:
            raise CheckFailed("fae pave --backend vllm wrote no samples or no pave.json", details)
        return details

    # -- 7. probes ------------------------------------------------------------
    def probes(self) -> dict:
        if "demo" not in self.cache:
            raise Skip("needs the demo step's runs, which it did not produce")
        demo = self.cache["demo"][1]
        base = REPO / "real" / "demo" / "base"
        details: dict = {"tolerance": DIRK_TOLERANCE, "variants": {}}
        ok = True
        for v in ("sft", "real"):
            res: dict = {}
            dirs = {}
            for device in (["cpu", "cuda"] if self.cuda else ["cpu"]):
                out = self.work / f"probe-{v}-{device}"
                shutil.rmtree(out, ignore_errors=True)
                self.sh([sys.executable, "-m", "fae.cli", "probe", demo / "runs" / v, "--model", base,
                         "--adapter", demo / "models" / v, "--output", out, "--device", device,
                         "--dtype", "float32", "--bootstrap", str(self.scale.probe_bootstrap),
                         "--batch-size", "32"], f"probe-{v}-{device}")
                dirs[device] = json.loads((out / "dirk.json").read_text())
                res[f"{device}_means"] = dirk_means(dirs[device])
            demo_probe = json.loads((demo / "probes" / v / "dirk.json").read_text())
            res["demo_probe_vs_cpu_fp32"] = compare_dirk(demo_probe, dirs["cpu"])  # the demo's own (auto dtype)
            if self.cuda:
                res["cuda_vs_cpu"] = compare_dirk(dirs["cuda"], dirs["cpu"])
                ok = ok and res["cuda_vs_cpu"]["ok"]
            details["variants"][v] = res
        if not self.cuda:
            raise Skip("no CUDA device: the CPU probes ran (see details); the CUDA comparison needs a GPU", details)
        if not ok:
            raise CheckFailed(f"DirK on CUDA differs from CPU by more than {DIRK_TOLERANCE}", details)
        return details

    # -- all --------------------------------------------------------------------
    def run(self) -> dict:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.t0))
        env_rec = self.step("environment", self.environment)
        if env_rec["status"] != "passed":  # fall back to asking torch here
            try:
                import torch
                self.env_info = {"cuda_available": torch.cuda.is_available() and not self.dry}
            except Exception:
                self.env_info = {}
        self.step("train_single_gpu", lambda: self.train("train_single_gpu", "single_gpu.yaml"))
        self.step("train_zero2", lambda: self.train("train_zero2", "deepspeed_zero2.yaml"))
        self.step("train_zero3", lambda: self.train("train_zero3", "deepspeed_zero3.yaml"))
        self.step("demo", self.demo)
        self.step("eval_hf", lambda: self.evaluate("hf"))
        vllm = self.step("eval_vllm", lambda: self.evaluate("vllm"))
        self.cache["eval_vllm_ran"] = vllm["status"] == "passed"
        self.step("shards", self.shards)
        self.step("pave_vllm", self.pave_vllm)
        self.step("probes", self.probes)
        result = {
            "format": FORMAT, "mode": "dry-run" if self.dry else "full", "started": started,
            "total_seconds": round(time.time() - self.t0, 2), "time_limit_s": self.time_limit,
            "argv": sys.argv[1:], "scale": asdict(self.scale), "environment": self.env_info,
            "steps": self.steps, "ok": all(s["status"] != "failed" for s in self.steps),
        }
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        (self.out / "gpu_check.md").write_text(render_markdown(result))
        if self.logs.is_dir():
            with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tar:
                tar.add(self.logs, arcname="logs")
        return result


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(True)[-n:])
    except OSError:
        return ""


def _model_view(model: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in model.items() if k != "path"}


def summarize(name: str, rec: dict) -> str:
    """One short cell for the markdown table: the step's headline numbers."""
    d = rec.get("details") or {}
    try:
        if name == "environment":
            return f"{d.get('gpu_name') or 'no GPU'}; torch {d.get('versions', {}).get('torch')}"
        if name.startswith("train") and "losses" in d:
            t = d["loss_trend"]
            return (f"{d['steps']} steps, loss {_fmt(t['first'])} -> {_fmt(t['last'])}, "
                    f"{_fmt(d['tokens_per_s'], '.0f')} tok/s, MFU {_fmt(d['mfu'])}")
        if name == "demo" and "comparison" in d:
            c = d["comparison"]
            worst = max((x for v in c["variants"].values() for x in v["diff_claims"]), default=None)
            return (f"a_r max diff {_fmt(worst)} claims" if c["comparable"]
                    else f"not compared ({c.get('reason')})")
        if name.startswith("eval") and "prefill" in d:
            return f"prefill {_fmt(d['prefill']['tokens_per_s'], '.0f')} tok/s, MFU {_fmt(d['mfu'])}"
        if name == "shards" and "rounds_equal_share" in d:
            return (f"{d['backend']}: 2 shards merged, {d['rounds_equal_share']:.1%} of rounds as one process, "
                    f"shards {d['shard_wall_s']} s")
        if name == "probes" and d.get("variants"):
            diffs = [v["cuda_vs_cpu"]["max_abs_diff"] for v in d["variants"].values() if "cuda_vs_cpu" in v]
            return f"max |DirK cuda - cpu| {_fmt(max(diffs))}" if diffs else "CPU probes only"
    except (KeyError, TypeError, ValueError):
        pass
    return ""


# Runs in a child process: a broken CUDA or package install shows up as data, not a crash.
ENV_PROBE = r"""
import importlib, importlib.metadata, json, sys
info = {"packages": {}, "versions": {}}
for name in sys.argv[1:]:
    try:
        info["versions"][name] = importlib.metadata.version(name)
    except Exception:
        info["versions"][name] = None
    try:
        importlib.import_module(name)
        info["packages"][name] = {"importable": True, "error": None}
    except BaseException as exc:
        info["packages"][name] = {"importable": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
import torch
info["cuda_available"] = torch.cuda.is_available()
info["cuda_version"] = torch.version.cuda
info["gpu_name"] = info["gpu_memory_gib"] = info["gpu_capability"] = info["bf16_supported"] = None
if info["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    info.update(gpu_name=p.name, gpu_memory_gib=p.total_memory / 2**30, gpu_count=torch.cuda.device_count(),
                gpu_capability=f"{p.major}.{p.minor}", bf16_supported=torch.cuda.is_bf16_supported())
print(json.dumps(info))
"""


def write_long_prompt_records(records_path: Path, model_dir: Path, out: Path, n: int, target: int):
    """``n`` real claims whose prompts are brought to about ``target`` tokens.

    A long pool loses its last non-gold sentences; a short one gets other
    records' sentences as distractors (fresh ids), so every prompt ends just at
    or above ``target`` (or above it by gold sentences alone). The prompt is the
    framework's evidence prompt in the model's chat template. Returns (n, mean tokens).
    """
    from transformers import AutoTokenizer

    from data_prep.prompts import encode_chat, render_evidence_prompt
    from data_prep.records import Sentence, load_records, save_records

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    records = load_records(records_path)
    if len(records) < n + 1:
        raise Skip(f"{records_path}: {len(records)} records, need {n + 1}")
    donors = [s for r in records[n:] for s in r.sentences]
    chosen, lengths, k = records[:n], [], 0
    for rec in chosen:
        next_id = max(rec.pool_ids) + 1
        length = len(encode_chat(tok, render_evidence_prompt(rec)))
        gold = set(rec.gold_ids)
        while length > target and any(x.id not in gold for x in rec.sentences):  # trim: last non-gold first
            drop = max(i for i, x in enumerate(rec.sentences) if x.id not in gold)
            del rec.sentences[drop]
            length = len(encode_chat(tok, render_evidence_prompt(rec)))
        while length < target:
            d = donors[k % len(donors)]
            k += 1
            rec.sentences.append(Sentence(next_id, d.text, d.doc))
            next_id += 1
            length = len(encode_chat(tok, render_evidence_prompt(rec)))
        lengths.append(length)
    save_records(chosen, out)
    return len(chosen), sum(lengths) / len(lengths)


def default_data_dir() -> Path:
    """REAL_SHARED_DATA (full copies), else .gpu_data, else the samples shipped with the tests (dry run only)."""
    if os.environ.get("REAL_SHARED_DATA"):
        return Path(os.environ["REAL_SHARED_DATA"])
    local = REPO / ".gpu_data"
    return local if local.is_dir() else REPO / "tests" / "data"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--output", required=True, help="folder for gpu_check.json, gpu_check.md, logs.tar.gz")
    p.add_argument("--data", help="folder with scifact/claims_train.jsonl and scifact/corpus_cited.jsonl "
                                  "(default $REAL_SHARED_DATA, else .gpu_data, else the test samples in tests/data)")
    p.add_argument("--work", help="work folder for models and runs (default: a temporary folder, deleted)")
    p.add_argument("--dry-run", action="store_true", help="CPU, scaled down: exercises every step (CI)")
    p.add_argument("--time-limit", type=float, help="seconds for the whole check (default 470; dry run 1500)")
    p.add_argument("--keep-work", action="store_true", help="keep the work folder")
    args = p.parse_args(argv)
    check = GpuCheck(args, DRY if args.dry_run else FULL)
    try:
        result = check.run()
    finally:
        if not args.work and not args.keep_work:
            shutil.rmtree(check.work, ignore_errors=True)
    print(f"gpu_check: wrote {check.out}/gpu_check.json and gpu_check.md"
          f" ({sum(s['status'] == 'failed' for s in result['steps'])} failed)")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
