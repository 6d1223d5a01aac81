"""real-import-gguf's self-check: deterministic on one thread whatever the load, its tolerance from the dtype."""

from __future__ import annotations

import pytest
import torch

from real.gguf_import import VERIFY_THREADS, verify_logits, torch_threads, verify_tolerance


class _ThreadRecorder(torch.nn.Module):
    """A 'model' that records how many intra-op threads its forward pass had."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, input_ids, attention_mask=None):
        self.seen.append(torch.get_num_threads())
        return type("Out", (), {"logits": torch.zeros(1, input_ids.shape[1], 5)})()


class _Tok:
    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return messages[0]["content"]

    def __call__(self, text, return_tensors, add_special_tokens):
        return {"input_ids": torch.tensor([[1, 2, 3]])}


def test_the_check_runs_on_one_thread_and_restores_the_callers():
    before = torch.get_num_threads()  # this process's own (a pytest-xdist worker's share of the cores)
    torch.set_num_threads(2)
    try:
        model = _ThreadRecorder()
        verify_logits(model, _Tok())
        assert model.seen == [VERIFY_THREADS] == [1]
        assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), torch_threads(1):
            raise RuntimeError("a failing block still restores")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_tolerance_is_a_few_ulps_of_the_largest_logit_in_its_dtype():
    ref = torch.tensor([-3.0, 25.0, 1.0])
    assert verify_tolerance(ref, "float32") == pytest.approx(4 * 2 ** -23 * 25)  # 1.2e-5; a fixed 1e-4 hides more
    assert verify_tolerance(ref, "bfloat16") == pytest.approx(4 * 2 ** -7 * 25)
    assert verify_tolerance(torch.tensor([0.01]), "float32") == pytest.approx(4 * 2 ** -23)  # floor at |logit| 1


def test_one_thread_forward_passes_are_bitwise_equal():
    """Two passes of the same weights on one thread: no difference at all, the premise of the tolerance."""
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 4096))
    x = torch.randn(7, 512)
    with torch.no_grad(), torch_threads(1):
        a, b = lin(x), lin(x.clone())
    assert torch.equal(a, b)
