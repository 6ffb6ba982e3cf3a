"""The statistics behind every table: mean ± 95 % CI over seeds, the paired treated − control
difference, a stated test with its p-value, and a verdict. A bottom-layer module (it imports nothing of
the project) because the few-shot evaluator uses it as well as the reports.

One rule everywhere (docs/tables-and-figures.md#statistics; Sec. 5.1 of the paper reports mean ± 95 % CI
over >= 3 runs):

* ``mean_ci95``: mean and half-width of the two-sided 95 % Student-t interval.
* ``paired_test``: THE verdict. The difference treated − control paired by training seed, tested with a
  two-sided **paired t-test** (``method="t"``, the default; equal to ``scipy.stats.ttest_rel``) or a
  **paired bootstrap** (``method="bootstrap"``). It requires ``training_pairs``, the number of independent
  training pairs the values rest on: ``better`` / ``worse`` only when there is one value per training pair,
  at least ``MIN_PAIRS`` = 3 of them, and the 95 % CI excludes 0; otherwise ``not resolved``, with ``why``
  naming too few training runs where that is the reason.
* ``paired_by_seed``: ``{seed: value or [draws]}`` maps; few-shot draws are averaged within each seed
  first, so the CI and the verdict are over seeds. Draws of one trained pair measure evaluation noise,
  not training noise: with a single shared seed the Δ and its spread over the draws are reported, never
  a verdict.
* ``paired_by_pretraining``: the same for fine-tunes (Tables 3, 4, 5): the independent pairs are the
  pretrained pairs, and fine-tuning seeds are averaged within each like draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

ALPHA = 0.05
BOOTSTRAP_SEED = 0
BOOTSTRAP_RESAMPLES = 10_000
VERDICTS = ("better", "worse", "not resolved")
MIN_PAIRS = 3  # the fewest independent training pairs (seeds) a better / worse verdict may rest on


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


def _differences(treated: Sequence[float], control: Sequence[float]) -> list[float]:
    if len(treated) != len(control):
        raise ValueError(f"a paired comparison needs the same seeds on both sides ({len(treated)} vs {len(control)})")
    return [a - b for a, b in zip(treated, control)]


def paired_test(treated: Sequence[float], control: Sequence[float], *, training_pairs: int,
                method: Literal["t", "bootstrap"] = "t", resamples: int = BOOTSTRAP_RESAMPLES,
                seed: int = BOOTSTRAP_SEED, unit: str = "training run") -> dict:
    """Paired comparison of treated vs control, and the project's one verdict:
    ``{mean, ci95, low, high, p, test, n, training_pairs, verdict[, why]}``.

    ``training_pairs`` is the number of independent training pairs (seeds) the values come from: equal to
    the number of values when each is one seed's (draws already averaged within the seed), smaller when
    the values are few-shot draws of fewer training runs (then the interval is the draws' spread and the
    verdict is ``not resolved``). ``unit`` names what is independent (``"pretraining run"`` where the
    pairs are fine-tunes of pretrained pairs) in ``why``. ``mean`` is the mean difference; ``low``/``high``
    its 95 % CI (``scipy.stats.ttest_rel(...).confidence_interval()``, or ``scipy.stats.bootstrap``'s
    paired percentile interval with a seeded generator); ``ci95`` the half-width of the t-interval (None for
    the bootstrap, whose interval need not be symmetric); ``p`` the two-sided p-value for "mean difference
    = 0" (None with fewer than 2 values or when every difference is the same, where the t statistic is
    undefined). ``why`` says why too few training runs leave the difference ``not resolved``.
    """
    d = _differences(treated, control)
    n = len(d)
    if n == 0:
        raise ValueError("paired_test needs at least one pair")
    if isinstance(training_pairs, bool) or not isinstance(training_pairs, int) or not 1 <= training_pairs <= n:
        raise ValueError(f"training_pairs must be an int from 1 to the {n} values, got {training_pairs!r}")
    if method not in ("t", "bootstrap"):
        raise ValueError(f"unknown test {method!r}; use 't' or 'bootstrap'")
    mean = math.fsum(d) / n
    out = {"mean": mean, "ci95": None, "low": None, "high": None, "p": None, "n": n,
           "training_pairs": training_pairs,
           "test": "paired t-test (two-sided)" if method == "t" else
           f"paired bootstrap ({resamples} resamples, seed {seed}, percentile CI)"}
    if n >= 2:
        out.update(_paired_t(treated, control, d) if method == "t" else
                   _paired_bootstrap(treated, control, resamples, seed))
    if training_pairs < MIN_PAIRS:
        out["verdict"] = "not resolved"
        out["why"] = f"{training_pairs} {unit}{'s' if training_pairs > 1 else ''}"
    elif training_pairs < n:
        out["verdict"] = "not resolved"
        out["why"] = "draws not averaged within each seed"
    else:
        out["verdict"] = _ci_side(out["low"], out["high"])
    return out


def _paired_t(treated: Sequence[float], control: Sequence[float], d: list[float]) -> dict:
    """``{ci95, low, high, p}`` of ``scipy.stats.ttest_rel``; every difference the same: the interval is that
    difference and ``p`` None (the t statistic is undefined)."""
    if len(set(d)) == 1:
        return {"ci95": 0.0, "low": d[0], "high": d[0], "p": None}
    from scipy.stats import ttest_rel

    res = ttest_rel(treated, control)
    ci = res.confidence_interval(confidence_level=1 - ALPHA)
    low, high = float(ci.low), float(ci.high)
    return {"ci95": (high - low) / 2, "low": low, "high": high, "p": float(res.pvalue)}


def _paired_bootstrap(treated: Sequence[float], control: Sequence[float], resamples: int, seed: int) -> dict:
    """``{ci95: None, low, high, p}`` of ``scipy.stats.bootstrap(paired=True)`` of the mean difference
    (percentile interval, generator seeded with ``seed``); ``p`` twice the smaller share of resampled means
    on either side of 0."""
    import numpy as np
    from scipy.stats import bootstrap

    res = bootstrap((np.asarray(treated, dtype=np.float64), np.asarray(control, dtype=np.float64)),
                    _mean_difference, n_resamples=resamples, paired=True, vectorized=True,
                    confidence_level=1 - ALPHA, method="percentile", rng=np.random.default_rng(seed))
    means = res.bootstrap_distribution
    return {"ci95": None, "low": float(res.confidence_interval.low), "high": float(res.confidence_interval.high),
            "p": float(min(1.0, 2 * min((means <= 0).mean(), (means >= 0).mean())))}


def _mean_difference(treated, control, axis=-1):
    import numpy as np

    return np.mean(treated - control, axis=axis)


def _ci_side(low: float | None, high: float | None) -> str:
    """``better`` if an interval lies above 0, ``worse`` below 0, else ``not resolved``; only
    :func:`paired_test` calls it, after its pair count allows a verdict."""
    if low is None or high is None:
        return "not resolved"
    if low > 0:
        return "better"
    if high < 0:
        return "worse"
    return "not resolved"


def seed_means(values: dict[int, float | Sequence[float]]) -> dict[int, float]:
    """``{seed: value}`` of ``{seed: value or [draws]}``: each seed's draws averaged within the seed."""
    return {s: (math.fsum(v) / len(v) if isinstance(v, (list, tuple)) else float(v)) for s, v in values.items()}


def paired_by_seed(treated: dict[int, float | Sequence[float]], control: dict[int, float | Sequence[float]], *,
                   method: Literal["t", "bootstrap"] = "t", repeats: str = "few-shot draws",
                   unit: str = "training run") -> dict:
    """:func:`paired_test` of ``{seed: value}`` (or ``{seed: [draw values]}``) maps on the training seeds they
    share, with those ``seeds`` and the ``per_seed`` differences. Draws (``repeats``: what the values within
    a seed are, paired by position) are averaged within each seed and the test is over seeds; with one
    shared seed whose draws pair up, the Δ and its spread over those draws are reported, ``not resolved``
    (1 training run; ``unit`` names the independent run: ``"pretraining run"`` for fine-tunes)."""
    seeds = sorted(set(treated) & set(control))
    if not seeds:
        raise ValueError("a paired comparison needs at least one seed on both sides")
    t_means, c_means = seed_means({s: treated[s] for s in seeds}), seed_means({s: control[s] for s in seeds})
    per_seed = [t_means[s] - c_means[s] for s in seeds]
    one, other = treated[seeds[0]], control[seeds[0]]
    if len(seeds) == 1 and isinstance(one, (list, tuple)) and isinstance(other, (list, tuple)) and len(one) > 1:
        test = paired_test(list(one), list(other), training_pairs=1, method=method, unit=unit)
        test["over"] = repeats
    else:
        test = paired_test([t_means[s] for s in seeds], [c_means[s] for s in seeds], training_pairs=len(seeds),
                           method=method, unit=unit)
        test["over"] = "seeds"
    return {**test, "seeds": seeds, "per_seed": per_seed}


def paired_by_pretraining(treated: dict[tuple[int, int], float], control: dict[tuple[int, int], float], *,
                          repeats: str, method: Literal["t", "bootstrap"] = "t") -> dict:
    """:func:`paired_by_seed` of fine-tunes: ``{(pretraining seed, fine-tuning seed): value}`` maps. The
    independent pairs are the pretrained pairs (same pretraining seed on both sides); the fine-tuning
    seeds (``repeats``: VTAB or segmentation seeds, LiT seeds) both sides share within a pretrained pair
    are paired by seed and averaged within it, so they narrow that pair's estimate and never count as
    training runs: one pretrained pair is ``not resolved (1 pretraining run)``."""
    nested: tuple[dict, dict] = ({}, {})
    for pre in sorted({k[0] for k in treated} & {k[0] for k in control}):
        shared = sorted({k[1] for k in treated if k[0] == pre} & {k[1] for k in control if k[0] == pre})
        for side, runs in zip(nested, (treated, control)):
            side[pre] = [runs[pre, s] for s in shared]
    return paired_by_seed(*nested, method=method, repeats=repeats, unit="pretraining run")


def verdict_text(delta: dict) -> str:
    """A Δ's verdict as the reports print it: ``not resolved (1 training run)`` where too few training
    runs are why; the verdict alone otherwise."""
    return delta["verdict"] + (f" ({delta['why']})" if delta.get("why") else "")


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
