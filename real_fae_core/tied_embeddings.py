"""A LoRA adapter that trains the output layer (or the input embedding) of a base model whose two share one
weight (``tie_word_embeddings``): the base is untied first.

The adapter keeps its own trained copy of the layer (peft's ``modules_to_save``)
while the base's shared weight stays frozen, so the base's tie is broken the
moment the adapter is attached: merged, the output layer is the trained copy
and the input embedding the original. Attaching such an adapter to a still-tied
base makes peft warn at every load ("Model has `tie_word_embeddings=True` and a
tied layer is part of the adapter", with training and with loading) and untie
it itself at every merge ("Input and output embeddings are no longer tied
after merging"). :func:`untie_for_modules` gives the output layer its own copy
of the shared weight and says so in the config before the adapter is
attached: the same numbers in every forward (the copy is the shared weight, and
the adapter replaces the layer anyway), the same merged model, no warnings.
The demo's base (real/demo/base) ties its embeddings and its recipes train
``lm_head``.

Used where an adapter meets its base: training (real.training.model),
``real-merge`` and the hf backend of ``fae`` (:func:`untie_for_adapter`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path


def _tied(config) -> bool:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(config, "tie_word_embeddings", False) or getattr(text, "tie_word_embeddings", False))


def _names_hit(patterns, names: dict[str, object]) -> bool:
    """Whether peft's ``modules_to_save`` / ``target_modules`` (a list of name suffixes, or a regex over the
    full module name) select one of ``names`` (full module name -> module)."""
    if not patterns:
        return False
    if isinstance(patterns, str):
        if patterns == "all-linear":  # peft never targets the output layer with it
            return False
        return any(re.fullmatch(patterns, full) for full in names)
    return any(full == p or full.endswith("." + p) for p in patterns for full in names)


def untie_for_modules(model, *selections) -> bool:
    """Untie ``model``'s input and output embeddings when one of ``selections`` (the adapter's
    ``modules_to_save``, its ``target_modules``) includes either of them; True when it did. A no-op for an
    untied model, and for weights that are not materialised here (meta tensors, DeepSpeed ZeRO-3
    partitions: peft's warning stays there)."""
    import torch

    config = getattr(model, "config", None)
    if config is None or not _tied(config):
        return False
    try:
        inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return False
    if inp is None or out is None or inp is out:
        return False
    full = {name: m for name, m in model.named_modules() if m is inp or m is out}
    if not any(_names_hit(s, full) for s in selections):
        return False
    weight = inp.weight
    if weight.device.type == "meta" or getattr(weight, "ds_id", None) is not None:
        return False
    if out.weight is weight:
        out.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=weight.requires_grad)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for cfg in (config, text):
        if getattr(cfg, "tie_word_embeddings", False):
            cfg.tie_word_embeddings = False
    tied_keys = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied_keys, dict):
        out_name = next(n for n, m in full.items() if m is out)
        tied_keys.pop(f"{out_name}.weight", None)  # transformers' own tie_weights() must not tie it back
    return True


def adapter_modules(adapter_dir) -> tuple:
    """(``modules_to_save``, ``target_modules``) of the LoRA adapter in ``adapter_dir``; empty when it has no
    readable adapter_config.json."""
    try:
        cfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    if not isinstance(cfg, dict):
        return ()
    return cfg.get("modules_to_save"), cfg.get("target_modules")


def untie_for_adapter(model, adapter_dir) -> bool:
    """:func:`untie_for_modules` for the adapter saved in ``adapter_dir``, before it is attached to ``model``."""
    return untie_for_modules(model, *adapter_modules(adapter_dir))
