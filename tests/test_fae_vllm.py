"""The vllm backend: a real run needs CUDA and vLLM; without them the error must be clear."""

import importlib.util
import json

import pytest

from real_fae_core.errors import UserError
from fae.backends import available, get_backend
from fae.backends.vllm_backend import adapter_rank

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _has_cuda():
    import torch

    return torch.cuda.is_available()


def test_registry_lists_backends_and_rejects_unknown():
    assert {"hf", "openai", "vllm"} <= set(available())
    with pytest.raises(UserError, match="unknown backend 'tgi'"):
        get_backend("tgi")


def test_max_lora_rank_is_read_from_the_adapter(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 12}))
    assert adapter_rank(str(tmp_path)) == 16
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 64}))
    assert adapter_rank(str(tmp_path)) == 64
    with pytest.raises(UserError, match="adapter_config.json"):
        adapter_rank(str(tmp_path / "missing"))


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_without_vllm_the_backend_says_how_to_install_it():
    with pytest.raises(UserError, match=r"pip install 'real-fae\[vllm\]'"):
        get_backend("vllm")({"model": "m"})


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_VLLM and _has_cuda()), reason="needs vLLM and a CUDA GPU")
def test_vllm_matches_hf_greedy_answers(tiny_llama, tmp_path):
    from helpers import make_record_dict

    from data_prep.prompts import render_evidence_prompt
    from data_prep.records import ClaimRecord
    from fae.backends.hf import HFBackend

    rec = ClaimRecord.from_dict(make_record_dict())
    prompts = [render_evidence_prompt(rec), render_evidence_prompt(rec, [0, 1])]
    opts = {"model": str(tiny_llama), "max_new_tokens": 16, "dtype": "float32"}
    v = get_backend("vllm")(opts).generate(prompts)
    h = HFBackend({**opts, "dtype": "fp32", "device": "cuda", "batch_size": 1}).generate(prompts)
    assert v == h
