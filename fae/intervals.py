"""Bootstrap intervals: every interval of the project comes from this module.

The convention (stated here once; docs/architecture.md points here):

* **Resampling unit.** A bootstrap draw picks ``n_units`` units with replacement: claims, or whole claim
  families (:func:`unit_index`, :func:`unit_sums`), optionally x decoding seeds drawn independently
  (:func:`unit_bootstrap` with ``n_seeds``). One draw serves every quantity computed from it, so
  differences (B - A, IS - IS_ctrl) are paired by construction.
* **The draw.** ``numpy.random.default_rng(seed)`` (PCG64), and the index matrix
  ``rng.integers(0, n_units, (n_resamples, n_units))`` (:func:`draw_units`), which is exactly the draw
  ``scipy.stats.bootstrap`` makes for one sample (in batches of rows: the same stream). Where a
  statistic is a vectorised function of the drawn units, :func:`unit_bootstrap` runs it through
  ``scipy.stats.bootstrap(method="percentile")``; where it is not (PAVE's profile, the claim-level
  metrics of ``fae run``), the caller takes :func:`draw_units` and computes each draw itself.
* **The percentile rule.** Linear interpolation between order statistics (Hyndman-Fan type 7, numpy's
  and scipy's default) at ``(1 - confidence) / 2`` and ``1 - (1 - confidence) / 2``
  (:func:`percentile_bounds`). The same quantile can be evaluated three ways that differ in the last
  bits; ``spelling`` names which one a caller has always printed, so no number moves (see there).
* **Undefined draws.** A statistic undefined on a draw (a ratio over an empty state: NaN/inf) is left out
  of that quantity's interval and the share of draws that kept it is reported (``defined``,
  ``undefined_draws``); :func:`percentile_interval` gives no interval below half of the draws, nor over
  fewer than :data:`MIN_INTERVAL_UNITS` units.
* **Results.** :class:`BootstrapResult` (arrays over a statistic's outputs) from :func:`unit_bootstrap`
  and :func:`paired_bootstrap`; :func:`percentile_interval`'s ``{"ci_low", "ci_high", "defined"}`` is
  the form one quantity takes in a JSON file.
* **Pooled batches.** :func:`pooled_paired_bootstrap` runs independently seeded batches of draws (the
  caller derives their seeds) and applies the percentile rule to the pooled draws
  (:func:`distribution_bounds`, the same rule and undefined-draw handling as above): the study report's
  million-draw secondary families, as the paper pools four 250,000-draw batches.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

# No bootstrap interval is given over fewer resampled units (claims) than this: with a handful of claims a
# percentile interval describes the few draws there are, not the verifier (a one-claim rate resamples to
# the same value every time and would print a zero-width interval).
MIN_INTERVAL_UNITS = 10

SPELLINGS = ("numpy", "scipy", "percent")

# The most bootstrap draws a command takes (its ``--draws`` / ``--bootstrap`` field's ``max``): the bootstrap
# keeps every draw of every output in memory (8 bytes x outputs x draws, and scipy copies it), so a
# mistyped 999999999999999 would grow until the machine runs out of memory. The papers use 10k-50k.
MAX_DRAWS = 1_000_000


@dataclass(frozen=True)
class BootstrapResult:
    estimate: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    standard_error: np.ndarray
    n_units: int
    n_resamples: int
    confidence: float
    undefined_draws: np.ndarray  # per output: draws where it was undefined (e.g. a ratio over 0)
    distribution: np.ndarray | None = None  # (q, n_resamples) draws, kept only when asked (``keep_distribution``)
    # per batch of :func:`pooled_paired_bootstrap`, in order: its own (ci_low, ci_high) at ``confidence``, the
    # bounds each batch's draws give before pooling (the paper's Table 27 shows them beside the pooled ones)
    batch_bounds: tuple[tuple[np.ndarray, np.ndarray], ...] | None = None


def draw_units(n_units: int, n_resamples: int, rng: np.random.Generator | int | None) -> np.ndarray:
    """The bootstrap draw: (n_resamples, n_units) unit indices, drawn with replacement from ``rng`` (a
    seed makes ``numpy.random.default_rng(seed)``; a Generator is drawn from and advanced)."""
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    return rng.integers(0, n_units, (int(n_resamples), n_units))


def percentile_bounds(draws, confidence: float, *, spelling: str = "numpy") -> tuple[Any, Any]:
    """(low, high): the percentile rule over the last axis of ``draws`` (NaN draws are the caller's to drop).

    The rule is one: linear interpolation at ``alpha = (1 - confidence) / 2`` and ``1 - alpha``. ``spelling``
    is how it is evaluated, kept per caller because the three agree only up to the last bits:
    ``"numpy"`` ``numpy.quantile(draws, [alpha, 1 - alpha])`` (the claim-level intervals of ``fae run``,
    ``fae report``'s bands, PAVE); ``"scipy"`` ``scipy.stats.quantile`` at the same points, what
    ``scipy.stats.bootstrap(method="percentile")`` computes (:func:`unit_bootstrap`); ``"percent"``
    ``numpy.percentile(draws, [100 alpha, 100 (1 - alpha)])`` (:func:`unit_bootstrap` over the defined
    draws of an output that had undefined ones)."""
    alpha = (1 - confidence) / 2
    if spelling == "numpy":
        lo, hi = np.quantile(draws, [alpha, 1 - alpha], axis=-1)
    elif spelling == "percent":
        lo, hi = np.percentile(draws, [100 * alpha, 100 * (1 - alpha)], axis=-1)
    elif spelling == "scipy":
        from scipy import stats  # lazy: scipy costs ~3 s at import and `fae --help` needs none of it

        a = np.asarray(alpha, dtype=np.asarray(draws).dtype)
        ci = stats.quantile(draws, np.stack((a, 1 - a), axis=-1), axis=-1)
        lo, hi = ci[..., 0], ci[..., 1]
    else:
        raise ValueError(f"spelling must be one of {SPELLINGS}, got {spelling!r}")
    return lo, hi


def percentile_interval(draws, confidence_level: float = 0.95, n_units: int | None = None) -> dict[str, Any]:
    """The percentile interval of a statistic's bootstrap draws; NaN draws (the statistic undefined in that
    resample) are left out and ``defined`` is the share kept; below one half there is no interval, nor
    when the draws resample fewer than :data:`MIN_INTERVAL_UNITS` units (``n_units``, e.g. claims)."""
    x = np.asarray(draws, float)
    finite = x[np.isfinite(x)]
    share = float(finite.size / x.size) if x.size else 0.0
    if n_units is not None and n_units < MIN_INTERVAL_UNITS:
        return {"ci_low": None, "ci_high": None, "defined": share,
                "reason": f"{n_units} claims: no interval below {MIN_INTERVAL_UNITS}"}
    if finite.size == 0 or share < 0.5:
        return {"ci_low": None, "ci_high": None, "defined": share}
    # numpy's spelling: the claim-level intervals of runs already written were computed with it (the other
    # spellings differ in the last bits, so another would change committed metrics.json numbers)
    lo, hi = percentile_bounds(finite, confidence_level, spelling="numpy")
    return {"ci_low": float(lo), "ci_high": float(hi), "defined": share}


def unit_index(claim_ids: Sequence[str], families: Mapping[str, str] | None) -> np.ndarray:
    """Map each claim to a resampling unit: itself, or its family (whole families resample together).

    Raises ``KeyError`` listing (a few of) the claim ids the family map lacks.
    """
    if families is None:
        return np.arange(len(claim_ids))
    missing = [cid for cid in claim_ids if cid not in families]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        raise KeyError(f"{len(missing)} claim id(s) have no family: {shown}" + (" ..." if len(missing) > 5 else ""))
    codes: dict[str, int] = {}
    return np.array([codes.setdefault(str(families[cid]), len(codes)) for cid in claim_ids])


def unit_sums(columns: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Sum per-claim columns (n_claims, k) within units -> (n_units, k)."""
    columns = np.asarray(columns, float)
    n_units = int(units.max()) + 1 if len(units) else 0
    out = np.zeros((n_units, columns.shape[1]))
    np.add.at(out, units, columns)
    return out


def resample_counts(idx: np.ndarray, n_units: int) -> np.ndarray:
    """How often each unit appears in each resample: (..., n_units) from indices (..., n_units)."""
    flat = idx.reshape(-1, idx.shape[-1]).astype(np.int64)
    rows = flat.shape[0]
    offsets = (np.arange(rows, dtype=np.int64) * n_units)[:, None]
    counts = np.bincount((flat + offsets).ravel(), minlength=rows * n_units)
    return counts.reshape(idx.shape[:-1] + (n_units,))


def unit_bootstrap(statistic: Callable[..., np.ndarray], n_units: int, estimate, *, n_seeds: int = 0,
                   n_resamples: int = 10_000, seed: int | None = 0, confidence: float = 0.95,
                   batch: int | None = None, keep_distribution: bool = False) -> BootstrapResult:
    """The one bootstrap: ``scipy.stats.bootstrap(method="percentile")`` over unit indices.

    ``statistic(idx)`` gets drawn unit indices (..., n_units) and returns outputs (q, ...), one row per
    quantity; with ``n_seeds`` it is ``statistic(idx, seed_idx)``, seed indices (..., n_seeds) drawn
    independently of the units. ``estimate`` (q,) is the caller's value on the sample itself. Seeded
    with ``numpy.random.default_rng(seed)``; ``batch`` draws that many resamples at a time (the same
    stream). Intervals by :func:`percentile_bounds` (``"scipy"``); an output undefined (non-finite) on
    some draws is counted in ``undefined_draws`` and its interval and standard error are taken over the
    draws where it is defined (``"percent"``). ``keep_distribution``: the draws come back too (to pool
    independently seeded batches, :func:`pooled_paired_bootstrap`).
    """
    from scipy import stats  # lazy, as above

    samples = (np.arange(n_units),) + ((np.arange(n_seeds),) if n_seeds else ())
    # Degenerate quantities are expected (E0 = 0 under label_accuracy, a
    # metric that never varies on a tiny run): their interval is a point.
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap(samples, lambda *idx, axis=-1: statistic(*(np.asarray(i).astype(np.int64) for i in idx)), vectorized=True,
                              n_resamples=n_resamples, batch=batch, confidence_level=confidence,
                              method="percentile", rng=np.random.default_rng(seed))
        dist = np.array(res.bootstrap_distribution, float, ndmin=2)
        low, high, se, undefined = distribution_bounds(dist, confidence, np.array(res.standard_error, float, ndmin=1))
    return BootstrapResult(estimate=np.asarray(estimate, float), ci_low=low, ci_high=high, standard_error=se,
                           n_units=n_units, n_resamples=n_resamples, confidence=confidence,
                           undefined_draws=undefined, distribution=dist if keep_distribution else None)


def distribution_bounds(dist: np.ndarray, confidence: float, se: np.ndarray | None = None):
    """(low, high, standard error, undefined draws) per output of a (q, draws) bootstrap distribution: the
    percentile rule (``"scipy"``), and over the defined draws only (``"percent"``) where an output is
    undefined on some. ``se`` is scipy's where it computed one; else the draws' own (ddof 1)."""
    from scipy import stats  # lazy, as above

    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        # scipy's spelling: these intervals came from scipy.stats.bootstrap(method="percentile") before the
        # implementations became one; another spelling would move the last bits of committed numbers
        low, high = (np.array(b, float, ndmin=1) for b in percentile_bounds(dist, confidence, spelling="scipy"))
        if se is None:
            se = np.array(dist.std(axis=-1, ddof=1), float, ndmin=1)
    # A ratio (IS = 1 - a1/a0) is undefined on a draw where its denominator is
    # 0. Such draws are counted and left out of that quantity's interval
    # instead of turning the whole interval into NaN.
    finite = np.isfinite(dist)
    undefined = (~finite).sum(axis=-1)
    for i in np.flatnonzero(undefined):
        ok = dist[i][finite[i]]
        if ok.size:
            # numpy.percentile's spelling: how the defined draws' bounds were computed when the committed
            # reports were made; kept so they reproduce bit for bit
            low[i], high[i] = percentile_bounds(ok, confidence, spelling="percent")
            se[i] = ok.std(ddof=1) if ok.size > 1 else np.nan
    return low, high, se, undefined


def paired_bootstrap(
    sums: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    max_batch_elements: int = 4_000_000,
    keep_distribution: bool = False,
    batch_draws: int | None = None,
) -> BootstrapResult:
    """Percentile bootstrap over units, every output computed on the same draws.

    ``sums`` holds per-unit column sums (n_units, k); ``statistic`` maps column
    sums (..., k) to outputs (..., q). Each draw picks n_units units with
    replacement (:func:`unit_bootstrap`: one sample of unit indices, so pairing
    across systems and quantities is by construction); the statistic is
    recomputed from the drawn units' summed columns, which handles ratios of
    means (IS, micro precision) and families of unequal size.

    ``sums`` (n_units, n_seeds, k): also n_seeds seed indices drawn independently (SPEC §10); ``statistic``
    gets the drawn seeds' sums (..., n_seeds, k) and averages over them itself.

    Draws are computed ``max_batch_elements // (n_units x n_seeds)`` at a time, or ``batch_draws`` at a time
    when given (a caller bounding its memory by the columns too). With seeds the batch size is part of the
    draw (scipy draws each batch's units, then its seeds), so a caller keeps its batch size fixed.
    """
    sums = np.asarray(sums, float)
    n_units = sums.shape[0]
    if n_units < 2:
        raise ValueError(f"need at least 2 resampling units, got {n_units}")
    estimate = np.asarray(statistic(sums.sum(axis=0)), float)

    def boot_stat(idx):
        return np.moveaxis(np.asarray(statistic(resample_counts(idx, n_units) @ sums), float), -1, 0)

    def boot_stat_seeds(idx, seed_idx):  # one draw's units serving every drawn seed
        # one matrix product over (seed, column) pairs: einsum's loop was the bootstrap's slowest step
        counts = resample_counts(idx, n_units).astype(float)
        per_seed = (counts @ flat).reshape(counts.shape[:-1] + sums.shape[1:])
        drawn = np.take_along_axis(per_seed, seed_idx[..., None].astype(np.int64), axis=-2)
        return np.moveaxis(np.asarray(statistic(drawn), float), -1, 0)

    n_seeds = sums.shape[1] if sums.ndim == 3 else 0  # (units, seeds, columns): seeds resampled too
    flat = sums.reshape(n_units, -1)
    batch = batch_draws or max(1, int(max_batch_elements // max(n_units * (n_seeds or 1), 1)))
    return unit_bootstrap(boot_stat_seeds if n_seeds else boot_stat, n_units, estimate, n_seeds=n_seeds,
                          n_resamples=n_resamples, seed=seed, confidence=confidence, batch=batch,
                          keep_distribution=keep_distribution)


def pooled_paired_bootstrap(sums: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], *,
                            batches: Sequence[tuple[int, int]], confidence: float = 0.95,
                            batch_draws: int | None = None) -> BootstrapResult:
    """:func:`paired_bootstrap` run as independently seeded batches of draws, their draws pooled.

    ``batches``: (draws, seed) per batch. One batch is :func:`paired_bootstrap` itself. Several: each batch's
    draws are computed (in the same bounded compute batches) and copied into one (q, total) array, and the
    percentile rule is applied to the pool, as the paper pools four 250,000-draw batches into its million-draw
    secondary intervals (Appendix K). Memory: the pool (8 bytes x q x total) and one batch's scipy copies;
    the statistic should compute only the quantities whose intervals are wanted. ``batch_draws``: as
    :func:`paired_bootstrap`'s, for the several-batch case.

    ``batch_bounds`` of the result: each batch's own percentile bounds at ``confidence``, which
    :func:`paired_bootstrap` computes from that batch's draws anyway (no further draw or statistic call), so
    a reader sees how far the batches' endpoints spread around the pooled one (the paper's Table 27)."""
    batches = [(int(n), seed) for n, seed in batches]
    if len(batches) == 1:
        n, seed = batches[0]
        res = paired_bootstrap(sums, statistic, n_resamples=n, seed=seed, confidence=confidence,
                               batch_draws=batch_draws)
        return dataclasses.replace(res, batch_bounds=((res.ci_low, res.ci_high),))
    total = sum(n for n, _ in batches)
    pool = None
    at = 0
    first = None
    bounds = []
    for n, seed in batches:
        res = paired_bootstrap(sums, statistic, n_resamples=n, seed=seed, confidence=confidence,
                               keep_distribution=True, batch_draws=batch_draws)
        if pool is None:
            first = res
            pool = np.empty((res.distribution.shape[0], total))
        pool[:, at:at + n] = res.distribution
        bounds.append((res.ci_low, res.ci_high))
        at += n
        del res
    low, high, se, undefined = distribution_bounds(pool, confidence)
    return BootstrapResult(estimate=first.estimate, ci_low=low, ci_high=high, standard_error=se,
                           n_units=first.n_units, n_resamples=total, confidence=confidence,
                           undefined_draws=undefined, batch_bounds=tuple(bounds))
