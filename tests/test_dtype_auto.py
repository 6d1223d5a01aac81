"""`--dtype auto` on a CPU: bf16 where the CPU has native bf16 (several times fp32's matmul rate there,
benchmarks/results/fae_throughput_smollm2.json), fp32 where bf16 is emulated; a run made in fp32 before says
how to resume it."""

from __future__ import annotations

import json

import pytest
import torch

from real_fae_core.errors import UserError
from real_fae_core.hardware import native_bf16_cpu_flags
from fae.ablation import runio
from fae.backends import hf


@pytest.mark.parametrize("flags, device, dtype, expected", [
    (["avx512_bf16"], "cpu", "auto", torch.bfloat16),
    (["amx_bf16"], "cpu:0", "auto", torch.bfloat16),
    ([], "cpu", "auto", torch.float32),
    ([], "cuda", "auto", torch.bfloat16),
    (["avx512_bf16"], "cpu", "fp32", torch.float32),
    ([], "cpu", "bf16", torch.bfloat16),
    (["avx512_bf16"], "mps", "auto", torch.float32),
])
def test_auto_follows_the_cpu(monkeypatch, flags, device, dtype, expected):
    monkeypatch.setattr(hf, "native_bf16_cpu_flags", lambda: flags)
    assert hf.resolve_dtype(dtype, device) is expected


def test_the_flags_come_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile\n")
    assert native_bf16_cpu_flags(str(info)) == ["avx512_bf16"]
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2\n")
    assert native_bf16_cpu_flags(str(info)) == []
    assert native_bf16_cpu_flags(str(tmp_path / "missing")) == []


def test_the_recorded_decoding_names_the_dtype_auto_chose(monkeypatch):
    monkeypatch.setattr(hf, "native_bf16_cpu_flags", lambda: ["avx512_bf16"])
    assert hf.HFBackend.decoding_of(hf.HFOptions(device="cpu"))["dtype"] == "bfloat16"
    monkeypatch.setattr(hf, "native_bf16_cpu_flags", lambda: [])
    assert hf.HFBackend.decoding_of(hf.HFOptions(device="cpu"))["dtype"] == "float32"


def test_a_run_made_in_fp32_is_refused_with_how_to_resume_it(tmp_path):
    old = {"claim_set_sha256": "x", "claim_ids": ["a"], "decoding": {"greedy": True, "dtype": "float32"}}
    (tmp_path / runio.CONFIG).write_text(json.dumps(old))
    new = {**old, "decoding": {"greedy": True, "dtype": "bfloat16"}}
    with pytest.raises(UserError, match=r"pass --dtype fp32 to resume this run"):
        runio.check_resume(tmp_path, new)
    assert runio.check_resume(tmp_path, old)["decoding"]["dtype"] == "float32"
