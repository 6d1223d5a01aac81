"""Schema-constrained decoding for local transformers generation, through xgrammar.

xgrammar (the grammar engine inside vLLM and SGLang) masks, at every step,
the tokens that would leave the JSON schema of the prompt
(:mod:`data_prep.schemas`). Schemas differ only by the pool shown, so
grammars are compiled once per pool shape and cached; each row of a batch
gets its own matcher. Optional dependency: ``pip install 'real-fae[structured]'``.
"""

from __future__ import annotations

import time
from typing import Any

from data_prep._dispatch import UserError
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
            # no free whitespace: a weak model cannot spend max_new_tokens on blanks
            grammar = self.compiler.compile_json_schema(key, any_whitespace=False, separators=(", ", ": "),
                                                        strict_mode=True)
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
        vocab = lm.get_output_embeddings().weight.shape[0]  # logits width (may exceed len(tok))
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
