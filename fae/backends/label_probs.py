"""Soft FAE, part 1: the probability a verifier gives each label at the label position of its answer.

The answer format puts the label first (``{"label": "SUPPORT", ...}``), so the
label value starts right after :data:`ANSWER_PREFIX`. Two ways to read it:

* teacher forcing (``hf``): ``log P(label) = Σ log p(token | prompt, prefix,
  earlier label tokens)`` over the FULL token sequence of the label plus the
  token that closes it (the closing quote, so a label is not credited with a
  longer word it starts), then normalised over the three labels
  (:func:`label_continuations`, :func:`teacher_forced_label_probs`);
* the generation's own token logprobs (``openai``, ``vllm``): walk the
  returned tokens to the one where the label value starts and read the
  top-k alternatives there (:func:`label_probs_from_top_logprobs`); only the
  first label token is scored, which separates the three labels because their
  first tokens differ.

Both give ``(probs, logprobs)``: ``probs`` normalised over the labels,
``logprobs`` the unnormalised log-probabilities (None where a label was not
among the top-k alternatives).
"""

from __future__ import annotations

import inspect
import json
import math
import re
from typing import Any, Sequence

from real_fae_core.labels import LABELS
from fae.backends.padding import left_pad
from fae.backends.reserved_cache import cache_kwarg

ANSWER_PREFIX = '{"label": "'
_LABEL_START = re.compile(r'"label"\s*:\s*"')


def normalise(logprobs: dict[str, float | None]) -> dict[str, float] | None:
    """Softmax over the labels that have a log-probability (missing ones get 0); None when none has one."""
    have = {k: v for k, v in logprobs.items() if v is not None and math.isfinite(v)}
    if not have:
        return None
    top = max(have.values())
    z = sum(math.exp(v - top) for v in have.values())
    return {k: (math.exp(have[k] - top) / z if k in have else 0.0) for k in LABELS}


# ---------------------------------------------------------------------------
# teacher forcing (hf)
# ---------------------------------------------------------------------------


def answer_text(label: str) -> str:
    """The answer the prompts ask for (SPEC §3), with no evidence: only the label differs between labels."""
    return json.dumps({"label": label, "evidence": []})


def label_continuations(tok) -> tuple[list[int], list[list[int]]]:
    """(shared answer-prefix ids, per-label continuation ids) to teacher-force.

    The three answers ``{"label": "<l>", "evidence": []}`` are tokenised as
    whole strings (as the model would produce them) and cut where their token
    sequences first differ and where they join again: the shared head is
    context; scored are the label's own tokens plus the first shared token
    after them (with BPE tokenizers the closing quote, so a label is not
    credited with the mass of a longer word it is a prefix of). This also
    handles tokenizers that merge the quotes into the label's tokens (a
    word-level tokenizer has ``"SUPPORT",`` as one token). A tokenizer that
    gives two labels the same tokens cannot tell them apart:
    :class:`ValueError`.
    """
    seqs = [tok.encode(answer_text(lab), add_special_tokens=False) for lab in LABELS]
    n = 0
    while all(len(s) > n for s in seqs) and len({s[n] for s in seqs}) == 1:
        n += 1
    m = 0
    while all(len(s) - m > n for s in seqs) and len({s[len(s) - 1 - m] for s in seqs}) == 1:
        m += 1
    conts = [s[n:len(s) - max(m - 1, 0)] for s in seqs]
    if len({tuple(s[n:len(s) - m]) for s in seqs}) < len(LABELS):
        raise ValueError("the tokenizer gives two labels the same tokens")
    return seqs[0][:n], conts


def teacher_forced_label_probs(lm, tok, prompt_ids: Sequence[Sequence[int]], pad_id: int, cache=None):
    """``(probs, logprobs)`` per prompt, batched, reusing the prompts' KV cache.

    ``cache``: the KV cache of exactly these prompts left-padded by
    :func:`fae.backends.padding.left_pad` — :func:`fae.backends.hf.generate_batched`
    passes the one its ``generate`` call built, cropped to the prompt, so the
    prompt is not run again; without it one prompt pass builds it. Then one
    pass runs the shared answer head (``{"label": "``) on top, the cache is
    repeated 3x, and one pass runs the three label continuations
    (right-padded). Positions are counted from each row's first real token, as
    ``generate`` does. Log-softmax in fp32.
    """
    import torch

    shared, conts = label_continuations(tok)
    device = lm.device
    params = inspect.signature(lm.forward).parameters
    keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}  # no vocab-wide logits per position
    cache_arg = cache_kwarg(lm)
    if not shared:  # nothing shared to run on top of the prompt: the prompt pass gives the first logits
        prompt_ids, shared, cache = [list(p) for p in prompt_ids], [], None
    ids, mask = left_pad([list(p) for p in prompt_ids], pad_id)
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    b, k = len(prompt_ids), len(LABELS)
    with torch.inference_mode():
        if cache is None:
            first = lm(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **keep)
            cache = _cache_of(first)
            last_logits = first.logits[:, -1, :]
        if shared:
            head = torch.tensor([shared] * b, dtype=torch.long, device=device)
            hpos = pos[:, -1:] + 1 + torch.arange(len(shared), device=device).unsqueeze(0)
            mask = torch.cat([mask, torch.ones_like(head)], dim=1)
            out = lm(input_ids=head, attention_mask=mask, position_ids=hpos, use_cache=True,
                     **{cache_arg: cache}, **keep)
            cache = _cache_of(out)
            last_logits = out.logits[:, -1, :]
            pos = hpos
        width = max(len(c) for c in conts)
        cont = torch.full((k, width), pad_id, dtype=torch.long)
        cmask = torch.zeros((k, width), dtype=torch.long)
        for j, c in enumerate(conts):
            cont[j, :len(c)] = torch.tensor(c, dtype=torch.long)
            cmask[j, :len(c)] = 1
        cont, cmask = cont.repeat(b, 1).to(device), cmask.repeat(b, 1).to(device)
        cache.batch_repeat_interleave(k)
        full_mask = torch.cat([mask.repeat_interleave(k, dim=0), cmask], dim=1)
        cpos = pos[:, -1:].repeat_interleave(k, dim=0) + 1 + torch.arange(width, device=device).unsqueeze(0)
        second = lm(input_ids=cont, attention_mask=full_mask, position_ids=cpos, use_cache=False,
                    **{cache_arg: cache})
        # logits predicting continuation token t: the head's last logit for t=0, then this pass's
        logits = torch.cat([last_logits.float().repeat_interleave(k, dim=0).unsqueeze(1),
                            second.logits[:, :-1, :].float()], dim=1)
        lp = torch.log_softmax(logits, dim=-1).gather(-1, cont.unsqueeze(-1)).squeeze(-1)
        totals = (lp * cmask).sum(-1).view(b, k).tolist()
    out_rows = []
    for row in totals:
        logprobs = dict(zip(LABELS, row))
        out_rows.append((normalise(logprobs), logprobs))
    return out_rows


def _cache_of(output):
    """The KV cache of a forward/generate output (``cache`` in transformers 5.2x, ``past_key_values`` before)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


# ---------------------------------------------------------------------------
# generation logprobs (openai, vllm)
# ---------------------------------------------------------------------------


def label_probs_from_top_logprobs(tokens: Sequence[tuple[str, Sequence[tuple[str, float]]]]):
    """``(probs, logprobs, None)`` from a generation's tokens, or ``(None, None, reason)``.

    ``tokens``: (token text, [(alternative text, logprob), ...]) per generated
    token, the chosen token among its alternatives or not. The label value
    starts after ``"label": "`` in the concatenated text; the token covering
    that offset is the label token. An alternative there counts for label L
    when it has the same text before the offset and continues with a
    non-empty start of L (or with L itself); several alternatives for one
    label are summed.
    """
    text = "".join(t for t, _ in tokens)
    m = _LABEL_START.search(text)
    if m is None:
        return None, None, "no label in the answer"
    at, start = m.end(), 0
    for tok_text, alts in tokens:
        end = start + len(tok_text)
        if end > at:
            head = text[start:at]
            mass: dict[str, list[float]] = {lab: [] for lab in LABELS}
            for alt, lp in alts:
                if not alt.startswith(head) or lp is None:
                    continue
                rest = alt[len(head):]
                for lab in LABELS:
                    if rest and (lab.startswith(rest) or rest.startswith(lab)):
                        mass[lab].append(float(lp))
                        break
            logprobs = {lab: (_logsumexp(v) if v else None) for lab, v in mass.items()}
            probs = normalise(logprobs)
            if probs is None:
                return None, None, "no label among the top logprobs at the label position"
            return probs, logprobs, None
        start = end
    return None, None, "the answer ends before the label value"


def openai_token_list(logprobs: Any) -> list[tuple[str, list[tuple[str, float]]]] | None:
    """(token, alternatives) from a chat completion choice's ``logprobs`` (object or dict); None if absent."""
    content = _get(logprobs, "content")
    if not content:
        return None
    out = []
    for t in content:
        tok, lp = _get(t, "token"), _get(t, "logprob")
        alts = [(_get(a, "token"), _get(a, "logprob")) for a in (_get(t, "top_logprobs") or [])]
        if not any(a == tok for a, _ in alts):
            alts.append((tok, lp))
        out.append((tok or "", [(a or "", v) for a, v in alts]))
    return out


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _logsumexp(xs: Sequence[float]) -> float:
    top = max(xs)
    return top + math.log(sum(math.exp(x - top) for x in xs))
