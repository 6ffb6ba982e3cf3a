"""Interleaved timing rounds and the statistics the benchmark reports draw from them.

Design (both benchmarks): every round times one block of work for every contender, in an order that is
reshuffled each round with a fixed seed (:func:`round_orders`), so slow drift of the machine (clock
boost, other load, thermal state) hits every contender alike. A comparison A vs B is the per-round
ratio ``time_A / time_B`` (paired by round); its summary is the **median ratio over rounds** with a
**distribution-free 95 % confidence interval for the median from order statistics**
(:func:`median_ci`): for ``n`` sorted values the interval ``[x_(k), x_(n-k+1)]`` covers the population
median with probability ``1 - 2 P(Bin(n, 1/2) <= k - 1)``, whatever the distribution of the ratios
(they only need to be independent draws of one distribution); ``k`` is the largest for which that is
at least 95 %. No resampling, no seed, so the interval is a pure function of the timings. Fewer than 6
rounds cannot give a 95 % interval (``2 / 2**5 > 0.05``): the CI is then ``None`` and verdicts say
"not resolved".
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

__all__ = ["MIN_ROUNDS", "compare", "median_ci", "ratio_summary", "round_orders", "target_verdict"]

LEVEL = 0.95
MIN_ROUNDS = 6  # the smallest n with 1 - 2 / 2**n >= 0.95


def round_orders(names: Sequence[str], rounds: int, seed: int) -> list[list[str]]:
    """The order in which ``names`` run in each of ``rounds`` rounds: a fresh shuffle per round from
    ``random.Random(seed)`` (the same schedule on every machine for one seed)."""
    rng = random.Random(seed)
    orders = []
    for _ in range(rounds):
        order = list(names)
        rng.shuffle(order)
        orders.append(order)
    return orders


def median_ci(values: Sequence[float], level: float = LEVEL) -> tuple[float, float | None, float | None, float | None]:
    """``(median, lo, hi, coverage)``: the sample median and the order-statistic interval
    ``[x_(k), x_(n-k+1)]`` with the largest ``k`` whose exact coverage ``1 - 2 P(Bin(n, 1/2) <= k-1)``
    is at least ``level``; ``lo = hi = coverage = None`` when ``n`` is too small for ``level``."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_ci needs at least one value")
    med = statistics.median(xs)
    tail, k = 0, 0  # tail = sum_{i < k} C(n, i); coverage of [x_(k), x_(n-k+1)] = 1 - 2 tail / 2**n
    best = None
    while k + 1 <= n - k:  # candidate k+1 keeps lo index <= hi index
        tail += math.comb(n, k)
        k += 1
        coverage = 1 - 2 * tail / 2 ** n
        if coverage < level:
            break
        best = (k, coverage)
    if best is None:
        return med, None, None, None
    k, coverage = best
    return med, xs[k - 1], xs[n - k], coverage


def ratio_summary(a: Sequence[float], b: Sequence[float]) -> dict:
    """Per-round ratios ``a[r] / b[r]`` of two paired series and their median with its 95 % CI."""
    if len(a) != len(b):
        raise ValueError(f"paired series differ in length ({len(a)} vs {len(b)})")
    ratios = [x / y for x, y in zip(a, b)]
    med, lo, hi, cov = median_ci(ratios)
    return {"n": len(ratios), "median": med, "lo": lo, "hi": hi, "coverage": cov, "ratios": ratios}


def compare(summary: dict, *, above: str, below: str, neutral: float = 1.0) -> str:
    """``above`` if the CI lies wholly above ``neutral``, ``below`` if wholly below, else "not resolved"."""
    lo, hi = summary["lo"], summary["hi"]
    if lo is None:
        return "not resolved"
    if lo > neutral:
        return above
    if hi < neutral:
        return below
    return "not resolved"


def target_verdict(lo: float | None, hi: float | None, op: str, threshold: float) -> str:
    """"met" / "not met" / "not resolved" for a target ``value op threshold`` (``op`` ``<=`` or ``>=``)
    given the value's 95 % CI ``[lo, hi]``: met when the whole CI satisfies it, not met when none of it
    does, not resolved when the CI spans the threshold (or there is no CI)."""
    if lo is None or hi is None:
        return "not resolved"
    if op == "<=":
        return "met" if hi <= threshold else "not met" if lo > threshold else "not resolved"
    if op == ">=":
        return "met" if lo >= threshold else "not met" if hi < threshold else "not resolved"
    raise ValueError(f"unknown op {op!r}")
