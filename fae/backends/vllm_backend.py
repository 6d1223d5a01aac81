"""Offline vLLM backend (``vllm.LLM``) with an optional LoRA adapter.

vLLM is imported only when this backend is used (``pip install real-fae[vllm]``
on a CUDA machine). Prompts are tokenised with the same chat template code as
the ``hf`` backend and passed as token ids, so both backends see identical
inputs. A LoRA adapter is served unmerged through ``enable_lora`` with
``max_lora_rank`` read from its ``adapter_config.json``; models larger than
one GPU use ``--tensor-parallel-size``.

Soft FAE: ``SamplingParams(logprobs=5)`` returns the top-5 alternatives of
every generated token; the label probabilities are read at the label position
as on the openai backend (:func:`fae.backends.label_probs.label_probs_from_top_logprobs`).
Untested here (no GPU in CI).

Per-prompt decoding (:meth:`VLLMBackend.generate_rows`, the evaluation-choice study of SPEC §10): one
``SamplingParams`` per prompt (:func:`row_params`) with the row's ``seed``, so a sample does not depend on
the batch vLLM schedules it in.
"""

from __future__ import annotations

import json
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Mapping

from real_fae_core.errors import UserError
from data_prep.prompts import encode_chat
from data_prep.schemas import schema_for_prompt
from fae.backends import Backend, BackendOptions, Generation, RowDecoding, register
from fae.backends.constrained import answer_grammar, max_answer_tokens
from fae.backends.label_probs import label_probs_from_top_logprobs

# vLLM accepts these ranks for LoRA; round an adapter's rank up to one of them.
_VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def adapter_rank(adapter: str) -> int:
    """``max_lora_rank`` for vLLM: the adapter's ``r`` rounded up to a supported rank."""
    path = Path(adapter) / "adapter_config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: not found; --adapter must be a PEFT adapter directory") from None
    r = int(cfg.get("r") or 8)
    for cap in _VLLM_LORA_RANKS:
        if r <= cap:
            return cap
    return r


def _import_vllm():
    try:
        import vllm
        from vllm.lora.request import LoRARequest
    except ImportError as exc:
        raise UserError(
            f"the vllm backend needs vLLM on a CUDA machine (pip install 'real-fae[vllm]'): {exc}"
        ) from None
    return vllm, LoRARequest


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (vLLM's offline engine needs one)."""
    import torch

    return torch.cuda.is_available()


VLLM_GROUP = "vllm backend (and --dtype)"  # the section of `fae run --help` of these options


@dataclass
class VLLMOptions(BackendOptions):
    """``--backend vllm``: offline ``vllm.LLM`` (its ``EngineArgs`` of the same names)."""

    dtype: str = field(default="auto", metadata={"help": "auto (bfloat16 on vllm), or a dtype vLLM knows",
                                                 "group": VLLM_GROUP})
    tensor_parallel_size: int = field(default=1, metadata={"help": "vllm: GPUs per model", "min": 1,
                                                           "group": VLLM_GROUP})
    gpu_memory_utilization: float | None = field(default=None, metadata={
        "help": "vllm: share of GPU memory", "above": 0, "max": 1, "group": VLLM_GROUP})
    max_model_len: int | None = field(default=None, metadata={"help": "vllm: context length cap", "min": 1,
                                                              "group": VLLM_GROUP})

    @property
    def vllm_dtype(self) -> str:
        """The dtype handed to vLLM: ``auto`` means bfloat16 (pinned, so a run's records name what it ran in)."""
        return "bfloat16" if self.dtype == "auto" else self.dtype


@register("vllm")
class VLLMBackend(Backend):
    """``--backend vllm``: offline batched generation with ``vllm.LLM``."""

    options_class = VLLMOptions

    def __init__(self, options: VLLMOptions | Mapping[str, Any]):
        super().__init__(options)
        o = self.options
        vllm, LoRARequest = _import_vllm()
        self.max_new_tokens = o.max_new_tokens
        adapter = o.adapter
        kwargs: dict[str, Any] = {"model": o.model, "tensor_parallel_size": o.tensor_parallel_size,
                                  "dtype": o.vllm_dtype, "seed": 0}
        if o.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = o.gpu_memory_utilization
        if o.max_model_len is not None:
            kwargs["max_model_len"] = o.max_model_len
        if adapter:
            kwargs.update(enable_lora=True, max_lora_rank=adapter_rank(adapter))
        self.llm = vllm.LLM(**kwargs)
        self.tok = self.llm.get_tokenizer()
        self.lora = LoRARequest("adapter", 1, str(adapter)) if adapter else None
        stop_ids = _eos_ids(o.model, self.tok)
        self.label_probs = o.label_probs
        self.params = vllm.SamplingParams(temperature=0.0, max_tokens=self.max_new_tokens,
                                          stop_token_ids=stop_ids or None,
                                          logprobs=5 if self.label_probs else None)
        self.stats = {"prompts": 0}
        self.constrained = o.constrained_decoding

    @classmethod
    def check_ready(cls, options: VLLMOptions) -> None:
        """vLLM importable and a CUDA device present: without them the engine fails at load, after a command
        would have written its output folder."""
        _import_vllm()
        if not cuda_available():
            raise UserError("the vllm backend needs vLLM on a CUDA machine: torch sees no CUDA device here "
                            "(use --backend hf, or run on a GPU machine)")

    @classmethod
    def decoding_of(cls, options: VLLMOptions):
        """Greedy, the cap and the dtype vLLM runs in: what a resume must match; no engine started."""
        return {"greedy": True, "max_new_tokens": options.max_new_tokens, "dtype": options.vllm_dtype}

    def generate(self, prompts, callback=None):
        """One answer per prompt, in order, all in one vLLM call (with the LoRA adapter, when given); an answer cut
        off by the cap has reason ``length``."""
        inputs = [{"prompt_token_ids": encode_chat(self.tok, m)} for m in prompts]
        params = ([constrained_params(self.params, m) for m in prompts] if self.constrained
                  else self.params)
        outs = self.llm.generate(inputs, params, lora_request=self.lora, use_tqdm=False)
        self.stats["prompts"] += len(inputs)
        if callback:
            callback(len(inputs))
        # vLLM's CompletionOutput.finish_reason: "length" when max_tokens cut the answer off
        return [self._answer(o.outputs[0]) for o in outs]

    def generate_rows(self, prompts, decodings, callback=None):
        """One answer per prompt, each with its own ``SamplingParams`` (:func:`row_params`): vLLM draws a
        request with a ``seed`` from a generator of its own, whatever else is in the batch. UNTESTED here
        (no vLLM on the CI machines); the parameters are checked with a stand-in."""
        if len(prompts) != len(decodings):
            raise ValueError(f"{len(prompts)} prompts but {len(decodings)} decodings")
        if self.constrained:
            raise UserError("per-prompt decoding does not combine with constrained decoding "
                            "(its grammar is the JSON answer of SPEC §3)")
        vllm, _ = _import_vllm()
        params = [row_params(vllm.SamplingParams, d, self.max_new_tokens, self.params.stop_token_ids)
                  for d in decodings]
        inputs = [{"prompt_token_ids": encode_chat(self.tok, m)} for m in prompts]
        outs = self.llm.generate(inputs, params, lora_request=self.lora, use_tqdm=False)
        self.stats["prompts"] += len(inputs)
        if callback:
            callback(len(inputs))
        return [Generation(o.outputs[0].text, o.outputs[0].finish_reason,
                           decoding=d.settings(d.max_new_tokens or self.max_new_tokens))
                for o, d in zip(outs, decodings)]

    def _answer(self, out) -> Generation:
        if not self.label_probs:
            return Generation(out.text, out.finish_reason)
        probs, logprobs, why = label_probs_from_top_logprobs(vllm_token_list(out))
        return Generation(out.text, out.finish_reason, probs, logprobs, why)


def vllm_token_list(out) -> list[tuple[str, list[tuple[str, float]]]]:
    """(token text, alternatives) per generated token from a CompletionOutput with ``logprobs``."""
    tokens = []
    for tid, alts in zip(out.token_ids, out.logprobs or []):
        chosen = alts.get(tid)
        text = (chosen.decoded_token if chosen is not None else "") or ""
        tokens.append((text, [(a.decoded_token or "", a.logprob) for a in alts.values()]))
    return tokens


def row_params(sampling_params, decoding: RowDecoding, max_new_tokens: int, stop_token_ids):
    """``vllm.SamplingParams`` (passed as ``sampling_params``) for one row: greedy is temperature 0; a
    sampled row gets its ``seed``, temperature, top-p and top-k (-1: off, what every vLLM release
    accepts; newer ones also take 0). No logprobs: they read the JSON answer's label."""
    cap = decoding.max_new_tokens or max_new_tokens
    if decoding.greedy:
        return sampling_params(temperature=0.0, max_tokens=cap, stop_token_ids=stop_token_ids)
    return sampling_params(temperature=decoding.temperature, top_p=decoding.top_p,
                           top_k=decoding.top_k or -1, seed=decoding.seed, max_tokens=cap,
                           stop_token_ids=stop_token_ids)


def constrained_params(base, messages):
    """``base`` with its prompt's answer grammar as vLLM structured output.

    UNTESTED here (no vLLM on the CI machines): vLLM >= 0.10.2 takes
    ``structured_outputs=StructuredOutputsParams(grammar=...)``, older releases
    ``guided_decoding=GuidedDecodingParams(grammar=...)``. The grammar is the
    one the hf backend compiles with xgrammar (vLLM's default engine), so both
    backends admit the same answers (ids ascending and unique, bounded
    whitespace), and ``max_tokens`` is raised to the longest admissible answer
    as the hf backend raises ``max_new_tokens``, so none is cut off.
    """

    schema = schema_for_prompt(messages)
    grammar = answer_grammar(schema)
    params = base.clone()
    params.max_tokens = max(int(base.max_tokens), max_answer_tokens([schema]))
    try:
        from vllm.sampling_params import StructuredOutputsParams

        params.structured_outputs = StructuredOutputsParams(grammar=grammar)
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        params.guided_decoding = GuidedDecodingParams(grammar=grammar)
    return params


def _eos_ids(model: str, tok) -> list[int]:
    """End-of-turn ids from the model's generation_config.json (as the hf backend uses)."""
    ids: list[int] = []
    path = Path(model) / "generation_config.json"
    if path.is_file():
        eos = json.loads(path.read_text()).get("eos_token_id")
        ids = list(eos) if isinstance(eos, list) else ([eos] if eos is not None else [])
    if tok.eos_token_id is not None and tok.eos_token_id not in ids:
        ids.append(tok.eos_token_id)
    return ids
