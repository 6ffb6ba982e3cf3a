"""Mean and 95 % confidence intervals over seeds (Student t), as the paper reports them."""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean_ci95(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and half-width of the two-sided 95 % t-interval; half-width None for a single value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci95 needs at least one value")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    from scipy.stats import t

    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n)


def paired_delta_ci95(treated: Sequence[float], control: Sequence[float]) -> tuple[float, float | None]:
    """Mean and 95 % CI of treated − control, paired by seed (same seed = same data order)."""
    if len(treated) != len(control):
        raise ValueError("paired_delta_ci95 needs the same seeds on both sides")
    return mean_ci95([a - b for a, b in zip(treated, control)])


def fmt_ci(mean: float, ci: float | None, digits: int = 1) -> str:
    """'72.1 ± 0.07'-style text; CI shown with one more digit than the mean."""
    if ci is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {ci:.{digits + 1}f}"
