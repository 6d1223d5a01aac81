"""On a CPU, TRL's fused LM head scores only the positions that carry a label.

TRL's ``SFTTrainer`` computes the loss with a fused LM head (``trl.trainer.utils.add_fused_lm_head``):
hidden states -> vocabulary projection -> log-probability of each label, in tiles, without building the
logits. On CUDA/XPU it projects only the positions whose label is not -100; on every other device it
projects *all* of them and masks the result, so that compilers such as Neuron's see one tile shape per
batch. An eager CPU run compiles nothing, and a verifier pair's answer is about 25 of its ~600 tokens:
scoring every position spends about a third of a LoRA step (SmolLM2's 49,152-token vocabulary, in fp32
on the CPU path) on numbers that are then multiplied by zero.

``score_positions("labelled")`` makes TRL take its own compact path on CPU devices: the same loss, the
same ``entropy`` / ``mean_token_accuracy`` metrics (up to float summation order), about a third less
work per step (``benchmarks/results/cpu_train_step.json``). ``"all"`` restores TRL's behaviour. GPUs
are untouched either way. The switch is process-wide, like the function it wraps; a TRL whose fused
head does not read ``_use_triton`` is left alone with a warning.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("real.train")

CHOICES = ("labelled", "all")
_state = {"mode": "all", "original": None}


def _compact_on_cpu(device) -> bool:
    original = _state["original"]
    if getattr(device, "type", None) == "cpu" and _state["mode"] == "labelled":
        return True
    return bool(original(device))


def score_positions(mode: str) -> bool:
    """Set which positions the fused LM head scores on a CPU; True when TRL's head follows the setting."""
    if mode not in CHOICES:
        raise ValueError(f"cpu_scored_positions must be one of {', '.join(CHOICES)}, got {mode!r}")
    import trl.trainer.utils as trl_utils

    current = getattr(trl_utils, "_use_triton", None)
    if current is None or not hasattr(trl_utils, "add_fused_lm_head"):
        if mode == "labelled":
            logger.warning("cpu_scored_positions: this TRL's fused LM head has no `_use_triton` switch; it scores "
                           "positions its own way (the loss is unchanged)")
        return False
    if current is not _compact_on_cpu:  # the first call (or another wrapper since): ours goes on top
        _state["original"] = current
        trl_utils._use_triton = _compact_on_cpu
    _state["mode"] = mode
    return True
