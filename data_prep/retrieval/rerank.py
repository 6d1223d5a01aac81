"""The second ordering of SPEC §10 (source 1): the BM25 pool reordered by a sentence-transformers model.

The same pool is reordered, never refilled, so the two sources differ only in order (and so in
what a budget keeps). Two kinds of model share one interface, ``order(claim, texts) -> (order, cut)``:

- ``cross-encoder`` (the paper's, ``BAAI/bge-reranker-base``): a ``CrossEncoder`` reads each
  (claim, unit) pair together and scores it; each pair is cut at 512 tokens, as in the paper;
- ``bi-encoder`` (a stand-in where no cross-encoder can be reached, e.g. all-MiniLM-L6-v2): a
  ``SentenceTransformer`` embeds the claim and each unit apart, and a unit scores the cosine of the
  two normalized embeddings; each text is cut at the model's ``max_seq_length``.

Best score first; ties keep the BM25 order (unit id). The cut units are counted, because a truncated
unit was scored on less than the verifier will read. A name or directory that is not a model of the
named kind is bad input (exit 2), decided in one place, :func:`load_model`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from real_fae_core.errors import UserError

MAX_PAIR_TOKENS = 512
PAPER_RERANKER = "BAAI/bge-reranker-base"
CROSS_ENCODER = "cross-encoder"
BI_ENCODER = "bi-encoder"
KINDS = (CROSS_ENCODER, BI_ENCODER)
# sentence-transformers' model_type (config_sentence_transformers.json) of each kind
_MODEL_TYPES = {"SentenceTransformer": BI_ENCODER, "CrossEncoder": CROSS_ENCODER}


def best_first(scores: Sequence[float]) -> list[int]:
    """Positions by score, highest first; equal scores keep their position order (the BM25 order)."""
    return sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))


class LoadedOrdering:
    """A second-ordering model loaded by name or directory (``kind`` says which sentence-transformers class)."""

    kind = CROSS_ENCODER

    def __init__(self, name: str, batch_size: int = 32):
        self.name = name
        self.batch_size = batch_size
        self.model = load_model(name, self.kind)
        self.tokenizer = self.model.tokenizer
        self.max_tokens = self.token_limit()

    def token_limit(self) -> int:
        """Where an input is cut: the paper's 512 tokens for a (claim, unit) pair."""
        return MAX_PAIR_TOKENS


class Reranker(LoadedOrdering):
    """A loaded cross-encoder; :meth:`order` ranks one pool."""

    kind = CROSS_ENCODER

    def order(self, claim: str, texts: Sequence[str]) -> tuple[list[int], list[int]]:
        """(unit positions best first, positions whose pair was cut at 512 tokens)."""
        if not texts:
            return [], []
        pairs = [(claim, t) for t in texts]
        scores = self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False,
                                    convert_to_numpy=True)
        lengths = [len(ids) for ids in self.tokenizer([claim] * len(texts), list(texts),
                                                      truncation=False)["input_ids"]]
        return best_first(scores), [i for i, n in enumerate(lengths) if n > self.max_tokens]


class BiEncoder(LoadedOrdering):
    """A loaded bi-encoder (sentence embeddings); :meth:`order` ranks one pool by cosine to the claim."""

    kind = BI_ENCODER

    def token_limit(self) -> int:
        """Where a text is cut: the model's own maximum (claim and unit are embedded apart)."""
        return int(self.model.max_seq_length)

    def embed(self, texts: Sequence[str]):
        """Unit-length embeddings of ``texts`` (float32 rows), in batches of ``batch_size``."""
        return self.model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)

    def order(self, claim: str, texts: Sequence[str]) -> tuple[list[int], list[int]]:
        """(unit positions best first, positions of units longer than ``max_seq_length`` tokens, cut)."""
        if not texts:
            return [], []
        unique = list(dict.fromkeys(texts))  # equal units share one embedding, so they tie exactly
        query = self.embed([claim])[0].astype("float64")
        # row by row: equal rows give equal sums, where a matrix product's rounding may depend on the row
        by_text = dict(zip(unique, (self.embed(unique).astype("float64") * query).sum(axis=1)))
        scores = [by_text[t] for t in texts]
        lengths = [len(ids) for ids in self.tokenizer(list(texts), truncation=False)["input_ids"]]
        return best_first(scores), [i for i, n in enumerate(lengths) if n > self.max_tokens]


def make_reranker(name: str, kind: str = CROSS_ENCODER, batch_size: int = 32) -> Reranker | BiEncoder:
    """The source-1 model of ``kind`` (one of :data:`KINDS`)."""
    if kind not in KINDS:
        raise UserError(f"--reranker-kind {kind!r}: unknown; choose from {', '.join(KINDS)}")
    return (Reranker if kind == CROSS_ENCODER else BiEncoder)(name, batch_size)


def declared_kind(source: str) -> str | None:
    """What the model files at ``source`` (directory or hub name) say they are: ``bi-encoder``,
    ``cross-encoder``, another sentence-transformers model type, a plain transformers architecture, or
    None when they say nothing (no ``modules.json`` and no ``architectures`` in ``config.json``)."""
    from sentence_transformers.util import load_file_path

    if load_file_path(source, "modules.json") is not None:
        st_config = load_file_path(source, "config_sentence_transformers.json")
        model_type = _json(st_config).get("model_type", "SentenceTransformer") if st_config else "SentenceTransformer"
        return _MODEL_TYPES.get(model_type, f"sentence-transformers {model_type}")
    config = load_file_path(source, "config.json")
    architectures = (_json(config).get("architectures") or []) if config else []
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return CROSS_ENCODER  # a transformers classifier: what the hub's cross-encoders are
    return f"plain transformers model ({', '.join(architectures)})" if architectures else None


def _json(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        value = json.load(fh)
    return value if isinstance(value, dict) else {}


def hub_hint() -> str:
    """What to do about a hub name that did not load: offline, a local copy; otherwise, where the hub cannot be
    reached, HF_HUB_OFFLINE=1 (each file is then looked up in the cache at once, not retried for minutes)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "; HF_HUB_OFFLINE is set, so only the local hub cache was read: give a local directory holding a copy"
    return ("; where the hub cannot be reached, set HF_HUB_OFFLINE=1 (no retries) or give a local directory "
            "holding a copy")


def load_model(name: str, kind: str):
    """``CrossEncoder(name, max_length=512)`` or ``SentenceTransformer(name)``. A name or directory that does
    not load, or whose files declare another kind (a cross-encoder loaded as a bi-encoder would get an
    untrained pooling, a bi-encoder loaded as a cross-encoder an untrained head), is bad input (exit 2).
    A bi-encoder must be a sentence-transformers model (``modules.json``)."""
    from sentence_transformers import CrossEncoder, SentenceTransformer

    local = Path(name).expanduser()
    if not local.exists() and (name.startswith((".", "/", "~")) or name.count("/") > 1):
        raise UserError(f"--reranker {name!r}: directory does not exist")
    source = str(local) if local.exists() else name
    try:
        declared = declared_kind(source)
        if declared is None and kind == BI_ENCODER:
            declared = "not a sentence-transformers model: no modules.json"
        if declared is None or declared == kind:
            if kind == CROSS_ENCODER:
                return CrossEncoder(source, max_length=MAX_PAIR_TOKENS)
            return SentenceTransformer(source)
    except Exception as exc:  # the hub, a config or weights file: every failure is the same "cannot load"
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        hint = "" if local.exists() else hub_hint()
        raise UserError(f"--reranker {name!r}: cannot be loaded as a {kind} ({reason}){hint}") from None
    hint = f"; pass --reranker-kind {declared}" if declared in KINDS else ""
    article = "" if declared.startswith("not ") else "it is a "
    raise UserError(f"--reranker {name!r}: cannot be loaded as a {kind} ({article}{declared}{hint})")
