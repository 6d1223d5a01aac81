"""The second ordering of SPEC §10 (source 1): a cross-encoder reranking of the BM25 pool.

The same pool is reordered, never refilled, so the two sources differ only in order (and so in
what a budget keeps). The model is a sentence-transformers ``CrossEncoder`` loaded by hub name or
local directory (the paper's: ``BAAI/bge-reranker-base``). Each (claim, unit) pair is cut at 512
tokens, as in the paper, and the cut pairs are counted, because a truncated unit was scored on
less than the verifier will read. Ties in score keep the BM25 order (unit id).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from real_fae_core.errors import UserError

MAX_PAIR_TOKENS = 512
PAPER_RERANKER = "BAAI/bge-reranker-base"


class Reranker:
    """A loaded cross-encoder; :meth:`order` ranks one pool."""

    def __init__(self, name: str, batch_size: int = 32):
        self.name = name
        self.batch_size = batch_size
        self.model = load_cross_encoder(name)
        self.tokenizer = self.model.tokenizer

    def order(self, claim: str, texts: Sequence[str]) -> tuple[list[int], list[int]]:
        """(unit positions best first, positions whose pair was cut at 512 tokens)."""
        if not texts:
            return [], []
        pairs = [(claim, t) for t in texts]
        scores = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False,
                                    convert_to_numpy=True)
        lengths = [len(ids) for ids in self.tokenizer([claim] * len(texts), list(texts),
                                                      truncation=False)["input_ids"]]
        order = sorted(range(len(texts)), key=lambda i: (-float(scores[i]), i))
        return order, [i for i, n in enumerate(lengths) if n > MAX_PAIR_TOKENS]


def load_cross_encoder(name: str):
    """``CrossEncoder(name, max_length=512)``; a name or directory that does not load is bad input (exit 2)."""
    from sentence_transformers import CrossEncoder

    local = Path(name).expanduser()
    if not local.exists() and (name.startswith((".", "/", "~")) or name.count("/") > 1):
        raise UserError(f"--reranker {name!r}: directory does not exist")
    try:
        return CrossEncoder(str(local) if local.exists() else name, max_length=MAX_PAIR_TOKENS)
    except Exception as exc:  # the hub, a config or weights file: every failure is the same "cannot load"
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"--reranker {name!r}: cannot be loaded as a cross-encoder ({reason})") from None
