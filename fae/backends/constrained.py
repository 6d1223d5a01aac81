"""Schema-constrained decoding for local transformers generation, through xgrammar.

xgrammar (the grammar engine inside vLLM and SGLang) masks, at every step,
the tokens that would leave the grammar of the prompt's answer schema
(:mod:`data_prep.schemas`). Schemas differ only by the pool shown, so
grammars are compiled once per pool shape and cached; each row of a batch
gets its own matcher. Optional dependency: ``pip install 'real-fae[structured]'``.

The grammar is written here (:func:`answer_grammar`) rather than compiled
from the JSON schema: xgrammar does not enforce ``uniqueItems``, and a weak
model then repeats one id until ``max_new_tokens`` cuts the answer off; and a
JSON-schema grammar allows free whitespace, which a random model writes until
the cap. The grammar admits exactly the schema's answers with ids in
ascending order (at most ``maxItems``), laid out like the training target
(:func:`data_prep.prompts.format_answer`: ``{"label": "SUPPORT", "evidence":
[0, 3]}``) or compact (a word-level tokenizer has no space token): one
optional space after ``:`` and ``,``, nowhere else. So every answer is finite,
and :func:`max_answer_tokens` bounds its length in tokens: the hf backend
raises ``max_new_tokens`` to it so a constrained answer is never cut off.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

from real_fae_core.errors import UserError
from data_prep.schemas import schema_key


def import_xgrammar():
    """The xgrammar module; when it is not installed, a :class:`UserError` saying which extra to install."""
    try:
        import xgrammar
    except ImportError as exc:
        raise UserError("--constrained-decoding with the hf backend needs xgrammar: "
                        f"pip install 'real-fae[structured]' ({exc})") from None
    return xgrammar


def eos_list(eos_ids) -> list[int]:
    """A model's stop token ids as a list of ints (one id, a list of them, or None: empty)."""
    return [int(e) for e in ([eos_ids] if isinstance(eos_ids, int) else (eos_ids or []))]


def _lit(text: str) -> str:
    return json.dumps(text)  # an EBNF string literal: JSON escaping is the same


# One optional space after ":" and ",": BPE tokenizers write the training target's
# ``{"label": "SUPPORT", "evidence": [0, 3]}``; a word-level tokenizer (the demo's) has no
# space token and writes ``{"label":"SUPPORT","evidence":[0,3]}`` (its decoder puts the
# spaces back). Never more than one: free whitespace lets a weak model pad forever.
_SPACE = 'sp ::= " "?'


def evidence_cap(prop: dict[str, Any]) -> tuple[list[int], int]:
    """(the allowed ids ascending, the most that may be cited) of an evidence array schema."""
    ids = sorted({int(i) for i in (prop.get("items") or {}).get("enum") or []})
    cap = prop.get("maxItems")
    return ids, len(ids) if cap is None else max(0, min(int(cap), len(ids)))


def answer_grammar(schema: dict[str, Any]) -> str:
    """EBNF for the flat answer schemas of :mod:`data_prep.schemas`, in property order.

    Supports string enums and arrays of unique integer enums (written
    ascending, at most ``maxItems``). Whitespace is one optional space after
    ``:`` and ``,``, so every answer is finite: :func:`max_answer_chars`.
    """
    rules: list[str] = []
    parts: list[str] = []
    for n, (name, prop) in enumerate(schema["properties"].items()):
        parts += [_lit(("{" if n == 0 else ",")), *(["sp"] if n else []), _lit(json.dumps(name) + ":"), "sp"]
        if prop.get("type") == "string":
            rules.append(f"v{n} ::= " + " | ".join(_lit(json.dumps(v)) for v in prop["enum"]))
        elif prop.get("type") == "array":
            rules += _ascending_ids(f"v{n}", *evidence_cap(prop))
        else:  # pragma: no cover - data_prep.schemas makes only these
            raise ValueError(f"unsupported property {name!r} in an answer schema")
        parts.append(f"v{n}")
    rules.insert(0, "root ::= " + " ".join(parts) + ' "}"')
    return "\n".join([*rules, _SPACE])


def _ascending_ids(rule: str, ids: list[int], cap: int) -> list[str]:
    """``[`` at most ``cap`` ids, strictly ascending, ``,``-separated ``]``.

    ``{rule}_s{k}_{m}``: a sequence of at most m ids whose first is ids[k] or
    later. With m >= the ids left the cap cannot bind, and the rule is the
    uncapped ``{rule}_s{k}``: a cap equal to the pool size adds no rules.
    """
    if not ids or cap <= 0:
        return [f'{rule} ::= "[]"']

    def name(k: int, m: int) -> str:
        return f"{rule}_s{k}" if m >= len(ids) - k else f"{rule}_s{k}_{m}"

    out = [f'{rule} ::= "[" ({name(0, cap)})? "]"']
    todo, seen = [(0, cap)], set()
    while todo:
        k, m = todo.pop()
        if name(k, m) in seen:
            continue
        seen.add(name(k, m))
        m = min(m, len(ids) - k)
        first = f'"{ids[k]}"'
        if k + 1 < len(ids) and m > 1:
            first += f' ("," sp {name(k + 1, m - 1)})?'
            todo.append((k + 1, m - 1))
        alts = [f"({first})"]
        if k + 1 < len(ids):
            alts.append(name(k + 1, m))
            todo.append((k + 1, m))
        out.append(f"{name(k, m)} ::= " + " | ".join(alts))
    return out


def max_answer_chars(schema: dict[str, Any]) -> int:
    """Characters of the longest answer :func:`answer_grammar` admits (spaces included).

    Every token a grammar-held model writes adds at least one character, so
    this plus one stop token bounds the tokens a constrained answer can take
    (:func:`max_answer_tokens`), whatever the model and tokenizer.
    """
    total = 1  # "}"
    for n, (name, prop) in enumerate(schema["properties"].items()):
        total += len(("{" if n == 0 else ", ") + json.dumps(name) + ": ")
        if prop.get("type") == "string":
            total += max(len(json.dumps(v)) for v in prop["enum"])
        else:
            ids, cap = evidence_cap(prop)
            longest = sorted((len(str(i)) for i in ids), reverse=True)[:cap]
            total += 2 + sum(longest) + 2 * max(0, len(longest) - 1)  # "[" ids ", " ... "]"
    return total


def max_answer_tokens(schemas) -> int:
    """``max_new_tokens`` that lets every answer of ``schemas`` finish: its characters + the stop token."""
    return max((max_answer_chars(s) for s in schemas), default=0) + 1


class GrammarCache:
    """Compiled grammars of one tokenizer, one per schema (pool shape), compiled on first use."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids):
        xgr = import_xgrammar()
        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=int(vocab_size),
                                                  stop_token_ids=eos_list(stop_token_ids) or None)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self.vocab_size = int(vocab_size)
        self._compiled: dict[str, Any] = {}
        self.stats = {"grammars_compiled": 0, "compile_seconds": 0.0}

    def get(self, schema: dict[str, Any]):
        """The compiled grammar of ``schema``'s answers, compiled on first use (its time counted in ``stats``)."""
        key = schema_key(schema)
        grammar = self._compiled.get(key)
        if grammar is None:
            t0 = time.perf_counter()
            grammar = self.compiler.compile_grammar(answer_grammar(schema))
            self.stats["compile_seconds"] += time.perf_counter() - t0
            self.stats["grammars_compiled"] += 1
            self._compiled[key] = grammar
        return grammar


def dead_end_message(steps: int) -> str:
    """Why generation stops when no token of the vocabulary continues an answer."""
    return (f"constrained decoding: no token of the model's vocabulary continues the answer after {steps} "
            "answer tokens, so it could never finish; the tokenizer cannot write the answer format "
            "(docs/structured.md)")


class SchemaLogitsProcessor:
    """A transformers logits processor: one grammar matcher per batch row (use once per ``generate``).

    A row whose matcher has accepted a stop token is finished; transformers
    pads it from then on, and its logits are left alone.
    """

    def __init__(self, cache: GrammarCache, grammars: list):
        self.xgr = cache.xgr
        self.matchers = [self.xgr.GrammarMatcher(g) for g in grammars]
        self.bitmask = self.xgr.allocate_token_bitmask(len(grammars), cache.vocab_size)
        self._started = False
        self.seconds = 0.0
        self.steps = 0

    def __call__(self, input_ids, scores):
        t0 = time.perf_counter()
        if self._started:
            for row, m in zip(input_ids, self.matchers):
                if not m.is_terminated():
                    m.accept_token(int(row[-1]))
        self._started = True
        self.bitmask.fill_(-1)  # all allowed: rows already finished are not constrained
        for i, m in enumerate(self.matchers):
            if not m.is_terminated():
                m.fill_next_token_bitmask(self.bitmask, i)
                if not bool(self.bitmask[i].any()):
                    raise UserError(dead_end_message(self.steps))
        self.steps += 1
        masked = scores.to("cpu") if scores.device.type not in ("cpu", "cuda") else scores
        self.xgr.apply_token_bitmask_inplace(masked, self.bitmask.to(masked.device))
        self.seconds += time.perf_counter() - t0
        return masked.to(scores.device)


class HFConstraint:
    """What the hf backend needs: per-prompt schemas -> a logits processor for one ``generate`` call."""

    def __init__(self, lm, tok, eos_ids):
        head = lm.get_output_embeddings()  # logits width (may exceed len(tok): padded embeddings)
        vocab = head.weight.shape[0] if head is not None else lm.config.get_text_config().vocab_size
        self.cache = GrammarCache(tok, vocab, eos_ids)
        self.stats = {"constrained_prompts": 0, "mask_seconds": 0.0}

    def budget(self, gc, schemas: list[dict[str, Any]]):
        """``gc``, or a copy whose ``max_new_tokens`` is raised so every answer of ``schemas`` can finish.

        A cut-off constrained answer is invalid, which the constraint exists to
        prevent; an answer that finishes early stops at its stop token, so the
        raise costs nothing then. The highest raise is in ``backend_stats``.
        """
        need = max_answer_tokens(schemas)
        if need <= int(gc.max_new_tokens):
            return gc
        self.stats["max_new_tokens_raised_to"] = max(need, self.stats.get("max_new_tokens_raised_to", 0))
        raised = copy.copy(gc)
        raised.max_new_tokens = need
        return raised

    def processors(self, schemas: list[dict[str, Any]]):
        """The logits processors that keep each batch row's answer inside its schema (one schema per row, in order)."""
        from transformers import LogitsProcessorList

        self.stats["constrained_prompts"] += len(schemas)
        self._last = SchemaLogitsProcessor(self.cache, [self.cache.get(s) for s in schemas])
        return LogitsProcessorList([self._last])

    def done(self) -> None:
        """After a ``generate`` call: add its masking time to the stats."""
        self.stats["mask_seconds"] += self._last.seconds

    def stats_snapshot(self) -> dict[str, Any]:
        """The constraint's counters and the grammar cache's, seconds rounded to ms, for ``backend_stats``."""
        out = {**self.stats, **self.cache.stats}
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}
