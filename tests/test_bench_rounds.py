"""The benchmarks' statistics (dpnrepro.benchmarks.rounds) against hand computations, and the verdicts and
reports built on them from hand-made timings (no timing is run here)."""
from __future__ import annotations

import math

import pytest
from scipy.stats import binom

from dpnrepro.benchmarks.rounds import compare, median_ci, ratio_summary, round_orders, target_verdict


def test_median_ci_ten_values_by_hand():
    # n = 10: P(Bin(10, 1/2) <= 1) = 11/1024 -> [x_(2), x_(9)] covers 1 - 22/1024 = 97.85 %; k = 3 would
    # cover only 1 - 2 * 56/1024 = 89.1 %. Order of the input does not matter.
    med, lo, hi, cov = median_ci([7, 3, 10, 1, 5, 9, 2, 8, 6, 4])
    assert (med, lo, hi) == (5.5, 2, 9)
    assert cov == pytest.approx(1 - 22 / 1024, abs=0)


def test_median_ci_twenty_values_by_hand():
    # n = 20: sum_{i<=5} C(20, i) = 1 + 20 + 190 + 1140 + 4845 + 15504 = 21700 -> [x_(6), x_(15)], 95.86 %
    med, lo, hi, cov = median_ci(list(range(1, 21)))
    assert (med, lo, hi) == (10.5, 6, 15)
    assert cov == pytest.approx(1 - 2 * 21700 / 2 ** 20, abs=0)


@pytest.mark.parametrize("n", [6, 7, 9, 12, 15, 20, 31, 50])
def test_median_ci_coverage_matches_binomial(n):
    """The interval is the widest-k one with exact binomial coverage >= 95 % (scipy's Bin cdf as reference)."""
    _, lo, hi, cov = median_ci(list(range(1, n + 1)))
    k = int(lo)
    assert hi == n - k + 1
    assert cov == pytest.approx(1 - 2 * binom.cdf(k - 1, n, 0.5), rel=1e-12)
    assert cov >= 0.95 and 1 - 2 * binom.cdf(k, n, 0.5) < 0.95


def test_median_ci_too_few_rounds():
    # n = 5: even [x_(1), x_(5)] covers only 1 - 2/32 = 93.75 % < 95 %
    assert median_ci([1, 2, 3, 4, 5]) == (3, None, None, None)
    assert median_ci([1, 2, 3, 4, 5, 6])[1:] == (1, 6, 1 - 2 / 64)
    with pytest.raises(ValueError):
        median_ci([])


def test_paired_ratio_by_hand():
    # the reference drifts 2x between rounds; per-round ratios are 1.01 1.02 1.03 1.01 0.99 1.05
    conv = [100, 200, 100, 200, 100, 200]
    dpn = [101, 204, 103, 202, 99, 210]
    s = ratio_summary(dpn, conv)
    assert s["n"] == 6
    assert s["median"] == pytest.approx(1.015)  # (1.01 + 1.02) / 2
    assert (s["lo"], s["hi"]) == (pytest.approx(0.99), pytest.approx(1.05))
    assert compare(s, above="slower", below="faster") == "not resolved"  # CI contains 1
    # as an overhead: +1.5 % [-1 %, +5 %] against a 3 % target: the CI spans it
    assert target_verdict(100 * (s["lo"] - 1), 100 * (s["hi"] - 1), "<=", 3.0) == "not resolved"
    assert target_verdict(100 * (s["lo"] - 1), 100 * (s["hi"] - 1), "<=", 6.0) == "met"


def test_pairing_cancels_drift():
    # a constant 2 % overhead under heavy drift: paired ratios are all 1.02, so the CI is [1.02, 1.02]
    conv = [100, 180, 90, 300, 120, 95, 250, 110]
    dpn = [1.02 * c for c in conv]
    s = ratio_summary(dpn, conv)
    assert s["median"] == pytest.approx(1.02) and s["lo"] == pytest.approx(1.02) and s["hi"] == pytest.approx(1.02)
    assert compare(s, above="slower", below="faster") == "slower"
    assert compare(ratio_summary(conv, dpn), above="slower", below="faster") == "faster"
    assert target_verdict(100 * (s["lo"] - 1), 100 * (s["hi"] - 1), "<=", 1.0) == "not met"
    with pytest.raises(ValueError, match="length"):
        ratio_summary([1, 2], [1, 2, 3])


@pytest.mark.parametrize("lo, hi, op, thr, want", [
    (0.5, 2.0, "<=", 3.0, "met"),
    (1.0, 3.0, "<=", 3.0, "met"),  # the bound itself satisfies <=
    (2.0, 4.0, "<=", 3.0, "not resolved"),
    (3.5, 5.0, "<=", 3.0, "not met"),
    (51.0, 60.0, ">=", 50.0, "met"),
    (45.0, 55.0, ">=", 50.0, "not resolved"),
    (30.0, 49.9, ">=", 50.0, "not met"),
    (None, None, "<=", 3.0, "not resolved"),  # no CI (fewer than 6 rounds)
])
def test_target_verdict(lo, hi, op, thr, want):
    assert target_verdict(lo, hi, op, thr) == want


def test_round_orders_are_seeded_permutations():
    names = ["conv", "linear", "dpn", "timm"]
    orders = round_orders(names, 20, seed=0)
    assert orders == round_orders(names, 20, seed=0)  # same schedule for the same seed
    assert orders != round_orders(names, 20, seed=1)
    assert all(sorted(o) == sorted(names) for o in orders)
    assert len({tuple(o) for o in orders}) > 1  # reshuffled, not one fixed order
    assert {o[0] for o in orders} == set(names)  # every model gets to go first


def _cuda_result(ci_b16, ci_ti16, mfu_ci):
    from dpnrepro.benchmarks.train_throughput import _evaluate_targets

    results = {"B-16": {"dpn": {"mfu_pct": sum(mfu_ci) / 2, "mfu_pct_ci": mfu_ci}, "conv": {}},
               "Ti-16": {"dpn": {}, "conv": {}}}
    comparisons = {"B-16": {"dpn_vs_conv": {"median_pct": sum(ci_b16) / 2, "ci_pct": ci_b16}},
                   "Ti-16": {"dpn_vs_conv": {"median_pct": sum(ci_ti16) / 2, "ci_pct": ci_ti16}}}
    return results, comparisons, _evaluate_targets


def test_gpu_targets_use_the_ci():
    results, comparisons, evaluate = _cuda_result([0.2, 0.8], [1.0, 4.0], [48.0, 53.0])
    t = evaluate(results, comparisons, device_type="cuda", device_name="NVIDIA H100 80GB HBM3")
    assert t["b16_dpn_overhead_pct"]["verdict"] == "met"  # [0.2, 0.8] <= 1
    assert t["ti16_dpn_overhead_pct"]["verdict"] == "not resolved"  # [1, 4] spans 3
    assert t["b16_dpn_mfu_pct"]["verdict"] == "not resolved"  # [48, 53] spans 50
    # MFU is defined on an H100; overheads are evaluated on any GPU
    t = evaluate(results, comparisons, device_type="cuda", device_name="NVIDIA A100-SXM4-80GB")
    assert t["b16_dpn_mfu_pct"]["verdict"] == "not evaluated" and "H100" in t["b16_dpn_mfu_pct"]["note"]
    assert t["b16_dpn_overhead_pct"]["verdict"] == "met"
    # CPU: GPU targets are not evaluated whatever the numbers
    t = evaluate(results, comparisons, device_type="cpu", device_name="CPU x")
    assert all(e["verdict"] == "not evaluated" and "CPU" in e["note"] for e in t.values())


def test_input_report_from_hand_made_rounds():
    from dpnrepro.benchmarks.input_pipeline import render_markdown

    pil = [100.0, 50.0, 100.0, 50.0, 100.0, 50.0]  # drifting machine
    fast = [200.0, 110.0, 190.0, 100.0, 210.0, 95.0]  # per-round ratios 2.0 2.2 1.9 2.0 2.1 1.9
    backends = {b: {"img_per_s_per_core": median_ci(v)[0], "img_per_s_per_core_ci": list(median_ci(v)[1:3]),
                    "wall_img_per_s": 1.0} for b, v in {"pil": pil, "fast": fast, "fast_pixels": fast}.items()}
    s = ratio_summary(fast, pil)
    assert s["median"] == pytest.approx(2.0) and (s["lo"], s["hi"]) == (pytest.approx(1.9), pytest.approx(2.2))
    sp = {"median": s["median"], "ci": [s["lo"], s["hi"]], "ci_coverage": s["coverage"],
          "resolved": compare(s, above="faster", below="slower")}
    res = {"hardware": "cpu", "omp_num_threads": "1", "image_source": "x", "images": [{"name": "a", "size": [1, 2]}],
           "op_chain": "chain", "rounds": 6, "n_per_round": 1, "seed": 0, "backends": backends,
           "speedups": {"fast_over_pil": sp, "fast_pixels_over_pil": sp}}
    md = render_markdown(res)
    assert "`fast` **2.00x** [1.90, 2.20] (faster)" in md
    assert "| `pil` | 75.0 [50.0, 100.0] |" in md
    assert "96.9 % with 6 rounds" in md
    assert not math.isnan(s["coverage"])
