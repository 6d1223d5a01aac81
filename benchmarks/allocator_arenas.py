"""glibc's arenas on a CPU: the recipe's LoRA step and one FAE batch under three allocator settings, in one run.

    python benchmarks/allocator_arenas.py --model models/smollm2-135m-instruct \\
        --recipe recipes/smollm2-135m-instruct/sft.yaml --pairs data/pairs/smollm2-135m-instruct/sft \\
        --records data/check-covid-test.jsonl --json benchmarks/results/allocator_arenas_cpu.json

The settings are read when a process starts, so every measurement is a fresh process (one after the
other, on idle cores):

- ``system``: glibc as the system sets it;
- ``one arena``: :data:`real_fae_core.hardware.CPU_ALLOCATOR_ENV` as it was, with ``MALLOC_ARENA_MAX=1``;
- ``arena per thread``: the same without ``MALLOC_ARENA_MAX`` (glibc's default: an arena per thread, up
  to 8 per core), what ``CPU_ALLOCATOR_ENV`` holds now.

With one arena, the threads of a kernel that allocates its scratch memory as it runs (SDPA's CPU backward,
about 30% of a LoRA step) queue on one lock; the probe at the end times that kernel alone under each
setting. Ratios are to ``one arena`` measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from real_fae_core.hardware import CPU_ALLOCATOR_ENV  # noqa: E402

ALLOCATOR_KEYS = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "THP_MEM_ALLOC_ENABLE")
SETTINGS = {
    "system": {},
    "one arena": {**{k: v for k, v in CPU_ALLOCATOR_ENV.items() if k != "MALLOC_ARENA_MAX"}, "MALLOC_ARENA_MAX": "1"},
    "arena per thread": {k: v for k, v in CPU_ALLOCATOR_ENV.items() if k != "MALLOC_ARENA_MAX"},
}

SDPA_PROBE = """
import time, torch
F = torch.nn.functional.scaled_dot_product_attention
B, H, KV, L, D = 8, 9, 3, 350, 64  # SmolLM2's heads at the recipe's batch
q = torch.randn(B, L, H, D, requires_grad=True); k = torch.randn(B, L, KV, D, requires_grad=True)
v = torch.randn(B, L, KV, D, dtype=torch.bfloat16, requires_grad=True)
rep = lambda x: x[:, :, None].expand(B, KV, H // KV, L, D).reshape(B, H, L, D)
def step():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = F(q.transpose(1, 2), rep(k.transpose(1, 2)), rep(v.transpose(1, 2)), is_causal=True)
    o.transpose(1, 2).contiguous().float().sum().backward()
step(); times = []
for _ in range(7):
    t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
print(sorted(times)[3] * 1000)
"""

FAE_PROBE = """
import sys, json
sys.path.insert(0, {bench!r}); sys.path.insert(0, {repo!r})
import profile_cpu
from data_prep.prompts import encode_chat, render_evidence_prompt
from data_prep.records import load_records
from fae.backends.hf import HFBackend
from fae.backends.padding import left_pad
b = HFBackend({{"model": {model!r}, "batch_size": 16, "max_new_tokens": 48, "device": "cpu", "dtype": "bf16",
               "label_probs": False}})
prompts = [render_evidence_prompt(r) for r in load_records({records!r})[:16]]
b.generate(prompts[:2])
print(json.dumps(profile_cpu.fae_split(b, [encode_chat(b.tok, m) for m in prompts], left_pad)))
"""


def clean_env(setting: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_KEYS}
    env["REAL_FAE_CPU_ALLOCATOR"] = "system"  # nothing below adds the settings back on its own
    return {**env, **setting}


def child_peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def run(cmd: list[str], env: dict) -> str:
    p = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd[:3])} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout


def measure(name: str, args) -> dict:
    env = clean_env(SETTINGS[name])
    out = run([sys.executable, "benchmarks/cpu_train_step.py", "--recipe", args.recipe, "--model", args.model,
               "--pairs", args.pairs, "--steps", str(args.steps), "--only", "recipe"], env)
    step = float(re.search(r"median\s+([\d.]+) s/step", out).group(1))
    fae = json.loads(run([sys.executable, "-c", FAE_PROBE.format(bench=str(REPO / "benchmarks"), repo=str(REPO),
                                                                 model=args.model, records=args.records)],
                         env).strip().splitlines()[-1])
    sdpa = float(run([sys.executable, "-c", SDPA_PROBE], env).strip().splitlines()[-1])
    return {"env": SETTINGS[name], "lora_step_s": step, "fae_batch_s": fae["generate_s"],
            "fae_prefill_s": fae["prefill_s"], "fae_decode_step_ms": fae["decode_step_ms"],
            "sdpa_forward_backward_ms": sdpa}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--recipe", required=True)
    p.add_argument("--pairs", required=True)
    p.add_argument("--records", required=True, help="converted Check-COVID records (the FAE batch's prompts)")
    p.add_argument("--steps", type=int, default=3, help="timed LoRA steps per setting (after a warm-up)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    for a in ("model", "recipe", "pairs", "records"):
        setattr(args, a, str(Path(getattr(args, a)).resolve()))
    results = {name: measure(name, args) for name in SETTINGS}
    base = results["one arena"]
    for name, r in results.items():
        r["lora_step_speedup_vs_one_arena"] = base["lora_step_s"] / r["lora_step_s"]
        r["fae_batch_speedup_vs_one_arena"] = base["fae_batch_s"] / r["fae_batch_s"]
        r["sdpa_speedup_vs_one_arena"] = base["sdpa_forward_backward_ms"] / r["sdpa_forward_backward_ms"]
        print(f"{name:17s} LoRA step {r['lora_step_s']:.2f} s ({r['lora_step_speedup_vs_one_arena']:.2f}x), "
              f"FAE batch {r['fae_batch_s']:.2f} s ({r['fae_batch_speedup_vs_one_arena']:.2f}x), SDPA fwd+bwd "
              f"{r['sdpa_forward_backward_ms']:.1f} ms ({r['sdpa_speedup_vs_one_arena']:.2f}x)")
    out = {"how": "benchmarks/allocator_arenas.py: each measurement a fresh process, one after the other",
           "cpu_threads": os.cpu_count(), "settings": results,
           "peak_rss_mib_of_any_child": round(child_peak_rss_mib(), 1),
           "chosen": "arena per thread" if results["arena per thread"]["lora_step_s"] <= base["lora_step_s"]
           else "one arena"}
    print(f"chosen: {out['chosen']}; peak RSS of any measured process {out['peak_rss_mib_of_any_child']:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
