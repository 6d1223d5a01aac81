"""Where a sampled run's label distribution is read: the token that starts the label value (vLLM, openai)."""

import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from fae.pave.sampling import distribution_at_label

LABELS = ["SUPPORT", "REFUTE", "NOT_ENOUGH_INFO"]


def split(text: str, cuts: list[int]) -> list[str]:
    cuts = sorted({c for c in cuts if 0 < c < len(text)})
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@given(label=st.sampled_from(LABELS), cuts=st.lists(st.integers(1, 80), max_size=12),
       ids=st.lists(st.integers(0, 30), max_size=4), spaces=st.sampled_from(["", " ", "\n  "]))
@settings(max_examples=300, deadline=None)
def test_the_distribution_is_read_at_the_token_that_starts_the_label(label, cuts, ids, spaces):
    text = "{" + spaces + '"label":' + spaces + json.dumps(label) + ', "evidence": ' + json.dumps(ids) + "}"
    start = text.index(label)
    pieces = split(text[:start], cuts) + split(text[start:], [c for c in cuts])  # a token starts the label
    # each token's alternatives: itself, plus a competing label at lower probability
    other = LABELS[(LABELS.index(label) + 1) % 3]
    tokens = [(t, [(t, -0.1), (other[:3], -2.5)]) for t in pieces]
    dist = distribution_at_label(tokens)
    assert dist is not None and max(range(3), key=dist.__getitem__) == LABELS.index(label)
    assert sum(dist) == pytest.approx(1.0)
    assert dist[LABELS.index(other)] == pytest.approx(1 / (1 + math.exp(2.4)))


def test_no_label_or_a_token_that_begins_no_label_gives_none():
    assert distribution_at_label([("I think", []), (" it is true", [])]) is None
    assert distribution_at_label([]) is None
    # the label's first token is shared with text before it: no alternative begins exactly one label
    assert distribution_at_label([('{"label": "', [('{"label": "', -0.1)]), ("XYZ", [("XYZ", -0.1)])]) is None
