"""Test-only: tiny causal LMs built in code, with the real Llama-3.1 / Qwen2.5 chat templates.

Tests and CPU smoke runs use these instead of hub weights: the loading code
downstream is the same ``from_pretrained`` a user runs on
``meta-llama/Llama-3.1-8B-Instruct``. The chat templates are the upstream
ones that TRL ships (``trl/chat_templates``), so prompt rendering, special
tokens and completion-only loss behave as with the real models.

It lives with the tests so that evaluation's tests need no trainer package:
tests import it as ``tiny_models`` (pytest puts tests/ on ``sys.path``);
benchmarks add tests/ to ``sys.path`` themselves.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Iterable

ARCHS = ("llama", "qwen2")

# Special tokens of the real tokenizers (subset the templates use).
_SPECIALS = {
    "llama": [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
        "<|finetune_right_pad_id|>",
    ],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
}
_TEMPLATE_FILE = {"llama": "llama3_1.jinja", "qwen2": "qwen2_5.jinja"}


def real_chat_template(arch: str) -> str:
    """The upstream chat template text (Llama-3.1-Instruct or Qwen2.5-Instruct)."""
    return resources.files("trl").joinpath("chat_templates", _TEMPLATE_FILE[arch]).read_text()


def _default_corpus() -> list[str]:
    from data_prep.prompts import (
        EVIDENCE_SYSTEM_PROMPT,
        KNOWLEDGE_SYSTEM_PROMPT,
        format_answer,
    )
    from data_prep.records import LABELS

    lines = [EVIDENCE_SYSTEM_PROMPT, KNOWLEDGE_SYSTEM_PROMPT]
    lines += [format_answer(lab, ids) for lab in LABELS for ids in ([], [0], [1, 2], [3, 10, 25])]
    lines += [f"line{i}: " for i in range(64)]
    lines += [
        "Claim: The vaccine reduces the risk of severe disease.",
        "Document:",
        "Cutting Knowledge Date: December 2023 Today Date: 26 Jul 2024",
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        "system user assistant",
        "The study found no significant effect of the treatment in patients with COVID-19.",
        "Results were consistent across trials, cohorts and populations in 2020 and 2021.",
    ]
    return lines


def build_tokenizer(arch: str, corpus: Iterable[str] | None = None, vocab_size: int = 600):
    """A byte-level BPE tokenizer with the real special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")
    specials = _SPECIALS[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus) if corpus is not None else _default_corpus(), trainer)

    if arch == "llama":
        kwargs = dict(
            bos_token="<|begin_of_text|>",
            eos_token="<|eot_id|>",
            pad_token="<|finetune_right_pad_id|>",
        )
    else:
        kwargs = dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)
    hf_tok.chat_template = real_chat_template(arch)
    return hf_tok


def build_tiny_model(
    output_dir: str | Path,
    arch: str = "llama",
    *,
    corpus: Iterable[str] | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vocab_size: int = 600,
    seed: int = 0,
):
    """Build, save (safetensors) and return the path of a random tiny model."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        GenerationConfig,
        LlamaConfig,
        Qwen2Config,
    )

    output_dir = Path(output_dir)
    tok = build_tokenizer(arch, corpus, vocab_size)
    common = dict(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=8192,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    if arch == "llama":
        config = LlamaConfig(bos_token_id=tok.bos_token_id, **common)
        eos_ids = [tok.convert_tokens_to_ids("<|eot_id|>"), tok.convert_tokens_to_ids("<|end_of_text|>")]
    else:
        config = Qwen2Config(**common)
        eos_ids = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tok.pad_token_id, do_sample=False
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    tok.save_pretrained(output_dir)
    return output_dir


def noisy_copy(src: str | Path, out: str | Path, factor: float = 5.0) -> Path:
    """``src`` with every weight times ``factor``: greedy answers then take a few tokens and depend on the
    prompt (the unscaled tiny model answers blank lines to everything), so comparing runs means something."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lm = AutoModelForCausalLM.from_pretrained(src)
    with torch.no_grad():
        for p in lm.parameters():
            p.mul_(factor)
    lm.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return Path(out)
