"""Base model and tokenizer: path checks, LoRA targets from the config alone, pad and end-of-turn tokens."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from real_fae_core.errors import UserError
from real_fae_core.modelref import is_hub_id
from real_fae_core.tied_embeddings import untie_for_modules
from real.training import recipe_checks

logger = logging.getLogger("real.train")

# End-of-turn tokens of common chat templates: generation must stop on them.
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<|endoftext|>")
# Pad tokens to prefer over reusing eos (Llama-3.1 ships a reserved pad token).
PAD_CANDIDATES = ("<|finetune_right_pad_id|>", "<|endoftext|>", "<pad>", "<|pad|>")


def check_model_path(name: str | None) -> str:
    """The base model as given, refused early if it is neither a saved model directory nor a hub id."""
    if not name:
        raise UserError("no base model: set model_name_or_path in the recipe or pass --model_name_or_path")
    p = Path(name).expanduser()
    if p.exists():
        if not p.is_dir():
            raise UserError(f"base model path {name!r} is a file; give the model's directory (with config.json)")
        if not (p / "config.json").is_file():
            raise UserError(f"base model path {name!r} has no config.json, so it is not a saved model")
        return str(p)
    looks_like_path = not is_hub_id(name)
    if looks_like_path or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise UserError(f"base model path {name!r} does not exist")
    return name


def check_target_modules(model_args, training_args) -> None:
    """LoRA targets that select no module stop here, from the config alone (no weights load)."""
    if not model_args.use_peft:
        return
    names = recipe_checks.model_module_names(check_model_path(model_args.model_name_or_path),
                                             revision=model_args.model_revision,
                                             trust_remote_code=training_args.trust_remote_code)
    if names is not None:
        problem = recipe_checks.target_module_problem(model_args.lora_target_modules, names)
        if problem:
            raise UserError(problem)


def end_of_turn_ids(tokenizer) -> list[int]:
    """Ids of the template's end-of-turn tokens (and eos), e.g. <|eot_id|> / <|im_end|>."""
    template = tokenizer.chat_template or ""
    if isinstance(template, dict):
        template = "".join(template.values())
    vocab = tokenizer.get_vocab()
    ids = [vocab[t] for t in END_OF_TURN_TOKENS if t in vocab and t in template]
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return list(dict.fromkeys(ids))


def set_generation_eos(model, tokenizer) -> list[int]:
    """Make generation stop after the answer's end-of-turn token; returns the eos ids."""
    gc = model.generation_config
    current = gc.eos_token_id
    current = [] if current is None else [current] if isinstance(current, int) else list(current)
    eos = list(dict.fromkeys(end_of_turn_ids(tokenizer) + current))
    gc.eos_token_id = eos
    if gc.pad_token_id is None and tokenizer.pad_token_id is not None:
        gc.pad_token_id = tokenizer.pad_token_id
    return eos


def ensure_pad_token(tokenizer) -> str:
    """Set a pad token if missing: a reserved pad-like token, else eos.

    Padding positions never carry loss (labels are -100 outside the
    completion), so reusing eos is safe; a dedicated token is preferred.
    """
    if tokenizer.pad_token is None:
        vocab = tokenizer.get_vocab()
        pick = next((t for t in PAD_CANDIDATES if t in vocab and t != tokenizer.eos_token), None)
        tokenizer.pad_token = pick or tokenizer.eos_token
        logger.warning("tokenizer has no pad token: using %r", tokenizer.pad_token)
    return tokenizer.pad_token


def load_tokenizer(model_args, training_args):
    """The base model's tokenizer; it must have a chat template (the prompts are chats)."""
    from transformers import AutoTokenizer

    name = check_model_path(model_args.model_name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, revision=model_args.model_revision,
                                                  trust_remote_code=training_args.trust_remote_code)
    except OSError as exc:
        raise UserError(f"could not load the tokenizer of {name!r} ({str(exc).splitlines()[0]})") from None
    if not tokenizer.chat_template:
        raise UserError(f"the tokenizer of {name!r} has no chat template; use an instruct model")
    ensure_pad_token(tokenizer)
    return tokenizer


def load_model(model_args, training_args):
    """``AutoModelForCausalLM.from_pretrained`` as TRL's scripts call it; fp32 on CPU."""
    import torch
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM
    from trl import get_quantization_config

    name = check_model_path(model_args.model_name_or_path)
    common = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code)
    dtype = model_args.dtype
    if training_args.use_cpu and dtype in ("bfloat16", "float16"):
        logger.warning("training on CPU: loading the model in float32 instead of %s", dtype)
        dtype = "float32"
    kwargs = dict(common, attn_implementation=model_args.attn_implementation, use_safetensors=True,
                  dtype=dtype if dtype in (None, "auto") else getattr(torch, dtype))
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        # one full copy per process, on its own device (k-bit weights cannot be moved later)
        kwargs.update(quantization_config=quantization_config,
                      device_map={"": PartialState().local_process_index})
    kwargs.update(training_args.model_init_kwargs or {})
    try:
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
    except OSError as exc:
        raise UserError(f"could not load base model {name!r} ({str(exc).splitlines()[0]})") from None
    if model_args.use_peft:  # a LoRA that trains lm_head of a tied base (the demo's): its own copy first
        untie_for_modules(model, model_args.lora_modules_to_save, model_args.lora_target_modules)
    return model

