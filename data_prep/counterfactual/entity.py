"""Rule-based, claim-aware counter-entity swaps: no model, seeded, drawn from the dataset's own sentences.

A gold sentence's salient spans (numbers, percentages, years, months, named
entities) are found with regular expressions and compared with the claim's.
For a SUPPORT claim the span the claim states is replaced by a different
span of the same kind taken from the corpus of every sentence in the records
("30%" -> "12%"), so the sentence refutes the claim; for a REFUTE claim the
sentence's differing span is replaced by the claim's own ("12%" -> "30%"),
so it supports the claim (:func:`claim_aware_swap`). The rest of the
sentence is kept byte for byte. The choice depends only on (seed, record
id, sentence id), so the output does not change with the order or number of
records processed.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from real_fae_core.hashing import sha256_seed
from real_fae_core.labels import REFUTE, SUPPORT

from .rewrite import content_words

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
        """The salient spans of ``texts``, by kind, each once and sorted."""
        found: dict[str, set[str]] = defaultdict(set)
        for t in texts:
            for s in find_spans(t):
                found[s.kind].add(s.text)
        return cls({k: sorted(v) for k, v in found.items()})

    def alternatives(self, span: Span) -> list[str]:
        """The corpus's spans of ``span``'s kind other than itself (compared case-insensitively), sorted: the
        candidates to swap it for."""
        same = span.text.casefold()
        return [v for v in self.by_kind.get(span.kind, []) if v.casefold() != same]


def _rng(seed: int, record_id: str, sentence_id: int) -> random.Random:
    return random.Random(sha256_seed(seed, record_id, sentence_id))


@dataclass(frozen=True)
class Swap:
    kind: str
    original: str
    replacement: str
    start: int  # in the original text


# ---------------------------------------------------------------------------
# Claim-aware swaps: the counterfactual must carry the opposite verdict
# ---------------------------------------------------------------------------

# Span kinds whose swap makes the verdict flip by rule: a claim that states a value is refuted by
# evidence that states another value of the same kind in its place, and supported once the evidence
# states the claim's own value. A swapped name ("ACE2" -> "TMPRSS2") may instead change what the
# sentence is about (not enough info rather than a refutation), so name swaps go to the judge.
VALUE_KINDS = frozenset({"percent", "number", "year", "month"})
SUPPORT_TO_REFUTE = "away from the claim's value"
REFUTE_TO_SUPPORT = "to the claim's value"


@dataclass(frozen=True)
class ClaimSwap:
    """A claim-aware swap: the new text, what was replaced, and whether the rule proves the flip."""

    text: str
    swaps: tuple[Swap, ...]
    direction: str  # SUPPORT_TO_REFUTE or REFUTE_TO_SUPPORT
    proved: bool  # True: the swapped spans are values (VALUE_KINDS), the verdict flips by rule


def _fold(text: str) -> str:
    return " ".join(text.casefold().split())


def _spans_by_text(spans: Iterable[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        out[_fold(s.text)].append(s)
    return out


def _replace_all(text: str, spans: list[Span], new: str) -> tuple[str, tuple[Swap, ...]]:
    out, pos, done = [], 0, []
    for s in sorted(spans, key=lambda s: s.start):
        out += [text[pos:s.start], new]
        done.append(Swap(s.kind, s.text, new, s.start))
        pos = s.end
    out.append(text[pos:])
    return "".join(out), tuple(done)


_COMPARATIVES = frozenset("than least most over under above below up about approximately around nearly almost "
                          "roughly within beyond exceeding".split())
_OPENERS = " \t\n(\"'$~≈<>≥≤£€"
_CLOSERS = " \t\n,.;:)\"'"


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _context(text: str, span: Span, width: int = 3) -> set[str]:
    """Content words around a span: which sentence value answers which claim value ("days", "rate")."""
    before = " ".join(_words(text[:span.start])[-width:])
    after = " ".join(_words(text[span.end:])[:width])
    return content_words(f"{before} {after}")


def _unit(text: str, span: Span) -> str | None:
    """The unit written right after a number, whole ("mg/kg" in "5 mg/kg", "days" in "5 days"); None when
    punctuation or nothing follows. Two numbers answer each other only with the same unit."""
    m = re.match(r"\s*([^\W\d_][\w/%·^.-]*)", text[span.end:])
    return m.group(1).rstrip(".-").lower() if m else None


# Words that give a value a direction: "increased by 30%" and "decreased by 30%" state the same number
# with opposite meanings, so a value swapped into a sentence proves a verdict only with the claim's direction.
_UP = frozenset("""increase increased increases increasing rise rises rose risen rising higher greater more
grew grow grows growing growth gain gains gained elevated elevation raise raised raises exceed exceeded exceeds
boost boosted surge surged jump jumped doubled tripled upward""".split())
_DOWN = frozenset("""decrease decreased decreases decreasing fall falls fell fallen falling lower less fewer
smaller drop drops dropped dropping decline declines declined declining reduce reduces reduced reducing
reduction reductions shrank shrink shrinks cut cuts lowered halved downward loss losses lost""".split())


def _direction_of(words: list[str]) -> str | None:
    up, down = bool(_UP.intersection(words)), bool(_DOWN.intersection(words))
    return "both" if up and down else "up" if up else "down" if down else None


def direction(text: str, span: Span, before: int = 4, after: int = 3) -> str | None:
    """"up", "down", "both" or None: the direction words next to a value ("rose by 30%", "30% fewer"), else
    those of the whole sentence ("rose in the last fiscal year by 30%": the verb is far from its value)."""
    near = _direction_of(_words(text[:span.start])[-before:] + _words(text[span.end:])[:after])
    return near if near is not None else _direction_of(_words(text))


def same_direction(claim: str, c: Span, text: str, spans: Iterable[Span]) -> bool:
    """Every sentence span states its value in the claim's direction (one direction, or none on both sides).

    A change amount ("by 30%") without a direction word the rule knows ("slumped by 30%") proves nothing:
    its direction is unknown, not absent."""
    spans = list(spans)
    want = direction(claim, c)
    if want == "both":
        return False
    if want is None and (_change_amount(claim, c) or any(_change_amount(text, sp) for sp in spans)):
        return False
    return all(direction(text, sp) == want for sp in spans)


def _change_amount(text: str, span: Span) -> bool:
    """A value that measures a change ("by 30%"), whose meaning needs a direction."""
    return _words(text[:span.start])[-1:] == ["by"]


def same_unit(claim: str, c: Span, text: str, spans: Iterable[Span]) -> bool:
    """Numbers answer each other only in the same unit ("44 percent" != "77 pairs", "5 mg/kg" != "5 mg/day")."""
    return c.kind != "number" or all(_unit(claim, c) == _unit(text, sp) for sp in spans)


def provable_value(text: str, span: Span) -> bool:
    """A span whose swap flips the verdict by rule: a value (not a name), standing alone (not "1–5",
    "PI(3,4)P2"), not a one-digit label ("type 2", "grade 3"), not bounded ("more than 5")."""
    if span.kind not in VALUE_KINDS:
        return False
    prev = text[span.start - 1] if span.start else " "
    nxt = text[span.end] if span.end < len(text) else " "
    if prev not in _OPENERS or nxt not in _CLOSERS:
        return False
    if prev == "(" and span.start >= 2 and text[span.start - 2].isalnum():
        return False
    if span.kind == "number" and sum(c.isdigit() for c in span.text) < 2:
        return False
    return not _COMPARATIVES.intersection(_words(text[:span.start])[-2:])


def _shape(value: str) -> tuple:
    """How a number is written (digits before the point, decimals, grouping): replacements keep it."""
    digits = re.sub(r"[^\d.,]", "", value)
    whole, _, decimals = digits.replace(",", "").partition(".")
    return ("," in digits, len(whole), len(decimals))


def claim_aware_swap(claim: str, label: str, text: str, corpus: SpanCorpus, *, seed: int, record_id: str,
                     sentence_id: int) -> tuple[ClaimSwap | None, str | None]:
    """(swap, None), or (None, why none) for one gold sentence of a SUPPORT or REFUTE claim.

    SUPPORT claim (the sentence supports it): a span the claim itself states
    is replaced, every occurrence, by another span of the same kind (and, for
    numbers, the same written shape) from the corpus that neither the claim
    nor the sentence states, so the sentence now refutes the claim. REFUTE
    claim: a span of the sentence that the claim does not state is replaced
    by the claim's own span of the same kind that the sentence lacks (the
    pair whose neighbouring content words match best), so the sentence now
    supports it. Either way the flip is proved only where the sentence gives
    its value the claim's unit (:func:`same_unit`) and direction
    (:func:`same_direction`: the words next to the value, else the whole
    sentence's), so the new sentence states what the claim states, or its
    value instead: "decreased by 12%" -> "decreased by 30%" does not support
    "increased by 30%", however far "decreased" stands from the value. A swap
    of :func:`provable_value` spans that agree so proves the flip by rule and
    is preferred; any other swap is returned unproved, for the judge.
    """
    rng = _rng(seed, record_id, sentence_id)
    claim_spans = find_spans(claim)
    sent_spans = find_spans(text)
    in_claim = _spans_by_text(claim_spans)
    in_sent = _spans_by_text(sent_spans)
    if label == SUPPORT:
        shared = [(key, spans) for key, spans in in_sent.items() if key in in_claim]
        if not shared:
            return None, "the sentence states none of the claim's values or names"
        claimed = {_fold(s.text) for s in claim_spans}
        options = []
        for key, spans in shared:
            # the sentence keeps the claim's unit and direction, so only the value moves away from the claim's
            proved = (all(provable_value(text, sp) for sp in spans)
                      and any(provable_value(claim, c) and same_unit(claim, c, text, spans)
                              and same_direction(claim, c, text, spans) for c in in_claim[key]))
            alts = [v for v in corpus.alternatives(spans[0]) if _fold(v) not in claimed and _fold(v) not in in_sent]
            if spans[0].kind in ("number", "percent"):
                alts = [v for v in alts if _shape(v) == _shape(spans[0].text)]
            if alts:
                options.append((proved, key, spans, alts))
        if not options:
            return None, "no alternative of the same kind in the corpus for the claim's values"
        best = max(o[0] for o in options)
        _, _, spans, alts = rng.choice(sorted([o for o in options if o[0] == best], key=lambda o: o[1]))
        new, swaps = _replace_all(text, spans, rng.choice(alts))
        return ClaimSwap(new, swaps, SUPPORT_TO_REFUTE, best), None
    if label != REFUTE:
        return None, f"label {label} has no opposite verdict"
    missing = [spans[0] for key, spans in in_claim.items() if key not in in_sent]
    pairs = []
    for c in missing:
        for key, spans in in_sent.items():
            if key in in_claim or spans[0].kind != c.kind:
                continue
            fit = len(_context(claim, c) & _context(text, spans[0]))
            # the new sentence states the claim's value in the claim's unit and direction: "decreased by 30%"
            # does not support "increased by 30%", nor "30 days" a claim of "30 mg"
            proved = (fit > 0 and same_unit(claim, c, text, spans) and same_direction(claim, c, text, spans)
                      and provable_value(claim, c) and all(provable_value(text, sp) for sp in spans))
            pairs.append((proved, fit, key, _fold(c.text), c, spans))
    if not pairs:
        return None, "the claim states no value or name that the sentence gives differently"
    best = max(p[:2] for p in pairs)
    chosen = sorted([p for p in pairs if p[:2] == best], key=lambda p: (p[2], p[3]))
    _, _, _, _, c, spans = rng.choice(chosen)
    new, swaps = _replace_all(text, spans, c.text)
    # proved only when every value the claim states now appears in the sentence
    after = _spans_by_text(find_spans(new))
    values_present = all(key in after for key, sp in in_claim.items() if sp[0].kind in VALUE_KINDS)
    return ClaimSwap(new, swaps, REFUTE_TO_SUPPORT, best[0] and values_present), None
