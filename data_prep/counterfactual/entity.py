"""Rule-based counter-entity swaps: no model, seeded, drawn from the dataset's own sentences.

A gold sentence's salient spans (numbers, percentages, years, months, named
entities) are found with regular expressions; one (or ``swaps``) of them is
replaced by a different span of the same kind taken from the corpus of every
sentence in the records, so replacements are plausible for the domain
("ACE2" -> "TMPRSS2", "30%" -> "12%"). The rest of the sentence is kept byte
for byte. The choice depends only on (seed, record id, sentence id), so the
output does not change with the order or number of records processed.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December")
# Kind -> pattern; earlier kinds win where spans overlap.
PATTERNS: tuple[tuple[str, re.Pattern], ...] = (
    ("percent", re.compile(r"(?<![\w.-])\d+(?:\.\d+)?\s?%")),
    ("month", re.compile(rf"\b(?:{_MONTHS})\b")),
    ("year", re.compile(r"(?<![\w.-])(?:19|20)\d\d(?!\w|%|\.\d)")),
    ("number", re.compile(r"(?<![\w.-])\d+(?:[.,]\d+)*(?![\w%-]|[.,]\d)")),
    ("entity", re.compile(r"\b(?:[A-Z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*)(?:\s+[A-Z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*)*\b")),
)
# Capitalised words that are not names (sentence starts, function words, units).
_NOT_NAMES = frozenset("""
a an the this that these those there their our we it its in on at of for from to by with as and or but
however although while when where which who whose what during after before since among between
conclusion conclusions result results method methods background objective objectives finding findings overall here both
interpretation design setting participants introduction purpose aim aims importance discussion
all each no not one two three most many some several further moreover also thus therefore
""".split())


@dataclass(frozen=True)
class Span:
    kind: str
    start: int
    end: int
    text: str


def find_spans(text: str) -> list[Span]:
    """Non-overlapping salient spans of ``text``, in order."""
    taken: list[Span] = []
    for kind, pat in PATTERNS:
        for m in pat.finditer(text):
            span = Span(kind, m.start(), m.end(), m.group())
            if kind == "entity":
                span = _trim_entity(span, text)
                if span is None:
                    continue
            if any(s.start < span.end and span.start < s.end for s in taken):
                continue
            taken.append(span)
    return sorted(taken, key=lambda s: s.start)


def _plain_word(word: str) -> bool:
    """Capitalised only as a sentence start would be ("Compared"), not "COVID-19" or "ACE2"."""
    return word[1:].islower() and not any(c.isdigit() for c in word)


def _trim_entity(span: Span, text: str) -> Span | None:
    """Drop leading capitalised function words ("The", "In") and a plain sentence-initial word."""
    words = span.text.split()
    start = span.start
    while words and (words[0].lower() in _NOT_NAMES
                     or (_plain_word(words[0]) and re.search(r"(^|[.:;!?]\s+)$", text[:start]))):
        start += len(words[0])
        rest = span.text[start - span.start:]
        start += len(rest) - len(rest.lstrip())
        words = words[1:]
    if not words:
        return None
    text = span.text[start - span.start:]
    if len(text) < 2:
        return None
    return Span("entity", start, start + len(text), text)


@dataclass
class SpanCorpus:
    """Every salient span of a set of sentences, by kind (sorted, so draws are reproducible)."""

    by_kind: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> "SpanCorpus":
        found: dict[str, set[str]] = defaultdict(set)
        for t in texts:
            for s in find_spans(t):
                found[s.kind].add(s.text)
        return cls({k: sorted(v) for k, v in found.items()})

    def alternatives(self, span: Span) -> list[str]:
        same = span.text.casefold()
        return [v for v in self.by_kind.get(span.kind, []) if v.casefold() != same]


def _rng(seed: int, record_id: str, sentence_id: int) -> random.Random:
    digest = hashlib.sha256(f"{seed}\0{record_id}\0{sentence_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


@dataclass(frozen=True)
class Swap:
    kind: str
    original: str
    replacement: str
    start: int  # in the original text


def entity_swap(text: str, corpus: SpanCorpus, *, seed: int, record_id: str, sentence_id: int,
                swaps: int = 1) -> tuple[str, list[Swap]] | None:
    """``text`` with up to ``swaps`` salient spans replaced; None when nothing can be swapped."""
    rng = _rng(seed, record_id, sentence_id)
    spans = [s for s in find_spans(text) if corpus.alternatives(s)]
    if not spans:
        return None
    chosen = sorted(rng.sample(spans, min(swaps, len(spans))), key=lambda s: s.start)
    out, done, pos = [], [], 0
    for s in chosen:
        new = rng.choice(corpus.alternatives(s))
        out += [text[pos:s.start], new]
        done.append(Swap(s.kind, s.text, new, s.start))
        pos = s.end
    out.append(text[pos:])
    return "".join(out), done
