"""Bootstrap intervals: the one percentile rule and its minimum sample (every interval of the project)."""

from __future__ import annotations

from typing import Any


# No bootstrap interval is given over fewer resampled units (claims) than this: with a handful of claims a
# percentile interval describes the few draws there are, not the verifier (a one-claim rate resamples to
# the same value every time and would print a zero-width interval).
MIN_INTERVAL_UNITS = 10


def percentile_interval(draws, confidence_level: float = 0.95, n_units: int | None = None) -> dict[str, Any]:
    """The percentile interval of a statistic's bootstrap draws; NaN draws (the statistic undefined in that
    resample) are left out and ``defined`` is the share kept; below one half there is no interval, nor
    when the draws resample fewer than :data:`MIN_INTERVAL_UNITS` units (``n_units``, e.g. claims)."""
    import numpy as np

    x = np.asarray(draws, float)
    finite = x[np.isfinite(x)]
    share = float(finite.size / x.size) if x.size else 0.0
    if n_units is not None and n_units < MIN_INTERVAL_UNITS:
        return {"ci_low": None, "ci_high": None, "defined": share,
                "reason": f"{n_units} claims: no interval below {MIN_INTERVAL_UNITS}"}
    if finite.size == 0 or share < 0.5:
        return {"ci_low": None, "ci_high": None, "defined": share}
    alpha = (1 - confidence_level) / 2
    lo, hi = np.quantile(finite, [alpha, 1 - alpha])
    return {"ci_low": float(lo), "ci_high": float(hi), "defined": share}
