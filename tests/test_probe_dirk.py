"""DirK and its bootstrap summary on hand-built vectors (no model)."""

import math

import numpy as np
import pytest

from fae.probes.dirk import bootstrap_ci, dirk, dirk_values, summarize_rounds


def test_dirk_on_hand_built_vectors():
    h0 = np.array([1.0, 1.0, 0.0])
    hK = h0 + np.array([1.0, 0.0, 0.0])  # knowledge direction = +x
    assert dirk(h0 + [0.0, 2.0, 0.0], h0, hK) == pytest.approx(0.0, abs=1e-12)  # orthogonal
    assert dirk(h0 + [3.0, 0.0, 0.0], h0, hK) == pytest.approx(1.0)  # same direction
    assert dirk(h0 + [-0.5, 0.0, 0.0], h0, hK) == pytest.approx(-1.0)  # opposite
    assert dirk(h0 + [1.0, 1.0, 0.0], h0, hK) == pytest.approx(1 / math.sqrt(2))
    # Scale of the displacement does not matter, only its direction.
    assert dirk(h0 + [1e-3, 1e-3, 0.0], h0, hK) == pytest.approx(1 / math.sqrt(2))


def test_unchanged_state_is_reported_not_nan():
    h0 = np.array([0.3, -1.2, 2.0])
    hK = np.array([1.0, 0.0, 0.0])
    assert dirk(h0.copy(), h0, hK) is None  # h(r) == h(0): pool unchanged
    assert dirk(hK, h0, h0.copy()) is None  # h(K) == h(0): no knowledge direction
    hr = np.stack([h0, h0 + [1, 0, 0], h0, hK])
    vals, defined = dirk_values(hr, h0, hK)
    assert not np.isnan(vals).any()
    assert defined.tolist() == [False, True, False, True]


def test_vectorised_matches_scalar():
    rng = np.random.default_rng(0)
    h0 = rng.normal(size=(5, 1, 16))
    hK = rng.normal(size=(5, 1, 16))
    hr = rng.normal(size=(5, 4, 16))
    vals, defined = dirk_values(hr, h0, hK)
    assert defined.all()
    for i in range(5):
        for r in range(4):
            d1, d2 = hr[i, r] - h0[i, 0], hK[i, 0] - h0[i, 0]
            want = d1 @ d2 / np.linalg.norm(d1) / np.linalg.norm(d2)
            assert vals[i, r] == pytest.approx(want)


def test_bootstrap_ci_small_and_degenerate_samples():
    assert bootstrap_ci([]) == {"mean": None, "ci_low": None, "ci_high": None, "n": 0}
    one = bootstrap_ci([0.4])
    assert one["mean"] == 0.4 and one["ci_low"] is None and one["n"] == 1
    same = bootstrap_ci([0.2, 0.2, 0.2])
    assert same["ci_low"] == same["ci_high"] == pytest.approx(0.2)
    assert bootstrap_ci([None, 0.5, None, 0.7])["n"] == 2


def test_bootstrap_ci_is_a_seeded_percentile_interval():
    rng = np.random.default_rng(3)
    x = rng.normal(0.3, 0.2, size=60)
    a = bootstrap_ci(x, n_resamples=2000, seed=7)
    b = bootstrap_ci(x, n_resamples=2000, seed=7)
    c = bootstrap_ci(x, n_resamples=2000, seed=8)
    assert a == b and a != c
    assert a["ci_low"] < a["mean"] < a["ci_high"]
    # The percentile CI of a mean is close to mean ± 1.96 * SE for a normal sample.
    se = x.std(ddof=1) / np.sqrt(x.size)
    assert a["ci_low"] == pytest.approx(x.mean() - 1.96 * se, abs=0.4 * se)
    assert a["ci_high"] == pytest.approx(x.mean() + 1.96 * se, abs=0.4 * se)


def test_summarize_rounds_counts_undefined_and_missing():
    table = [[None, 0.1, 0.2, 0.3], [None, None, None, None], [None, 0.3, 0.4]]
    rows = summarize_rounds(table, 3, n_resamples=200, seed=0)
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert [r["n"] for r in rows] == [2, 2, 1]
    assert [r["n_undefined"] for r in rows] == [1, 1, 1]
    assert [r["n_missing"] for r in rows] == [0, 0, 1]
    assert rows[0]["mean"] == pytest.approx(0.2)
    assert rows[2]["mean"] == pytest.approx(0.3) and rows[2]["ci_low"] is None
