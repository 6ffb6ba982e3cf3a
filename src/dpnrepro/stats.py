"""The statistics behind every table: mean ± 95 % CI over seeds (or few-shot draws), the paired
treated − control difference, a stated test with its p-value, and a verdict. A bottom-layer module
(it imports nothing of the project) because the few-shot evaluator uses it as well as the reports.

One rule everywhere (Sec. 5.1 of the paper reports mean ± 95 % CI over >= 3 runs):

* ``mean_ci95``: mean and half-width of the two-sided 95 % Student-t interval.
* ``paired_test``: the difference treated − control paired by seed (same seed = same initialisation
  draw order and data order), tested with a two-sided **paired t-test** (``method="t"``, the default;
  equal to ``scipy.stats.ttest_rel``) or a **paired bootstrap** (``method="bootstrap"``: resample the
  per-seed differences with replacement, a fixed RNG seed, percentile CI, two-sided p = twice the
  smaller tail of the bootstrap distribution on either side of 0).
* ``verdict``: ``better`` / ``worse`` when the 95 % CI of the difference excludes 0 (for the t-test
  this is exactly p < 0.05) over at least ``MIN_PAIRS`` = 3 pairs (Sec. 5.1's >= 3 runs), otherwise
  ``not resolved``. With 2 pairs the t-interval has one degree of freedom: it excludes 0 only when the two
  differences agree within about 15 % of each other, so a last-bit change of either run decides it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

ALPHA = 0.05
BOOTSTRAP_SEED = 0
BOOTSTRAP_RESAMPLES = 10_000
VERDICTS = ("better", "worse", "not resolved")
MIN_PAIRS = 3  # the fewest paired seeds (or draws) a better / worse verdict may rest on


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
    return mean, float(t.ppf(1 - ALPHA / 2, n - 1)) * sd / math.sqrt(n)


def paired_delta_ci95(treated: Sequence[float], control: Sequence[float]) -> tuple[float, float | None]:
    """Mean and 95 % CI of treated − control, paired by seed (same seed = same data order)."""
    return mean_ci95(_differences(treated, control))


def _differences(treated: Sequence[float], control: Sequence[float]) -> list[float]:
    if len(treated) != len(control):
        raise ValueError(f"a paired comparison needs the same seeds on both sides ({len(treated)} vs {len(control)})")
    return [a - b for a, b in zip(treated, control)]


def paired_test(treated: Sequence[float], control: Sequence[float], *,
                method: Literal["t", "bootstrap"] = "t", resamples: int = BOOTSTRAP_RESAMPLES,
                seed: int = BOOTSTRAP_SEED) -> dict:
    """Paired comparison of treated vs control: ``{mean, ci95, low, high, p, test, n, verdict}``.

    ``mean`` is the mean difference; ``low``/``high`` its 95 % CI (t-interval, or bootstrap percentile
    interval); ``ci95`` the half-width of the t-interval (None for the bootstrap, whose interval need not
    be symmetric); ``p`` the two-sided p-value for "mean difference = 0" (None with fewer than 2 pairs or
    when every difference is the same, where the t statistic is undefined).
    """
    d = _differences(treated, control)
    n = len(d)
    if n == 0:
        raise ValueError("paired_test needs at least one pair")
    mean, half = mean_ci95(d)
    out = {"mean": mean, "ci95": half, "low": None, "high": None, "p": None, "n": n,
           "test": "paired t-test (two-sided)" if method == "t" else
           f"paired bootstrap ({resamples} resamples, seed {seed}, percentile CI)"}
    if n >= 2:
        if method == "t":
            out["low"], out["high"] = mean - half, mean + half
            sd = math.sqrt(math.fsum((v - mean) ** 2 for v in d) / (n - 1))
            if sd > 0:
                from scipy.stats import t

                out["p"] = float(2 * t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
        elif method == "bootstrap":
            import numpy as np

            rng = np.random.default_rng(seed)
            arr = np.asarray(d, dtype=np.float64)
            means = arr[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
            out["ci95"] = None
            out["low"], out["high"] = (float(v) for v in np.quantile(means, [ALPHA / 2, 1 - ALPHA / 2]))
            out["p"] = float(min(1.0, 2 * min((means <= 0).mean(), (means >= 0).mean())))
        else:
            raise ValueError(f"unknown test {method!r}; use 't' or 'bootstrap'")
    out["verdict"] = verdict(out["low"], out["high"], n)
    return out


def paired_by_seed(treated: dict[int, float], control: dict[int, float]) -> dict:
    """:func:`paired_test` of ``{seed: value}`` maps on the seeds they share, with those seeds and the
    per-seed differences."""
    seeds = sorted(set(treated) & set(control))
    return {**paired_test([treated[s] for s in seeds], [control[s] for s in seeds]), "seeds": seeds,
            "per_seed": [treated[s] - control[s] for s in seeds]}


def verdict(low: float | None, high: float | None, n: int | None = None) -> str:
    """``better`` if the CI of treated − control lies above 0, ``worse`` below 0, else ``not resolved``;
    ``not resolved`` as well from ``n`` < :data:`MIN_PAIRS` pairs (``n`` None: a Δ that does not record
    its pairs, judged on its CI alone)."""
    if low is None or high is None or (n is not None and n < MIN_PAIRS):
        return "not resolved"
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "not resolved"


def pairs(delta: dict) -> int | None:
    """The number of pairs a summary's Δ rests on: its ``n``, else its ``seeds`` or ``per_seed`` count."""
    if "n" in delta:
        return delta["n"]
    for key in ("seeds", "per_seed"):
        if key in delta:
            return len(delta[key])
    return None


LEARNED_MARGIN = 10.0  # points (the metric's own unit: % accuracy, % mIoU) above chance


def learned(value: float, chance: float, margin: float = LEARNED_MARGIN) -> bool:
    """Whether a run (or a mean over seeds) learned: ``value`` at least ``margin`` above ``chance``, the
    score of a model that learned nothing (a classifier's: the test split's majority-class rate). The one
    rule the reports use before giving a verdict on a difference: a Δ between runs at chance says nothing."""
    return value >= chance + margin


def learned_cell(values: Sequence[float] | float, chance: float, margin: float = LEARNED_MARGIN) -> dict:
    """``{"chance", "learned"}`` of a summary cell: :func:`learned` on the mean of its ``values``."""
    vals = [values] if isinstance(values, (int, float)) else list(values)
    return {"chance": float(chance), "learned": learned(math.fsum(vals) / len(vals), chance, margin)}


def learned_delta(cells: dict[str, dict]) -> dict:
    """``{"chance", "learned", "at_chance"}`` of a Δ between ``cells`` (``{stem: cell}``): learned when
    every side learned (a side with no ``learned`` is taken as learned), ``at_chance`` names those that did
    not; ``chance`` is the sides' (equal) chance."""
    at_chance = [stem for stem, cell in cells.items() if cell.get("learned") is False]
    chances = [c["chance"] for c in cells.values() if "chance" in c]
    return {"chance": max(chances) if chances else None, "learned": not at_chance, "at_chance": at_chance}


def fmt_ci(mean: float, ci: float | None, digits: int = 1) -> str:
    """'72.1 ± 0.07'-style text; CI shown with one more digit than the mean."""
    if ci is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {ci:.{digits + 1}f}"


def fmt_p(p: float | None) -> str:
    """A p-value as printed in the reports: 3 significant digits, '<0.001' below that, '—' if undefined."""
    if p is None:
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3g}"
