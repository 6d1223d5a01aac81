"""Schema-constrained decoding for local transformers generation, through xgrammar.

xgrammar (the grammar engine inside vLLM and SGLang) masks, at every step,
the tokens that would leave the grammar of the prompt's answer schema
(:mod:`data_prep.schemas`). Schemas differ only by the pool shown, so
grammars are compiled once per pool shape and cached; each row of a batch
gets its own matcher. Optional dependency: ``pip install 'real-fae[structured]'``.

The grammar is written here (:func:`answer_grammar`) rather than compiled
from the JSON schema: xgrammar does not enforce ``uniqueItems``, and a weak
model then repeats one id until ``max_new_tokens`` cuts the answer off. The
grammar admits exactly the schema's answers with ids in ascending order,
written like the training target (:func:`data_prep.prompts.format_answer`:
``{"label": "SUPPORT", "evidence": [0, 3]}``), so every answer ends within
``len(pool)`` ids.
"""

from __future__ import annotations

import json
import time
from typing import Any

from data_prep.core.errors import UserError
from data_prep.schemas import schema_key


def import_xgrammar():
    try:
        import xgrammar
    except ImportError as exc:
        raise UserError("--constrained-decoding with the hf backend needs xgrammar: "
                        f"pip install 'real-fae[structured]' ({exc})") from None
    return xgrammar


def eos_list(eos_ids) -> list[int]:
    return [int(e) for e in ([eos_ids] if isinstance(eos_ids, int) else (eos_ids or []))]


def _lit(text: str) -> str:
    return json.dumps(text)  # an EBNF string literal: JSON escaping is the same


def answer_grammar(schema: dict[str, Any]) -> str:
    """EBNF for the flat answer schemas of :mod:`data_prep.schemas`, in property order, no free whitespace.

    Supports string enums and arrays of unique integer enums (written ascending).
    """
    rules: list[str] = []
    parts: list[str] = []
    for n, (name, prop) in enumerate(schema["properties"].items()):
        parts.append(_lit(("{" if n == 0 else ", ") + json.dumps(name) + ": "))
        if prop.get("type") == "string":
            rules.append(f"v{n} ::= " + " | ".join(_lit(json.dumps(v)) for v in prop["enum"]))
        elif prop.get("type") == "array":
            ids = sorted(int(i) for i in (prop.get("items") or {}).get("enum") or [])
            rules += _ascending_ids(f"v{n}", ids)
        else:  # pragma: no cover - data_prep.schemas makes only these
            raise ValueError(f"unsupported property {name!r} in an answer schema")
        parts.append(f"v{n}")
    rules.insert(0, "root ::= " + " ".join(parts) + ' "}"')
    return "\n".join(rules)


def _ascending_ids(rule: str, ids: list[int]) -> list[str]:
    """``[`` ids strictly ascending, ``, ``-separated ``]``: s_k = a sequence whose first id is ids[k] or later."""
    if not ids:
        return [f'{rule} ::= "[]"']
    out = [f'{rule} ::= "[" ({rule}_s0)? "]"']
    for k, i in enumerate(ids):
        rest = f'({_lit(", ")} {rule}_s{k + 1})?' if k + 1 < len(ids) else ""
        first = f'"{i}" {rest}'.strip()
        out.append(f"{rule}_s{k} ::= ({first})" + (f" | {rule}_s{k + 1}" if k + 1 < len(ids) else ""))
    return out


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
        key = schema_key(schema)
        grammar = self._compiled.get(key)
        if grammar is None:
            t0 = time.perf_counter()
            grammar = self.compiler.compile_grammar(answer_grammar(schema))
            self.stats["compile_seconds"] += time.perf_counter() - t0
            self.stats["grammars_compiled"] += 1
            self._compiled[key] = grammar
        return grammar


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

    def processors(self, schemas: list[dict[str, Any]]):
        from transformers import LogitsProcessorList

        self.stats["constrained_prompts"] += len(schemas)
        self._last = SchemaLogitsProcessor(self.cache, [self.cache.get(s) for s in schemas])
        return LogitsProcessorList([self._last])

    def done(self) -> None:
        """After a ``generate`` call: add its masking time to the stats."""
        self.stats["mask_seconds"] += self._last.seconds

    def stats_snapshot(self) -> dict[str, Any]:
        out = {**self.stats, **self.cache.stats}
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}
