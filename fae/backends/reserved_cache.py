"""A KV cache that reserves room for the answer once, instead of copying itself at every new token.

transformers' ``DynamicCache`` grows each layer's keys and values with ``torch.cat``: every decoding step
copies the whole cache of every layer to append one position. On a CPU that copy was 13% of an FAE batch
(``benchmarks/results/profile_cpu.txt``: 16 prompts of ~350 tokens, 48 new tokens). :class:`ReservingLayer`
allocates the prompt plus ``reserve`` positions once and writes each new position in place; what it hands
to attention is a view of exactly the filled length, the same shape and values ``torch.cat`` would give,
so attention computes the same numbers (unlike ``StaticCache``, whose attention spans the whole reserved
length behind a mask). Anything that replaces the tensors (``batch_repeat_interleave``, beam reordering)
simply makes the next update allocate again; ``crop`` keeps writing into the same buffer.
"""

from __future__ import annotations

import functools
import inspect


def cache_kwarg(lm) -> str:
    """The name a model's forward (and ``generate``) takes its KV cache under: ``cache`` since transformers
    renamed it in 5.2x, ``past_key_values`` before. A PeftModel's forward takes ``**kwargs``: ask its base."""
    inner = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


def _dynamic_layer_class():
    from transformers.cache_utils import DynamicLayer

    return DynamicLayer


class _Reserving:
    """Mixed into transformers' ``DynamicLayer`` by :func:`reserving_layer_class`."""

    reserve = 0

    def update(self, key_states, value_states, *args, **kwargs):
        if key_states.requires_grad or value_states.requires_grad:  # training: autograd needs torch.cat's copies
            self._k_buf = self._v_buf = None
            return super().update(key_states, value_states, *args, **kwargs)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        old = 0 if self.keys is None or self.keys.numel() == 0 else self.keys.shape[-2]
        new = key_states.shape[-2]
        if not self._writes_in_place(old, new, key_states, value_states):
            k_buf = key_states.new_empty((*key_states.shape[:-2], old + new + self.reserve, key_states.shape[-1]))
            v_buf = value_states.new_empty((*value_states.shape[:-2], old + new + self.reserve,
                                            value_states.shape[-1]))
            if old:
                k_buf[..., :old, :].copy_(self.keys)
                v_buf[..., :old, :].copy_(self.values)
            self._k_buf, self._v_buf = k_buf, v_buf
        self._k_buf[..., old:old + new, :].copy_(key_states)
        self._v_buf[..., old:old + new, :].copy_(value_states)
        self.keys = self._k_buf[..., :old + new, :]
        self.values = self._v_buf[..., :old + new, :]
        return self.keys, self.values

    def _writes_in_place(self, old: int, new: int, key_states, value_states) -> bool:
        """True when the current tensors are a prefix view of our buffers, with room for ``new`` more."""
        k_buf = getattr(self, "_k_buf", None)
        if k_buf is None or old == 0:
            return False
        v_buf = self._v_buf
        return (old + new <= k_buf.shape[-2]
                and self.keys.data_ptr() == k_buf.data_ptr() and self.values.data_ptr() == v_buf.data_ptr()
                and self.keys.stride() == k_buf.stride() and self.values.stride() == v_buf.stride()
                and self.keys.shape[:-2] == key_states.shape[:-2] == k_buf.shape[:-2]
                and k_buf.dtype == key_states.dtype and v_buf.dtype == value_states.dtype)

    def reset(self) -> None:
        self._k_buf = self._v_buf = None
        super().reset()

    def batch_select_indices(self, indices) -> None:
        """Keep the rows ``indices``: the buffers are gathered whole (one copy), so the next positions are still
        written in place."""
        k_buf = getattr(self, "_k_buf", None)
        if k_buf is None or self.keys is None or self.keys.numel() == 0 or self.keys.data_ptr() != k_buf.data_ptr():
            super().batch_select_indices(indices)
            return
        filled = self.keys.shape[-2]
        self._k_buf, self._v_buf = k_buf[indices], self._v_buf[indices]
        self.keys, self.values = self._k_buf[..., :filled, :], self._v_buf[..., :filled, :]

    def adopt(self, k_buf, v_buf, filled: int) -> None:
        """Hold the first ``filled`` positions of the buffers ``k_buf`` and ``v_buf`` (batch, heads, room, dim),
        built by the caller, and write the next positions into their remaining room."""
        if not self.is_initialized:
            self.lazy_initialization(k_buf, v_buf)
        self._k_buf, self._v_buf = k_buf, v_buf
        self.keys, self.values = k_buf[..., :filled, :], v_buf[..., :filled, :]


@functools.cache
def reserving_layer_class():
    """``DynamicLayer`` with :class:`_Reserving`'s update (built on first use: transformers loads lazily)."""
    return type("ReservingLayer", (_Reserving, _dynamic_layer_class()), {})


def reserved_cache(lm, reserve: int):
    """A ``DynamicCache`` for ``lm`` whose plain full-attention layers reserve ``reserve`` positions beyond
    the prompt; other layer kinds (sliding windows, linear attention) stay as transformers builds them.
    None when this transformers has no layer-based ``DynamicCache``."""
    try:
        from transformers.cache_utils import DynamicCache
    except ImportError:
        return None
    cache = DynamicCache(config=lm.config)
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    plain, cls = _dynamic_layer_class(), reserving_layer_class()
    for i, layer in enumerate(layers):
        if type(layer) is plain:
            replacement = cls()
            replacement.reserve = int(reserve)
            layers[i] = replacement
    return cache


def new_cache(lm, reserve: int):
    """A cache for ``lm`` that reserves ``reserve`` positions where it can (:func:`reserved_cache`), else
    transformers' plain ``DynamicCache``."""
    cache = reserved_cache(lm, reserve)
    if cache is None:
        from transformers import DynamicCache

        cache = DynamicCache(config=lm.config)
    return cache
