"""Direction-to-knowledge (DirK, SPEC §7): pure numeric logic, no model code.

``DirK(r) = cos(h(r) - h(0), h(K) - h(0))`` for rounds ``r >= 1``. Round 0 is
undefined by construction (``h(0) - h(0) = 0``). A round whose state equals
``h(0)`` (the pool did not change, e.g. the verifier cited nothing) has no
direction either: its value is ``None`` and it is counted, never turned into
NaN or silently into 0.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from fae.intervals import unit_bootstrap

# A displacement whose norm is at most this share of ||h(0)|| counts as zero.
# Identical prompts give bit-identical states (prompts are deduplicated before
# the forward pass), so this only guards against exact-zero edge cases.
REL_EPS = 1e-7


def _norm_threshold(h0: np.ndarray) -> np.ndarray:
    return REL_EPS * np.maximum(np.linalg.norm(h0, axis=-1), 1e-30)


def dirk_values(h_r: np.ndarray, h0: np.ndarray, hK: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised DirK over leading axes.

    ``h_r``, ``h0``, ``hK`` broadcast to ``[..., D]``. Returns ``(values,
    defined)``: ``values`` is float64 with 0.0 where undefined (never NaN) and
    ``defined`` is the boolean mask of well-defined cosines (both
    displacements non-zero).
    """
    h_r = np.asarray(h_r, dtype=np.float64)
    h0 = np.asarray(h0, dtype=np.float64)
    hK = np.asarray(hK, dtype=np.float64)
    d_r = h_r - h0
    d_k = hK - h0
    n_r = np.linalg.norm(d_r, axis=-1)
    n_k = np.linalg.norm(d_k, axis=-1)
    thr = _norm_threshold(np.broadcast_to(h0, np.broadcast_shapes(h_r.shape, h0.shape)))
    defined = (n_r > thr) & (n_k > thr)
    dot = np.sum(d_r * d_k, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.where(defined, dot / np.where(defined, n_r * n_k, 1.0), 0.0)
    return np.clip(cos, -1.0, 1.0), defined


def dirk(h_r: Sequence[float], h0: Sequence[float], hK: Sequence[float]) -> float | None:
    """DirK for one claim and round; ``None`` when a displacement is zero."""
    value, defined = dirk_values(np.asarray(h_r), np.asarray(h0), np.asarray(hK))
    return float(value) if bool(defined) else None


def bootstrap_ci(
    values: Sequence[float],
    *,
    n_resamples: int = 2000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
) -> dict:
    """Mean and percentile-bootstrap CI of the mean over claims.

    Uses :func:`fae.intervals.unit_bootstrap` (``scipy.stats.bootstrap(method="percentile")``
    over the claims, seeded). With no values everything is ``None``; with one value (or
    ``n_resamples == 0``) there is a mean but no interval.
    """
    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return {"mean": None, "ci_low": None, "ci_high": None, "n": 0}
    mean = float(x.mean())
    if n < 2 or n_resamples <= 0:
        return {"mean": mean, "ci_low": None, "ci_high": None, "n": n}
    if np.all(x == x[0]):
        # Every resample has the same mean; scipy warns about a degenerate
        # distribution. The interval is the point itself.
        return {"mean": mean, "ci_low": mean, "ci_high": mean, "n": n}
    res = unit_bootstrap(lambda idx: np.mean(x[idx], axis=-1)[None], n, [mean], n_resamples=int(n_resamples),
                         seed=seed, confidence=confidence_level)
    lo, hi = float(res.ci_low[0]), float(res.ci_high[0])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo = hi = None  # pragma: no cover - scipy degenerate case
    return {"mean": mean, "ci_low": lo, "ci_high": hi, "n": n}


def summarize_rounds(
    per_claim: Sequence[Sequence[float | None]],
    n_rounds: int,
    *,
    n_resamples: int = 2000,
    confidence_level: float = 0.95,
    seed: int | None = 0,
) -> list[dict]:
    """Per-round summary for rounds ``1..n_rounds``.

    ``per_claim[i][r]`` is claim i's DirK at round r (``None`` = undefined).
    Claims with fewer recorded rounds are counted as ``n_missing``. Each
    round gets its own seed offset so rounds do not share resamples.
    """
    out = []
    for r in range(1, n_rounds + 1):
        vals, undefined, missing = [], 0, 0
        for row in per_claim:
            if r >= len(row):
                missing += 1
            elif row[r] is None:
                undefined += 1
            else:
                vals.append(row[r])
        stats = bootstrap_ci(
            vals,
            n_resamples=n_resamples,
            confidence_level=confidence_level,
            seed=None if seed is None else seed + r,
        )
        out.append({"round": r, **stats, "n_undefined": undefined, "n_missing": missing})
    return out
