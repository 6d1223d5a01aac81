"""Sampled answers with per-run label distributions, on top of the FAE backends (for `fae pave`).

The FAE backends decode greedily; PAVE needs N *sampled* answers per prompt
and, for the JSD rule, each run's probability distribution over the labels.

Every prompt comes with a *key* (seed, claim id, condition): its answers are
a function of that key, the model and the prompt only, never of batch size,
chunk size, ``--limit``, record order or where a run was interrupted
(docs/runs.md, "Sampled diagnostics").

- ``hf``: ``HFSampler`` reuses ``fae.backends.hf.load_hf_model`` and samples
  with ``do_sample=True, temperature=T, num_return_sequences=N``, one prompt
  per ``generate`` call with torch's generator seeded from the prompt's key.
  The N rows of a call are the same unpadded prompt, so the tensors a
  prompt's answers come from never depend on which other prompts run: left
  padding in a mixed batch changes attention numerics, and batched sampling
  draws every row from one shared random stream, so a batch of several
  prompts could not give the same answers as the same prompts alone.
  The KV cache reserves the answer's room up front, as the FAE backend's does
  (``fae.backends.hf.answer_cache``: the same tensors, no copy per new token).
  ``generate`` copies the prompt N times before its prefill; the N rows are
  the same, so :func:`one_row_prefill` can compute one and copy its cache and
  logits, 1/N of the prompt's work. It is off unless asked
  (``fae pave --prefill-once``, option ``prefill_once``): its answers are bitwise those of the
  N-row prefill only where a row of a batched matmul equals the row alone,
  which held on an AVX-512 CPU (25 of 25 SmolLM2 samples) but not on an AMX one,
  where oneDNN picks its kernel by the number of rows (66 of 125 texts equal;
  ``benchmarks/results/probe_pave_dtype_cpu_amx.json``); whether its samples are
  the same from one process to the next, as a resume needs, is checked per machine
  by ``benchmarks/pave_reproducibility.py`` (docs/compare.md).
  A run's label distribution is the softmax over the three full label continuations
  ``<prefix>SUPPORT"``, ``<prefix>REFUTE"``, ``<prefix>NOT_ENOUGH_INFO"``
  scored by the model after the prompt, where ``<prefix>`` is the run's own
  text up to the label value (``{"label": "`` when the output has none).
  Scoring whole continuations avoids guessing how a tokenizer splits the
  labels. When every run starts its answer with the same prefix (the FAE
  answer format puts the label first), all runs share one distribution by
  construction; the analysis detects it and uses the vote-based variant.
- ``openai``: ``OpenAISampler`` extends ``fae.backends.openai_backend.OpenAIBackend``
  (same client, key handling, retries and backoff) with ``n``, ``temperature``,
  ``seed`` derived from the prompt's key (honoured where the server honours
  it) and, when asked, ``logprobs``/``top_logprobs``. A run's distribution comes from
  the top log-probabilities at the token where the label value starts (tokens
  that begin exactly one label, renormalised); without logprobs it is None and
  the vote variant is used.
- ``vllm``: ``VLLMSampler`` extends ``fae.backends.vllm_backend.VLLMBackend``
  (same engine, LoRA and chat-template code): a prompt's N answers are one
  request with ``n = N`` and the prompt's own ``seed`` (vLLM draws a seeded
  request from its own generator, whatever else is in the batch), with
  ``logprobs = 5`` for the distributions, read as on the openai backend.
  Untested here (no GPU in CI); ``benchmarks/gpu_check.py`` runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from typing import Any, Callable, Mapping

from real_fae_core.config import options_from
from real_fae_core.errors import UserError
from real_fae_core.hashing import derived_seed
from real_fae_core.labels import LABELS
from data_prep.prompts import encode_chat
from data_prep.schemas import schema_for_prompt
from fae.backends.constrained import max_answer_tokens
from fae.backends.hf import HFOptions, answer_cache, load_hf_model, open_constraint
from fae.backends.label_probs import ANSWER_PREFIX
from fae.backends.openai_backend import MalformedResponse, OpenAIBackend
from fae.backends.vllm_backend import VLLMBackend, constrained_params, vllm_token_list

_LABEL_PREFIX = re.compile(r'"label"\s*:\s*"')
DEFAULT_PREFIX = ANSWER_PREFIX  # the answer format's text before the label value (SPEC §3)

Sample = tuple[str, "list[float] | None"]  # (raw text, label distribution or None)


def label_prefix(text: str) -> str:
    """The run's text up to where the label value starts (default when absent)."""
    m = _LABEL_PREFIX.search(text or "")
    return text[: m.end()] if m else DEFAULT_PREFIX


def softmax(logps: list[float]) -> list[float]:
    """The probabilities of log-probabilities (shifted by their max, so none overflows); they sum to 1."""
    top = max(logps)
    e = [math.exp(x - top) for x in logps]
    z = sum(e)
    return [x / z for x in e]


def distribution_from_top_logprobs(top: list[tuple[str, float]], labels=LABELS) -> list[float] | None:
    """Label distribution from one position's top tokens: a token counts for the one label it begins."""
    mass = [0.0] * len(labels)
    for token, logp in top:
        t = token.strip().strip('"').upper()
        if not t:
            continue
        hits = [i for i, lab in enumerate(labels) if lab.startswith(t) or t.startswith(lab)]
        if len(hits) == 1:
            mass[hits[0]] += math.exp(logp)
    z = sum(mass)
    return [m / z for m in mass] if z > 0 else None


class HFSampler:
    """N sampled answers per prompt and each run's label distribution, with a local transformers model."""

    prefill_once = False  # True: one prefill for a prompt's N samples (faster; equal samples only on some CPUs);
    # option ``prefill_once`` (``fae pave --prefill-once``) sets it per sampler
    logits_to_keep = True  # False: the label distribution projects every position (differences <= 1e-7 in bf16)

    def __init__(self, options: HFOptions | Mapping[str, Any], with_probs: bool = True):
        import torch

        o = options if isinstance(options, HFOptions) else options_from(HFOptions, options, "fae pave")
        if isinstance(options, Mapping) and options.get("prefill_once") is not None:
            self.prefill_once = bool(options["prefill_once"])
        self.lm, self.tok = load_hf_model(o.model, o.adapter, o.dtype, o.device,
                                          trust_remote_code=o.trust_remote_code)
        self.max_new_tokens = o.max_new_tokens
        self.with_probs = with_probs
        self.torch = torch
        gc = self.lm.generation_config
        self.eos = gc.eos_token_id if gc.eos_token_id is not None else self.tok.eos_token_id
        self.constraint = open_constraint(o, self.lm, self.tok, self.eos)  # --constrained-decoding

    def sample(self, prompts: list, n: int, temperature: float, keys: list[tuple],
               callback: Callable[[int], None] | None = None) -> list[list[Sample]]:
        """N answers per prompt; prompt i's answers are a function of ``keys[i]`` (see the module doc)."""
        torch = self.torch
        out: list[list[Sample]] = []
        for messages, key in zip(prompts, keys, strict=True):
            prompt_ids = encode_chat(self.tok, messages)
            x = torch.tensor([prompt_ids], dtype=torch.long)
            extra = {}
            max_new = self.max_new_tokens
            if self.constraint is not None:
                schemas = [schema_for_prompt(messages)] * n
                extra["logits_processor"] = self.constraint.processors(schemas)
                # a cut-off constrained answer is invalid: let the longest admissible one finish
                max_new = max(max_new, max_answer_tokens(schemas))
            torch.manual_seed(derived_seed(*key))  # CPU and every CUDA device: this prompt's own stream
            with torch.inference_mode(), one_row_prefill(self.lm, enabled=self.prefill_once):
                gen = self.lm.generate(**extra, **answer_cache(self.lm, max_new),
                    input_ids=x.to(self.lm.device), attention_mask=torch.ones_like(x).to(self.lm.device),
                    do_sample=True, temperature=temperature, top_p=1.0, top_k=0,
                    num_return_sequences=n, max_new_tokens=max_new,
                    eos_token_id=self.eos, pad_token_id=self.tok.pad_token_id,
                )
            texts = self.tok.batch_decode(gen[:, x.shape[1]:], skip_special_tokens=True)
            cache: dict[str, list[float]] = {}
            samples = []
            for t in texts:
                probs = None
                if self.with_probs:
                    pre = label_prefix(t)
                    if pre not in cache:
                        cache[pre] = self.label_distribution(prompt_ids, pre)
                    probs = cache[pre]
                samples.append((t, probs))
            out.append(samples)
            if callback:
                callback(1)
        return out

    def label_distribution(self, prompt_ids: list[int], prefix: str) -> list[float]:
        """Softmax over log P(prefix + label + '"' | prompt) for the three labels."""
        import torch

        conts = [self.tok.encode(prefix + lab + '"', add_special_tokens=False) for lab in LABELS]
        seqs = [prompt_ids + c for c in conts]
        width = max(map(len, seqs))
        pad = self.tok.pad_token_id
        x = torch.full((len(seqs), width), pad, dtype=torch.long)
        att = torch.zeros_like(x)
        for i, s in enumerate(seqs):  # right padding: positions stay aligned with the prompt
            x[i, :len(s)] = torch.tensor(s)
            att[i, :len(s)] = 1
        p0 = len(prompt_ids)
        # only the positions that predict a continuation token are projected onto the vocabulary: the last
        # prompt token and those after it (the lm_head rows are computed alone either way)
        keep = width - (p0 - 1) if self.logits_to_keep else 0  # 0: every position
        with torch.inference_mode():
            logits = self.lm(input_ids=x.to(self.lm.device), attention_mask=att.to(self.lm.device),
                             logits_to_keep=keep).logits
        first = logits.shape[1] - (width - (p0 - 1))  # where position p0 - 1 sits among the kept ones
        logp = torch.log_softmax(logits[:, first:].float(), dim=-1)
        scores = []
        for i, c in enumerate(conts):
            tgt = torch.tensor(c, device=logp.device)
            scores.append(float(logp[i, :len(c)].gather(1, tgt[:, None]).sum()))
        return softmax(scores)

    def close(self):
        """Drop the model so its memory can be freed; the sampler cannot sample afterwards."""
        self.lm = None


class OpenAISampler(OpenAIBackend):
    """``n`` sampled choices per request (+ logprobs), with the FAE openai backend's retries."""

    def __init__(self, options, with_probs: bool = True):
        super().__init__(options)
        self.want_logprobs = with_probs
        self.n, self.temperature = 1, 1.0
        self._seeds: dict[int, int] = {}

    def sample(self, prompts, n, temperature, keys, callback=None):
        """``n`` answers per prompt at ``temperature``, each prompt's seed derived from ``keys[i]`` (with the
        label distribution where the server returns logprobs): one list of (text, probabilities or None) per prompt."""
        self.n, self.temperature = n, temperature
        # by object identity: two prompts with equal messages still get their own keys' seeds
        self._seeds = {id(m): derived_seed(*k) for m, k in zip(prompts, keys, strict=True)}
        try:
            return asyncio.run(self._generate_all(prompts, callback))
        finally:
            self._seeds = {}

    def request_kwargs(self, messages):
        """The backend's request plus this sampling's ``n``, temperature, prompt seed and (when asked) logprobs."""
        kwargs = super().request_kwargs(messages)
        kwargs.update(n=self.n, temperature=self.temperature, seed=self._seeds[id(messages)])
        if self.want_logprobs:
            kwargs.update(logprobs=True, top_logprobs=5)
        return kwargs

    def parse_response(self, resp):
        """(text, label distribution or None) for each choice; a choice without text is a :class:`MalformedResponse`
        (retried)."""
        choices = getattr(resp, "choices", None)
        if not choices or any(c.message is None or not isinstance(c.message.content, str)
                              for c in choices):
            raise MalformedResponse("response has no choices[*].message.content")
        return [(c.message.content, self._distribution(c)) for c in choices]

    @staticmethod
    def _distribution(choice) -> list[float] | None:
        lp = getattr(choice, "logprobs", None)
        content = getattr(lp, "content", None) if lp is not None else None
        if not content:
            return None
        return distribution_at_label([(t.token, [(x.token, x.logprob) for x in (t.top_logprobs or [])]
                                       or [(t.token, t.logprob)]) for t in content])


def distribution_at_label(tokens: list[tuple[str, list[tuple[str, float]]]]) -> list[float] | None:
    """A run's label distribution from its generated tokens ``(text, top alternatives)``: the alternatives
    of the token that covers the first character of the label value; None when the answer has no label."""
    text = "".join(t for t, _ in tokens)
    m = _LABEL_PREFIX.search(text)
    if not m:
        return None
    pos = 0
    for tok, alts in tokens:
        if pos + len(tok) > m.end():
            return distribution_from_top_logprobs(alts)
        pos += len(tok)
    return None


class VLLMSampler(VLLMBackend):
    """N sampled answers per prompt as one vLLM request (``n = N``, the prompt's own seed)."""

    def __init__(self, options, with_probs: bool = True):
        super().__init__(options)
        self.with_probs = with_probs

    def sample(self, prompts, n, temperature, keys, callback=None):
        """``n`` answers per prompt at ``temperature``, one vLLM request each seeded from ``keys[i]``: one list of
        (text, label distribution or None) per prompt, in order."""
        import vllm

        base = self.params
        params = []
        for messages, key in zip(prompts, keys, strict=True):
            p = vllm.SamplingParams(n=n, temperature=temperature, top_p=1.0, seed=derived_seed(*key),
                                    max_tokens=base.max_tokens, stop_token_ids=base.stop_token_ids,
                                    logprobs=5 if self.with_probs else None)
            params.append(constrained_params(p, messages) if self.constrained else p)
        inputs = [{"prompt_token_ids": encode_chat(self.tok, m)} for m in prompts]
        outs = self.llm.generate(inputs, params, lora_request=self.lora, use_tqdm=False)
        self.stats["prompts"] += len(inputs)
        if callback:
            callback(len(inputs))
        return [[(c.text, distribution_at_label(vllm_token_list(c)) if self.with_probs else None)
                 for c in o.outputs] for o in outs]


SAMPLERS = {"hf": HFSampler, "openai": OpenAISampler, "vllm": VLLMSampler}


@contextlib.contextmanager
def one_row_prefill(lm, enabled: bool = True):
    """Within the block, a ``generate`` whose prompt rows are all the same (``num_return_sequences``) runs its
    prefill on one row and copies the cache and the logits to the others.

    The sampling that follows is untouched: the same random stream, the same N-row decode. Only a prefill
    from an empty cache with identical, unpadded rows is shortened; any other call runs as it would.
    """
    model = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    original = getattr(model, "_prefill", None)
    if not enabled or original is None:
        yield
        return

    def prefill(input_ids, generation_config, model_kwargs, *args, **kwargs):
        n = input_ids.shape[0]
        cache = model_kwargs.get("cache")
        mask = model_kwargs.get("attention_mask")
        if (n < 2 or cache is None or not hasattr(cache, "batch_repeat_interleave") or cache.get_seq_length() != 0
                or (mask is not None and not bool(mask.all())) or not bool((input_ids == input_ids[:1]).all())):
            return original(input_ids, generation_config, model_kwargs, *args, **kwargs)
        one = {k: (v[:1] if hasattr(v, "shape") and v.ndim and v.shape[0] == n else v) for k, v in model_kwargs.items()}
        out = original(input_ids[:1], generation_config, one, *args, **kwargs)
        cache.batch_repeat_interleave(n)  # filled in place by the one-row forward
        out.logits = out.logits.expand(n, *out.logits.shape[1:]).clone()
        return out

    model._prefill = prefill
    try:
        yield
    finally:
        del model._prefill


def make_sampler(backend: str, options: Mapping[str, Any], stability: str = "auto"):
    """The sampler of ``--backend`` (``options``: the command's, each backend keeps its own fields)."""
    with_probs = stability != "vote"  # the vote-based rule needs no label distributions
    if backend not in SAMPLERS:
        raise UserError(f"fae pave supports --backend {', '.join(SAMPLERS)}, not {backend!r}")
    return SAMPLERS[backend](options, with_probs)
