"""Shared fixtures: tiny models with real chat templates, the shared real data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# CI lays shared/ beside the clone; REAL_SHARED_DATA overrides.
SHARED_DATA = Path(os.environ.get("REAL_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared real data not found at {SHARED_DATA} (set REAL_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A random 2-layer Llama with the real Llama-3.1-Instruct chat template."""
    from tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory) -> Path:
    """A random 2-layer Qwen2 with the real Qwen2.5-Instruct chat template."""
    from tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen"), "qwen2")


@pytest.fixture(scope="session")
def noisy_llama(tiny_llama, tmp_path_factory) -> Path:
    """The tiny random Llama with weights x5: greedy answers then take a few tokens and depend on
    the prompt (the unscaled one answers blank lines to everything), so comparing runs means
    something and a run is slow enough to interrupt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("noisy-llama")
    lm = AutoModelForCausalLM.from_pretrained(tiny_llama)
    with torch.no_grad():
        for p in lm.parameters():
            p.mul_(5.0)
    lm.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_llama).save_pretrained(out)
    return out


@pytest.fixture(params=["llama", "qwen2"])
def tiny_model(request, tiny_llama, tiny_qwen) -> Path:
    return tiny_llama if request.param == "llama" else tiny_qwen


def make_record_dict(**overrides) -> dict:
    """A valid record as a dict; tests override fields to break it."""
    rec = {
        "id": "r1",
        "dataset": "toy",
        "claim": "The sky is blue.",
        "label": "SUPPORT",
        "sentences": [
            {"id": 0, "text": "The sky appears blue by day.", "doc": "Sky"},
            {"id": 1, "text": "Grass is green.", "doc": "Grass"},
            {"id": 3, "text": "Rayleigh scattering colours the sky.", "doc": "Sky"},
        ],
        "evidence": [[0], [3]],
    }
    rec.update(overrides)
    return rec


def free_port() -> int:
    """A free TCP port on 127.0.0.1, so parallel `accelerate launch` runs never collide on 29500."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
