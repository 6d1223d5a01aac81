"""bf16 linear layers on a CPU with their weights laid out for oneDNN once, not at every call.

A bf16 ``F.linear`` on a CPU goes through oneDNN, which reorders the weight into its blocked layout
(AMX / avx512_bf16 tiles) on every call. Decoding calls each of a model's linear layers once per new
token at a handful of rows, so the reorder, not the arithmetic, is most of the call: SmolLM2's
576 -> 1536 projection took 62 us at 16 rows, 28 us with the weight reordered beforehand, and an FAE
run 1.15x faster with the same tokens (``benchmarks/results/fae_cpu_savings.json``). The reordered
weight is what ``torch.compile``'s CPU freezing pass builds (``torch.ops.mkldnn._reorder_linear_weight``
and ``_linear_pointwise``); here it is done eagerly, at load time, for inference only.

The same oneDNN kernel computes both ways, so outputs are bitwise equal; :func:`pack_linear_weights`
checks that for every layer on a probe input and leaves a layer that differs as it was. The dense
weight stays in place (code that reads ``.weight`` and tied embeddings are untouched), so the linear
layers' memory doubles: ``REAL_FAE_CPU_PACKED_LINEAR=0`` turns the packing off.
"""

from __future__ import annotations

import functools
import os
import types

OPT_OUT_ENV = "REAL_FAE_CPU_PACKED_LINEAR"  # "0": leave every linear layer as it is


def packing_available() -> bool:
    """True where torch can reorder a bf16 linear weight for oneDNN ahead of time (a CPU build with mkldnn)."""
    import torch

    if os.environ.get(OPT_OUT_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight  # noqa: B018  (resolved lazily: raises if absent)
        torch.ops.mkldnn._linear_pointwise  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return _cpu_reorders_bf16()


@functools.lru_cache(maxsize=1)
def _cpu_reorders_bf16() -> bool:
    """Whether oneDNN reorders a bf16 weight on this CPU: it needs avx_ne_convert or AVX-512 (bw, vl, dq) and
    raises elsewhere (an AVX2-only EPYC, say), where bf16 layers keep plain ``F.linear``. Probed once."""
    import torch

    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), 1)
    except RuntimeError:
        return False
    return True


def packed_linear(x, reordered, bias):
    """``F.linear(x, weight, bias)`` with the weight already reordered by ``_reorder_linear_weight``."""
    import torch

    return torch.ops.mkldnn._linear_pointwise(x, reordered, bias, "none", [], "")


def _packed_forward(self, x):
    return packed_linear(x, self._packed_weight, self.bias)


def packed_weight_of(module):
    """The weight :func:`pack_linear_weights` reordered for ``module`` (None where it left the layer as it was)."""
    return module.__dict__.get("_packed_weight")


def pack_linear_weights(model, rows_hint: int = 16) -> int:
    """Give every bf16 ``nn.Linear`` of ``model`` (on the CPU) a reordered copy of its weight and a forward
    that uses it; return how many layers were packed. A layer whose packed output is not bitwise equal to
    ``F.linear``'s on a probe input keeps its own forward. Inference only: the packed path has no gradient."""
    import torch

    if not packing_available():
        return 0
    packed = 0
    probe = {}
    with torch.inference_mode():
        for module in model.modules():
            if type(module) is not torch.nn.Linear or "_packed_weight" in module.__dict__:
                continue
            weight = module.weight
            if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
                continue
            try:
                reordered = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows_hint)
            except RuntimeError:
                continue
            x = probe.setdefault(weight.shape[1], torch.randn(3, weight.shape[1], dtype=torch.bfloat16))
            expected = torch.nn.functional.linear(x, weight, module.bias)
            got = packed_linear(x, reordered, module.bias)
            if not torch.equal(expected, got):
                continue
            module._packed_weight = reordered
            module.forward = types.MethodType(_packed_forward, module)
            packed += 1
    return packed
