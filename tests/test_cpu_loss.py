"""On a CPU, TRL's fused LM head projects only the labelled positions (real/training/cpu_loss.py):
the same loss, gradients and metrics as TRL's all-positions path, on the real TRL head and in a real
training step through build_trainer."""

from __future__ import annotations


import pytest
import torch

from real.training import cpu_loss


class RowSpy:
    """Wraps TRL's chunked log-prob function and records how many positions each call projects."""

    def __init__(self, monkeypatch):
        import trl.trainer.utils as trl_utils

        self.rows: list[int] = []
        original = trl_utils._ChunkedLogProbFunction.apply

        def apply(hidden, *args):
            self.rows.append(hidden.reshape(-1, hidden.shape[-1]).shape[0])
            return original(hidden, *args)

        monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", apply)


@pytest.fixture
def restore_mode():
    yield
    cpu_loss.score_positions("all")


def _fused_model(path):
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    return model


def _loss_and_grads(model, ids, labels, mode):
    cpu_loss.score_positions(mode)
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def test_labelled_positions_give_the_all_positions_loss_grads_and_metrics(tiny_llama, monkeypatch, restore_mode):
    model = _fused_model(tiny_llama)
    torch.manual_seed(0)
    ids = torch.randint(5, 500, (3, 40))
    labels = torch.full_like(ids, -100)
    labels[0, 30:] = ids[0, 30:]  # answers of different lengths at different places, like padded pairs
    labels[1, 12:20] = ids[1, 12:20]
    labels[2, 35:38] = ids[2, 35:38]
    spy = RowSpy(monkeypatch)

    full, full_grads = _loss_and_grads(model, ids, labels, "all")
    compact, compact_grads = _loss_and_grads(model, ids, labels, "labelled")

    labelled = int((labels[:, 1:] != -100).sum())
    assert spy.rows == [3 * 39, labelled]  # the switch really changes what TRL projects
    torch.testing.assert_close(compact.loss, full.loss, rtol=1e-6, atol=1e-6)
    for field in ("log_probs", "entropy"):
        torch.testing.assert_close(getattr(compact, field), getattr(full, field), rtol=1e-5, atol=1e-5)
    assert torch.equal(compact.is_top1, full.is_top1)
    assert torch.equal(compact.label_mask, full.label_mask)
    assert full_grads.keys() == compact_grads.keys() and full_grads
    for name, grad in full_grads.items():
        torch.testing.assert_close(compact_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_a_batch_without_labels_still_backpropagates_a_zero(tiny_llama, restore_mode):
    model = _fused_model(tiny_llama)
    ids = torch.randint(5, 500, (2, 10))
    out, grads = _loss_and_grads(model, ids, torch.full_like(ids, -100), "labelled")
    assert float(out.loss.detach()) == 0.0
    assert all(float(g.abs().sum()) == 0.0 for g in grads.values())


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="labelled, all"):
        cpu_loss.score_positions("some")


def test_a_switch_replaced_after_ours_is_wrapped_again_and_still_asked_off_cpu(monkeypatch, restore_mode):
    """Another library that wraps `_use_triton` after us must not silently undo the setting; ours goes back
    on top and hands every non-CPU device to theirs."""
    import trl.trainer.utils as trl_utils

    assert cpu_loss.score_positions("labelled")
    asked = []
    theirs = lambda device: asked.append(device.type) or device.type == "meta"  # noqa: E731
    monkeypatch.setattr(trl_utils, "_use_triton", theirs)
    assert cpu_loss.score_positions("labelled")
    assert trl_utils._use_triton is not theirs
    assert trl_utils._use_triton(torch.device("cpu")) is True and asked == []
    assert trl_utils._use_triton(torch.device("meta")) is True and asked == ["meta"]
    cpu_loss.score_positions("all")
    assert trl_utils._use_triton(torch.device("cpu")) is False and asked == ["meta", "cpu"]
