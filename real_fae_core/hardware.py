"""What the machine can do fast, read without importing torch: the CPU's native bf16, and the memory
allocator settings under which torch on a CPU stops paying the kernel for every tensor."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Mapping

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpuinfo_field(cpuinfo: str, key: str) -> str:
    """The first ``key : value`` of /proc/cpuinfo ("" where the file or the key is missing)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.split(":", 1)[0].strip() == key), "")


def native_bf16_cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The CPU's native bf16 instruction sets (x86: avx512_bf16, amx_bf16); empty where bf16 is emulated
    (there a bf16 matmul is far slower than fp32) or where /proc/cpuinfo is not there to say."""
    flags = _cpuinfo_field(cpuinfo, "flags").split()
    return [f for f in NATIVE_BF16_FLAGS if f in flags]


def cpu_family(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU family whose floating-point kernels give the same bits (``amd-avx512-bf16``,
    ``intel-amx``, ``intel-avx512``, ...): oneDNN and MKL pick their kernels by vendor and instruction set,
    so two machines of one family train the demo to the same adapters and two of different families
    differ in near ties. ``unknown`` where /proc/cpuinfo cannot say."""
    import platform

    vendor = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(_cpuinfo_field(cpuinfo, "vendor_id"))
    flags = set(_cpuinfo_field(cpuinfo, "flags").split())
    if vendor is None:
        return platform.machine().lower() or "unknown"
    for flag, name in (("amx_tile", "amx"), ("avx512_bf16", "avx512-bf16"), ("avx512f", "avx512"),
                       ("avx2", "avx2")):
        if flag in flags:
            return f"{vendor}-{name}"
    return vendor


def cpu_model_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name as /proc/cpuinfo gives it (benchmarks record it beside every timing), else
    what ``platform.processor()`` says."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    if not name:
        import platform

        name = platform.processor()
    return name


def matmul_peak_gflops(dtype: str = "fp32", n: int = 2048, repeats: int = 10) -> float:
    """This CPU's matmul rate through torch in ``dtype`` (fp32 or bf16; best of ``repeats`` n x n products):
    the ceiling the benchmarks read a model's achieved FLOP/s against (torch imported here, not at import)."""
    import torch

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    a, b = torch.randn(n, n, dtype=torch_dtype), torch.randn(n, n, dtype=torch_dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def memory_read_gbs(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second this machine reads ``nbytes`` (best of ``repeats``, after one untimed pass): a float32
    dot product of two buffers of ``nbytes / 2``, the fastest read of torch's CPU kernels here (a bf16 sum is
    bound by its conversions: 18 GB/s where the dot reads 34). With ``nbytes`` beyond the last-level cache,
    the memory bandwidth; with a model's weight bytes, the rate at which a decoding step could read them
    (partly from the cache where they fit)."""
    import torch

    x, y = torch.ones(max(nbytes // 8, 1)), torch.ones(max(nbytes // 8, 1))
    torch.dot(x, y)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.dot(x, y)
        best = min(best, time.perf_counter() - t)
    return 2 * x.numel() * 4 / best / 1e9


def last_level_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The size of CPU 0's highest-level cache as the kernel reports it (None where it does not)."""
    best = None
    for index in sorted(Path(root).glob("index*")):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        value = int(size.rstrip("KMG")) * scale
        if best is None or level > best[0]:
            best = (level, value)
    return None if best is None else best[1]


# glibc's malloc hands tensors above its mmap threshold straight to the kernel and back, so every training
# step (and every long prompt) faults its activations in page by page: on a 2-core CPU a SmolLM2 LoRA step
# spent as much time in the kernel as in matmuls. Kept in the heap (no mmap, no trimming) and backed by
# transparent huge pages (torch's THP_MEM_ALLOC_ENABLE), the memory is reused: the step is ~1.9x faster
# (benchmarks/results/cpu_train_step_allocator.json). glibc's arenas stay as they are (one per thread):
# squeezed into one (MALLOC_ARENA_MAX=1, what this held before), the threads of a kernel that allocates as it
# runs queue on its lock, and SDPA's backward, a third of a LoRA step, ran 2.4x slower
# (benchmarks/results/allocator_arenas_cpu.json). The price: the process keeps its peak memory until it
# exits. glibc reads these at start-up, so they go into the environment of the process to start
# (``accelerate launch``, ``fae``), not into a running one.
CPU_ALLOCATOR_ENV = {
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": str(4 << 30),
    "MALLOC_TOP_PAD_": str(512 << 20),
    "THP_MEM_ALLOC_ENABLE": "1",
}
OPT_OUT = "REAL_FAE_CPU_ALLOCATOR"  # "system": leave the allocator as the system sets it


def cpu_allocator_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) with :data:`CPU_ALLOCATOR_ENV` added where a variable is unset;
    unchanged when ``REAL_FAE_CPU_ALLOCATOR=system``. For the environment of a process about to start."""
    env = dict(os.environ if environ is None else environ)
    if env.get(OPT_OUT, "").strip().lower() == "system":
        return env
    for key, value in CPU_ALLOCATOR_ENV.items():
        env.setdefault(key, value)
    return env


def main() -> int:
    """``eval "$(python -m real_fae_core.hardware)"``: the allocator settings as shell exports (the ones not
    already set), so a script's torch processes start with them (recipes/smollm2-135m-instruct/reproduce.sh)."""
    import shlex

    env = cpu_allocator_env()
    for key in CPU_ALLOCATOR_ENV:
        if key not in os.environ and key in env:
            print(f"export {key}={shlex.quote(env[key])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
