"""transformers backend: batched greedy generation with left padding (+ PEFT adapter).

Prompts are rendered with the model's own chat template
(:func:`data_prep.prompts.encode_chat`, no doubled BOS), sorted by length so a
batch pads little, left-padded, and decoded greedily until an end-of-turn id of
the model's ``generation_config``; an answer that fills ``max_new_tokens``
first is reported as cut off (``finish_reason="length"``). bf16 on CUDA and on a CPU with native bf16
(fp32 on a CPU without it, where bf16 matmuls are emulated and far slower). :func:`load_hf_model` is shared
with the probes. :meth:`HFBackend.generate_rows` decodes each prompt its own way (greedy or seeded
sampling, :mod:`fae.backends.seeded`) for the evaluation-choice study; ``generate`` stays greedy.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from real_fae_core.errors import UserError
from real_fae_core.hardware import native_bf16_cpu_flags
from real_fae_core.modelref import is_hub_id
from real_fae_core.tied_embeddings import untie_for_adapter
from data_prep.prompts import encode_chat
from data_prep.schemas import schema_for_prompt
from fae.backends import Backend, BackendOptions, Generation, RowDecoding, register
from fae.backends.constrained import HFConstraint
from fae.backends.decode_step import DECODE_WEIGHTS, decode_step_for
from fae.backends.label_probs import label_continuations, teacher_forced_label_probs
from fae.backends.packed_linear import pack_linear_weights
from fae.backends.padding import finish_reasons, left_pad
from fae.backends.reserved_cache import cache_kwarg, new_cache, reserved_cache
from fae.backends.prefix_tree import decode_rows, generate_shared, processes_logits
from fae.backends.seeded import seeded_kwargs


HF_GROUP = "hf backend"  # the section of `fae run --help` (and of a command that embeds them) of these options


@dataclass
class HFOptions(BackendOptions):
    """``--backend hf``: a local transformers model."""

    batch_size: int = field(default=8, metadata={"help": "hf: prompts per generate call", "min": 1,
                                                 "group": HF_GROUP})
    device: str = field(default="auto", metadata={"help": "hf: auto, cpu, cuda, cuda:1 ...", "group": HF_GROUP})
    dtype: str = field(default="auto", metadata={"help": "hf: auto (bf16 on CUDA and on a CPU with native bf16, else fp32), bf16, fp16, fp32", "group": HF_GROUP})
    weights: str = field(default="model", metadata={
        "help": "hf: the weights decoding steps read: model (as loaded), int8 or int4 (weight-only copies, CPU; "
                "prefill keeps the model's; the answers differ from the model's)",
        "choices": list(DECODE_WEIGHTS), "group": HF_GROUP})
    # --trust-remote-code / --no-trust-remote-code on every command that embeds it (a YAML file may set it)
    trust_remote_code: bool = field(default=False, metadata={
        "help": "hf: run the model repository's own Python code (off unless you ask: it executes on load)",
        "action": argparse.BooleanOptionalAction, "group": HF_GROUP})


def resolve_device(device: str | None = "auto") -> str:
    """``auto`` (or empty/None): ``cuda`` where torch sees a GPU, else ``cpu``; any other device as given."""
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str | None, device: str):
    """``auto``: bf16 on CUDA and on a CPU with native bf16 (avx512_bf16 / amx_bf16), fp32 elsewhere.

    On such a CPU a bf16 matmul runs several times an fp32 one (benchmarks/results/fae_throughput_smollm2.json);
    where bf16 is emulated it is far slower, so there ``auto`` stays fp32. ``--dtype fp32`` keeps fp32."""
    import torch

    if dtype in (None, "", "auto"):
        device = str(device)
        if device.startswith("cuda") or (device.startswith("cpu") and native_bf16_cpu_flags()):
            return torch.bfloat16
        return torch.float32
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
             "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}
    if dtype not in table:
        raise UserError(f"unknown dtype {dtype!r} (expected auto, bf16, fp16 or fp32)")
    return table[dtype]


def _check_exists(kind: str, name: str) -> None:
    """A missing local path is one clear error; a bare ``org/name`` is left to the hub cache."""
    if Path(name).expanduser().exists():
        return
    if not is_hub_id(name):
        raise UserError(f"{kind} path {name!r} does not exist")


def load_hf_model(model: str | Path, adapter: str | Path | None = None, dtype: str | None = "auto",
                  device: str | None = "auto", merge_adapter: bool = True,
                  trust_remote_code: bool = False, pack_weights: bool = True):
    """(model, tokenizer) for batched generation and the probes: eval mode, left padding, pad id set.

    The one loader of ``fae run --backend hf``, ``fae pave`` and the probes, so
    they all see the same weights. The tokenizer comes from the adapter
    directory when it ships one (trainers save it there), else from the base
    model, and must have a chat template. A LoRA adapter is merged into the
    weights for speed (same states as the active adapter, up to rounding)
    unless ``merge_adapter=False``. A bf16 model on a CPU gets its linear weights packed for oneDNN
    (:mod:`fae.backends.packed_linear`: bitwise the same outputs, each linear call about 2x faster, an FAE
    run 1.15x) unless
    ``pack_weights=False``. Bad paths/dtypes raise :class:`UserError`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, adapter = str(model), (str(adapter) if adapter is not None else None)
    _check_exists("model", model)
    if adapter:
        _check_exists("adapter", adapter)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    tok_src = adapter if adapter and (Path(adapter) / "tokenizer_config.json").is_file() else model
    try:
        tok = AutoTokenizer.from_pretrained(tok_src, trust_remote_code=trust_remote_code)
        if getattr(tok, "chat_template", None) is None:
            raise UserError(f"the tokenizer at {tok_src!r} has no chat template")
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype,
                                                  trust_remote_code=trust_remote_code)
        if adapter:
            from peft import PeftModel

            untie_for_adapter(lm, adapter)  # an adapter that trains lm_head of a tied base (the demo's)
            lm = PeftModel.from_pretrained(lm, adapter)
            if merge_adapter:
                lm = lm.merge_and_unload()
    except OSError as exc:  # not a model directory / not in the hub cache
        raise UserError(f"cannot load model {model!r}"
                        + (f" with adapter {adapter!r}" if adapter else "")
                        + f": {str(exc).splitlines()[0]}") from None
    lm.to(device)
    lm.eval()
    if pack_weights and str(device).startswith("cpu"):
        pack_linear_weights(lm)
    return lm, tok


def greedy_config(lm, tok, max_new_tokens: int):
    """The model's generation config made greedy (sampling knobs cleared, eos ids kept)."""
    gc = copy.deepcopy(lm.generation_config)
    gc.do_sample = False
    gc.num_beams = 1
    gc.temperature = None
    gc.top_p = None
    gc.top_k = None
    gc.max_new_tokens = int(max_new_tokens)
    gc.max_length = None
    if gc.eos_token_id is None:
        gc.eos_token_id = tok.eos_token_id
    if gc.pad_token_id is None:
        gc.pad_token_id = tok.pad_token_id
    return gc


def generate_batched(lm, tok, token_ids: list[list[int]], gc, batch_size: int,
                     callback: Callable[[int], None] | None = None,
                     schemas: list | None = None, constraint=None,
                     label_probs: bool = False, sampling: list[RowDecoding] | None = None,
                     step: Callable | None = None) -> list[Generation]:
    """Greedy answers (with their finish reasons) for pre-tokenised prompts, longest first, in input order.

    With ``constraint`` (:class:`fae.backends.constrained.HFConstraint`) each prompt's
    answer is held to its JSON schema in ``schemas`` (one matcher per row), and
    ``max_new_tokens`` is raised where a batch's longest admissible answer needs it
    (:meth:`~fae.backends.constrained.HFConstraint.budget`), so no constrained answer is cut off.
    ``label_probs``: also teacher-force the three labels after the prompt
    (:func:`fae.backends.label_probs.teacher_forced_label_probs`, separate forward
    passes that leave the greedy answers untouched; always the model's own,
    unconstrained distribution).
    ``sampling``: one :class:`~fae.backends.RowDecoding` per prompt; a sampled row draws from its own
    seeded generator (:mod:`fae.backends.seeded`), so its answer does not depend on the batch; greedy rows
    (and every row when ``sampling`` is None) decode greedily, untouched by the sampler.
    ``step``: a decoding step (:func:`fae.backends.decode_step.decode_step_for`); given, greedy unconstrained
    batches decode through it (:func:`decode_greedy`, the same tokens as ``generate``) instead of ``generate``.
    """
    import torch


    order = sorted(range(len(token_ids)), key=lambda i: -len(token_ids[i]))
    out: list[Generation] = [Generation("")] * len(token_ids)
    device = lm.device
    if label_probs:  # keep generate's KV cache: its prompt part is reused for the label probabilities
        gc = copy.copy(gc)
        gc.return_dict_in_generate = True
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        ids, mask = left_pad([token_ids[i] for i in idx], gc.pad_token_id)
        extra = constrained_kwargs(constraint, schemas, idx)
        constrained = bool(extra)
        batch_gc = constraint.budget(gc, [schemas[i] for i in idx]) if constrained else gc
        extra = seeded_kwargs(extra, [sampling[i] for i in idx] if sampling else None)
        if step is not None and not extra and not processes_logits(batch_gc):
            texts, reasons, cache = decode_greedy(lm, tok, step, ids.to(device), mask.to(device), gc, label_probs)
        else:
            texts, reasons, cache = generate_answers(lm, tok, ids, mask, batch_gc, extra, label_probs)
        if constrained:
            constraint.done()
        soft = (teacher_forced_label_probs(lm, tok, [token_ids[i] for i in idx], gc.pad_token_id, cache)
                if label_probs else [(None, None)] * len(idx))
        for i, t, why, (probs, logprobs) in zip(idx, texts, reasons, soft):
            out[i] = Generation(t, why, probs, logprobs)
        if callback:
            callback(len(idx))
    return out


def generate_answers(lm, tok, ids, mask, gc, extra: dict, label_probs: bool):
    """One batch through ``generate``: (texts, finish reasons, the prompt's KV cache or None). With
    ``label_probs`` the cache of ``generate`` is cut back to the prompt for the label probabilities."""
    import torch

    device = lm.device
    with torch.inference_mode():
        gen = lm.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=gc, **extra,
                          **answer_cache(lm, gc.max_new_tokens))
    cache = None
    if label_probs:
        cache = getattr(gen, "cache", None) or getattr(gen, "past_key_values", None)
        gen = gen.sequences
        cache = prompt_cache(cache, ids.shape[1])
    new = gen[:, ids.shape[1]:]
    return tok.batch_decode(new, skip_special_tokens=True), finish_reasons(new, gc.eos_token_id, gc.max_new_tokens), cache


def prompt_cache(cache, prompt_width: int):
    """``cache`` cut back to the first ``prompt_width`` positions (rows left-padded: prompts end together);
    None for a cache type that cannot be cut back (the label probabilities then run the prompt again)."""
    if not hasattr(cache, "crop") or not hasattr(cache, "batch_repeat_interleave"):
        return None
    n_answer = cache.get_seq_length() - prompt_width
    if n_answer > 0:
        cache.crop(-n_answer)  # drop the answer tokens, keep the prompt
    return cache


def decode_greedy(lm, tok, step, ids, mask, gc, label_probs: bool):
    """One batch greedily as ``generate`` decodes it, the steps through ``step``: the prompt's prefill (its
    positions counted from each row's first real token, as ``generate`` counts them) gives the first token,
    :func:`fae.backends.prefix_tree.decode_rows` the rest. Finished rows leave the batch unless the
    prompt's cache is kept for the label probabilities. (texts, finish reasons, the prompt's cache or None)."""
    import torch

    cache = new_cache(lm, gc.max_new_tokens)
    positions = (mask.long().cumsum(-1) - 1).masked_fill_(mask == 0, 1)
    with torch.inference_mode():
        first = lm(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                   **{cache_kwarg(lm): cache}).logits[:, -1, :].float()
    greedy = [RowDecoding()] * ids.shape[0]
    answers = decode_rows(step, cache, ids, mask, greedy, gc.max_new_tokens, gc.eos_token_id, first_logits=first,
                          compact=not label_probs, gqa_kernel=False)
    texts = [tok.decode(tokens, skip_special_tokens=True) for tokens, _ in answers]
    return texts, [why for _, why in answers], prompt_cache(cache, ids.shape[1]) if label_probs else None


RESERVE_CACHE = True  # False: transformers' own DynamicCache (the same answers, one cache copy per new token)


def answer_cache(lm, max_new_tokens: int) -> dict:
    """``generate`` kwargs giving it a KV cache with room for the answer reserved up front
    (:func:`fae.backends.reserved_cache.reserved_cache`); none where that cache cannot be built."""
    if not RESERVE_CACHE:
        return {}
    cache = reserved_cache(lm, max_new_tokens)
    return {} if cache is None else {cache_kwarg(lm): cache}


def constrained_kwargs(constraint, schemas: list | None, idx: list[int]) -> dict:
    """``generate`` kwargs holding the rows ``idx`` to their schemas (none when unconstrained)."""
    if constraint is None:
        return {}
    return {"logits_processor": constraint.processors([schemas[i] for i in idx])}


def open_constraint(options: BackendOptions, lm, tok, eos_ids):
    """The xgrammar constraint when ``constrained_decoding`` is on (else None); see fae/backends/constrained.py."""
    if not options.constrained_decoding:
        return None
    return HFConstraint(lm, tok, eos_ids)


@register("hf")
class HFBackend(Backend):
    """``--backend hf``: local transformers model, optionally with a PEFT adapter."""

    options_class = HFOptions

    def __init__(self, options: HFOptions | Mapping[str, Any], loaded: tuple | None = None):
        """``loaded``: a (model, tokenizer) already in memory (a model being trained, evaluated at a
        checkpoint save) instead of ``options.model``; the caller sets its eval/train mode."""
        super().__init__(options)
        o = self.options
        self.batch_size, self.max_new_tokens = o.batch_size, o.max_new_tokens
        self.lm, self.tok = loaded if loaded is not None else load_hf_model(o.model, o.adapter, o.dtype, o.device,
                                                                                 trust_remote_code=o.trust_remote_code)
        self.gc = greedy_config(self.lm, self.tok, self.max_new_tokens)
        # the lean step is checked against transformers on CPUs; elsewhere batches decode through generate
        self.step = decode_step_for(self.lm, o.weights) if self.lm.device.type == "cpu" or o.weights != "model" \
            else None
        self.stats = {"generate_calls": 0, "prompts": 0}
        self.constraint = open_constraint(o, self.lm, self.tok, self.gc.eos_token_id)
        self.label_probs = o.label_probs
        if self.label_probs:
            try:
                label_continuations(self.tok)
            except ValueError as exc:  # e.g. a word-level tokenizer without the label words
                self.label_probs = False
                self.stats["label_probs_skipped"] = str(exc)

    def generate(self, prompts, callback=None):
        """One answer per prompt, greedy, in batches of ``batch_size``; with constrained decoding each answer
        is kept inside its prompt's schema and the constraint's counters join ``stats``."""
        ids = [encode_chat(self.tok, m) for m in prompts]
        self.stats["generate_calls"] += (len(ids) + self.batch_size - 1) // self.batch_size
        self.stats["prompts"] += len(ids)
        if self.constraint is None:  # no schemas, no constraint arguments (wrappers such as gpu_check call it so)
            return generate_batched(self.lm, self.tok, ids, self.gc, self.batch_size, callback,
                                    label_probs=self.label_probs, step=self.step)
        out = generate_batched(self.lm, self.tok, ids, self.gc, self.batch_size, callback,
                               schemas=[schema_for_prompt(m) for m in prompts], constraint=self.constraint,
                               label_probs=self.label_probs)
        self.stats.update(self.constraint.stats_snapshot())
        return out

    def generate_rows(self, prompts, decodings, callback=None):
        """One answer per prompt, decoded as its :class:`~fae.backends.RowDecoding` says, greedy or from the
        row's own seed (a sample depends on its seed, not on the rows beside it).

        The prompts' shared prefixes are read once (:func:`fae.backends.prefix_tree.generate_shared`): the
        study's replicates, formats and budgets of a unit share most of their tokens. Greedy rows decode as
        ``generate`` would at their cap. No label probabilities (they read the JSON answer's label) and no
        constrained decoding (its grammar is the JSON answer's).
        """
        if len(prompts) != len(decodings):
            raise ValueError(f"{len(prompts)} prompts but {len(decodings)} decodings")
        if self.constraint is not None:
            raise UserError("per-prompt decoding does not combine with constrained decoding "
                            "(its grammar is the JSON answer of SPEC §3)")
        ids = [encode_chat(self.tok, m) for m in prompts]
        caps = [d.max_new_tokens or self.max_new_tokens for d in decodings]
        answers, counts = generate_shared(self.lm, self.tok, ids, decodings,
                                          lambda cap: greedy_config(self.lm, self.tok, cap), self.max_new_tokens,
                                          callback, step=self.step)
        for key, value in counts.items():
            self.stats[key] = self.stats.get(key, 0) + value
        self.stats["generate_calls"] += counts["leaves"]
        self.stats["prompts"] += len(prompts)
        return [replace(a, decoding=d.settings(cap)) for a, d, cap in zip(answers, decodings, caps)]

    @classmethod
    def decoding_of(cls, options: HFOptions):
        """Greedy, the cap, the resolved dtype (and the weights, when not the model's): what a resume must match."""
        dtype = resolve_dtype(options.dtype, resolve_device(options.device))
        decoding = {"greedy": True, "max_new_tokens": options.max_new_tokens, "dtype": str(dtype).replace("torch.", "")}
        if options.weights != "model":  # only then: runs decoded with the model's weights keep their record
            decoding["weights"] = options.weights
        return decoding

    @classmethod
    def default_chunk_size(cls, options: HFOptions) -> int:
        """One batch (``batch_size`` claims) in flight, so a kill costs at most one batch."""
        return options.batch_size
