"""Shared pieces of the retrieval tests: a tiny cross-encoder and a tiny bi-encoder built in code, small corpora
written to disk.

The tiny cross-encoder is a one-layer BERT with a character-level WordPiece vocabulary and one
output label, saved as a directory that ``sentence_transformers.CrossEncoder(path)`` loads, so the
reranking path runs offline in seconds. Each character is a token, so a long sentence is a pair past
512 tokens and exercises truncation counting. The tiny bi-encoder is the same kind of BERT with mean
pooling, a directory that ``sentence_transformers.SentenceTransformer(path)`` loads.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_cross_encoder(path: Path, seed: int = 0) -> Path:
    """Write a tiny BertForSequenceClassification (num_labels=1) and its tokenizer to ``path``."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    chars = string.ascii_lowercase + string.digits + string.punctuation
    vocab = SPECIAL + list(chars) + ["##" + c for c in chars]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tok = BertTokenizerFast(vocab_file=str(path / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=512, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


BI_MAX_TOKENS = 64


def tiny_bi_encoder(path: Path, seed: int = 0) -> Path:
    """A sentence-transformers bi-encoder saved to ``path``: a one-layer random BERT with a character-level
    WordPiece vocabulary (each character a token) and mean pooling, ``max_seq_length`` 64."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    bert = path.parent / f"{path.name}-bert"
    bert.mkdir(parents=True, exist_ok=True)
    chars = string.ascii_lowercase + string.digits + string.punctuation
    vocab = SPECIAL + list(chars) + ["##" + c for c in chars]
    (bert / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=128)).save_pretrained(bert)
    # the vocabulary file positionally: transformers 5 ignores ``vocab_file=`` (every token [UNK])
    tok = BertTokenizerFast(str(bert / "vocab.txt"), do_lower_case=True)
    assert tok.tokenize("Word.") == ["w", "##o", "##r", "##d", "."]
    tok.save_pretrained(bert)
    word = Transformer(str(bert), max_seq_length=BI_MAX_TOKENS)
    SentenceTransformer(modules=[word, Pooling(16, "mean")], device="cpu").save(str(path))
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def abstract_corpus(path: Path, docs: dict[str, list[str]], id_field: str = "doc_id") -> Path:
    """A SciFact-style corpus (``doc_id``, ``abstract``); ``id_field="cord_id"`` gives Check-COVID's, titled."""
    rows = []
    for doc, abstract in docs.items():
        row = {id_field: doc, "abstract": abstract}
        if id_field == "cord_id":
            row["title"] = ""
        rows.append(row)
    return write_jsonl(path, rows)
