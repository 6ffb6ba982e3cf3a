"""The statistics module every table uses, checked against scipy and hand computations."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from dpnrepro.stats import MIN_PAIRS, fmt_p, mean_ci95, paired_by_seed, paired_test, verdict_text

DPN = [74.1, 73.8, 74.3, 73.9, 74.0]
BASE = [72.2, 72.0, 72.1, 72.3, 71.9]


def test_mean_ci95_is_scipy_t_interval():
    mean, half = mean_ci95(DPN)
    lo, hi = sps.t.interval(0.95, len(DPN) - 1, loc=np.mean(DPN), scale=sps.sem(DPN))
    assert mean == pytest.approx(np.mean(DPN), abs=1e-12)
    assert (mean - half, mean + half) == pytest.approx((lo, hi), abs=1e-10)
    assert mean_ci95([3.0]) == (3.0, None)


def test_paired_t_matches_scipy_ttest_rel():
    res = paired_test(DPN, BASE, training_pairs=5)
    ref = sps.ttest_rel(DPN, BASE)
    assert res["p"] == pytest.approx(ref.pvalue, rel=1e-9)
    d = np.subtract(DPN, BASE)
    assert res["mean"] == pytest.approx(d.mean(), abs=1e-12)
    # the interval is the t-interval of the differences, not of either side
    assert res["ci95"] == pytest.approx(sps.t.ppf(0.975, 4) * d.std(ddof=1) / math.sqrt(5), rel=1e-9)
    assert res["verdict"] == "better" and res["n"] == 5
    ci = ref.confidence_interval(0.95)
    assert (res["low"], res["high"]) == (float(ci.low), float(ci.high))  # scipy's interval, bit for bit


@pytest.mark.parametrize("n", [2, 3, 4, 7, 10])
def test_paired_t_interval_and_p_are_scipys_for_every_size(n):
    rng = np.random.default_rng(n)
    a, b = rng.normal(70, 2, n), rng.normal(69, 2, n)
    res, ref = paired_test(list(a), list(b), training_pairs=n), sps.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    assert (res["low"], res["high"], res["p"]) == (float(ci.low), float(ci.high), float(ref.pvalue))
    assert res["ci95"] == pytest.approx((ci.high - ci.low) / 2, rel=1e-12)


def test_pairing_matters():
    # a shared per-seed offset: unpaired the groups overlap, paired the difference is constant-ish
    offsets = [0.0, 5.0, -5.0, 10.0]
    base = [70 + o for o in offsets]
    dpn = [70.5 + o + e for o, e in zip(offsets, [0.01, -0.02, 0.02, -0.01])]
    assert paired_test(dpn, base, training_pairs=4)["verdict"] == "better"
    assert sps.ttest_ind(dpn, base).pvalue > 0.5  # an unpaired test would not see it


def test_paired_by_seed_pairs_the_shared_seeds_only():
    treated = {s: v for s, v in enumerate(DPN)}
    control = {s: v for s, v in enumerate(BASE) if s != 2} | {7: 0.0}  # seed 2 missing, seed 7 unmatched
    res = paired_by_seed(treated, control)
    keep = [0, 1, 3, 4]
    assert res["seeds"] == keep and res["n"] == 4
    assert res["per_seed"] == [DPN[s] - BASE[s] for s in keep]
    assert res["p"] == paired_test([DPN[s] for s in keep], [BASE[s] for s in keep], training_pairs=4)["p"]


def test_verdicts_and_unresolved_cases():
    assert paired_test(BASE, DPN, training_pairs=5)["verdict"] == "worse"
    noisy = paired_test([1.0, -1.0, 2.0], [0.0, 0.0, 0.0], training_pairs=3)
    assert noisy["verdict"] == "not resolved" and noisy["p"] > 0.05 and "why" not in noisy
    one = paired_test([74.0], [72.0], training_pairs=1)
    assert one["verdict"] == "not resolved" and one["p"] is None and one["ci95"] is None
    assert verdict_text(one) == "not resolved (1 training run)"
    same = paired_test([1.0, 2.0, 3.0], [0.0, 1.0, 2.0], training_pairs=3)  # zero variance: t undefined, interval [1, 1]
    assert same["p"] is None and same["verdict"] == "better"
    with pytest.raises(ValueError, match="same seeds"):
        paired_test([1.0, 2.0], [1.0], training_pairs=1)


def test_the_pair_count_is_required_and_checked():
    with pytest.raises(TypeError):
        paired_test(DPN, BASE)
    for bad in (0, 6, 2.0, True):
        with pytest.raises(ValueError, match="training_pairs"):
            paired_test(DPN, BASE, training_pairs=bad)


# Table 2's jft_220k Mu/7 smoke block: one trained pair, few-shot accuracy of 5 draws of the shots each.
ONE_RUN_DPN = {0: [61.2, 63.0, 60.5, 62.4, 61.9]}
ONE_RUN_CONV = {0: [55.0, 56.1, 54.2, 56.3, 55.4]}


def test_draws_of_one_training_run_never_decide():
    many = {0: [60.0 + 0.01 * i for i in range(50)]}, {0: [50.0 + 0.01 * i for i in range(50)]}
    for treated, control in (many, (ONE_RUN_DPN, ONE_RUN_CONV)):
        res = paired_by_seed(treated, control)
        assert res["mean"] > 5 and res["low"] > 0  # the draws' spread excludes 0 ...
        assert res["verdict"] == "not resolved" and res["over"] == "few-shot draws"  # ... it is not training noise
        assert res["training_pairs"] == 1 and verdict_text(res) == "not resolved (1 training run)"
    draws = paired_test(ONE_RUN_DPN[0], ONE_RUN_CONV[0], training_pairs=1)
    assert draws["low"] > 0 and draws["verdict"] == "not resolved"


def test_draws_are_averaged_within_a_seed_and_the_test_is_over_seeds():
    treated = {s: [70.0 + s + d for d in (0.0, 0.4, 0.8)] for s in range(4)}
    control = {s: [69.0 + s + 0.3 * (s % 2) + d for d in (0.0, 0.4, 0.8)] for s in range(4)}
    res = paired_by_seed(treated, control)
    per_seed = [1.0 - 0.3 * (s % 2) for s in range(4)]
    assert res["per_seed"] == pytest.approx(per_seed) and res["n"] == res["training_pairs"] == 4
    ref = paired_test([sum(v) / 3 for v in treated.values()], [sum(v) / 3 for v in control.values()], training_pairs=4)
    assert (res["mean"], res["ci95"], res["p"]) == pytest.approx((ref["mean"], ref["ci95"], ref["p"]))
    assert res["over"] == "seeds" and res["verdict"] == "better"


@pytest.mark.parametrize("seeds", range(1, MIN_PAIRS))
def test_fewer_than_three_training_seeds_never_decide(seeds):
    treated = {s: [90.0 + 0.001 * s] * 4 for s in range(seeds)}
    control = {s: [10.0] * 4 for s in range(seeds)}
    for res in (paired_by_seed(treated, control),
                paired_test([90.0 + 0.001 * s for s in range(seeds)], [10.0] * seeds, training_pairs=seeds),
                paired_test([90.0, 90.1, 90.2, 90.3], [10.0] * 4, training_pairs=seeds)):
        assert res["verdict"] == "not resolved"
        assert res["why"] == f"{seeds} training run{'s' if seeds > 1 else ''}"


def test_draws_not_averaged_within_a_seed_never_decide():
    res = paired_test([90.0, 90.1, 90.2, 90.3, 90.4, 90.5], [10.0] * 6, training_pairs=3)
    assert res["low"] > 0 and res["verdict"] == "not resolved"


# Table 3's structured mean, Mu/7 smoke: the per-seed DPN − conv differences of the committed result (AMD,
# +7.78 ± 8.47) and ones with the mean ± CI another CPU gave from the same code (Intel, +7.47 ± 4.59).
STRUCTURED_AMD = [50.77777777777778 - 43.666666666666664, 51.166666666666664 - 42.72222222222222]
STRUCTURED_INTEL = [7.47 - 0.3612, 7.47 + 0.3612]


def test_a_verdict_needs_three_pairs_so_last_bit_noise_on_two_seeds_decides_nothing():
    amd, intel = (paired_test(d, [0.0, 0.0], training_pairs=2) for d in (STRUCTURED_AMD, STRUCTURED_INTEL))
    assert (amd["mean"], amd["ci95"]) == pytest.approx((7.78, 8.47), abs=0.005)
    assert (intel["mean"], intel["ci95"]) == pytest.approx((7.47, 4.59), abs=0.005)
    assert amd["low"] < 0 < intel["low"]  # the CI alone says "not resolved" on one CPU, "better" on the other
    assert amd["verdict"] == intel["verdict"] == "not resolved"
    assert paired_by_seed({0: 9.0, 1: 9.1}, {0: 1.0, 1: 1.0})["verdict"] == "not resolved"
    assert paired_by_seed({0: 9.0, 1: 9.1, 2: 9.05}, {0: 1.0, 1: 1.0, 2: 1.0})["verdict"] == "better"


def test_t_verdict_agrees_with_p_below_alpha():
    rng = np.random.default_rng(3)
    for _ in range(200):
        a = rng.normal(0.3, 1.0, 4)
        b = rng.normal(0.0, 1.0, 4)
        r = paired_test(a, b, training_pairs=4)
        assert (r["verdict"] != "not resolved") == (r["p"] < 0.05)


def test_bootstrap_is_seeded_and_matches_hand_computation():
    r1 = paired_test(DPN, BASE, training_pairs=5, method="bootstrap", resamples=2000, seed=7)
    r2 = paired_test(DPN, BASE, training_pairs=5, method="bootstrap", resamples=2000, seed=7)
    assert r1 == r2
    ref = sps.bootstrap((np.array(DPN), np.array(BASE)), lambda t, c, axis: np.mean(t - c, axis=axis),
                        paired=True, vectorized=True, n_resamples=2000, method="percentile",
                        rng=np.random.default_rng(7))
    assert (r1["low"], r1["high"]) == (float(ref.confidence_interval.low), float(ref.confidence_interval.high))
    d = np.subtract(DPN, BASE)
    means = d[np.random.default_rng(7).integers(0, 5, size=(2000, 5))].mean(axis=1)  # 2000 resamples of 5 pairs
    assert (r1["low"], r1["high"]) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    assert r1["p"] == 0.0 and r1["verdict"] == "better"  # every resampled mean is above 0
    assert paired_test(DPN, BASE, training_pairs=5, method="bootstrap", resamples=2000, seed=8) != r1
    mixed = paired_test([1.0, -1.0, 0.5, -0.4], [0, 0, 0, 0], training_pairs=4, method="bootstrap", resamples=4000)
    assert 0.3 < mixed["p"] <= 1 and mixed["verdict"] == "not resolved"


def test_fmt_p():
    assert fmt_p(None) == "—" and fmt_p(0.0004) == "<0.001" and fmt_p(0.04432) == "0.0443"
