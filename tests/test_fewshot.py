"""Few-shot linear evaluation: big_vision's fewshot_lsr closed form, shot draws, features, run-level API."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch

from conftest import data_cfg
from dpnrepro.errors import DatasetError
from dpnrepro.evaluation import fewshot
from dpnrepro.evaluation.fewshot import (
    BIAS_CONSTANT,
    L2_REG,
    POOL_SEED,
    STD_EPS,
    draw_shots,
    evaluate_fewshot_run,
    extract_features,
    fewshot_from_features,
    fewshot_input,
    fewshot_lsr_accuracy,
    fit_lsr,
    pool_indices,
)
from dpnrepro.stats import mean_ci95


def _problem(n_train, n_test, dim, classes, seed=0, noise=3.0):
    """Gaussian class clusters with a large common offset and uneven feature scales."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, dim))
    scales = rng.uniform(0.1, 10.0, size=dim)
    offset = rng.normal(scale=50.0, size=dim)

    def sample(n):
        y = np.arange(n) % classes
        x = (centers[y] + noise * rng.normal(size=(n, dim))) * scales + offset
        return x.astype(np.float32), y

    return (*sample(n_train), *sample(n_test))


# --- independent references ------------------------------------------------------------------------

def _design(x, mean, std):
    z = (np.asarray(x, np.float64) - mean) / std
    return np.hstack([z, np.full((len(z), 1), BIAS_CONSTANT)])


def _train_stats(x):
    x = np.asarray(x, np.float64)
    return x.mean(0), x.std(0) + STD_EPS


def lstsq_reference(tr_x, tr_y, te_x, classes, l2):
    """Ridge as an ordinary least-squares problem on the augmented system [A; sqrt(l2) I] W = [Y; 0]."""
    mean, std = _train_stats(tr_x)
    a = _design(tr_x, mean, std)
    y = np.where(np.arange(classes)[None] == tr_y[:, None], 1.0, -1.0)
    a_aug = np.vstack([a, np.sqrt(l2) * np.eye(a.shape[1])])
    y_aug = np.vstack([y, np.zeros((a.shape[1], classes))])
    w = np.linalg.lstsq(a_aug, y_aug, rcond=None)[0]
    return _design(te_x, mean, std) @ w, w


def eigen_reference(tr_x, tr_y, te_x, classes, l2):
    """big_vision's cached formulation: eigh of A^T A (N >= D) or A A^T (N < D), lhs diag(1/(e+l2)) rhs."""
    mean, std = _train_stats(tr_x)
    a = _design(tr_x, mean, std)
    y = 2.0 * np.eye(classes)[tr_y] - 1.0
    if a.shape[0] >= a.shape[1]:
        eigs, q = np.linalg.eigh(a.T @ a)
        lhs, rhs = q, q.T @ (a.T @ y)
    else:
        eigs, q = np.linalg.eigh(a @ a.T)
        lhs, rhs = a.T @ q, q.T @ y
    w = (lhs / (eigs + l2)[None, :]) @ rhs
    return _design(te_x, mean, std) @ w, w


# --- closed form -----------------------------------------------------------------------------------

@pytest.mark.parametrize("n_train,dim", [(250, 16), (40, 64), (30, 29), (29, 29)])  # primal, dual, edges
def test_closed_form_matches_lstsq_and_eigen_formulation(n_train, dim):
    classes = 5
    tr_x, tr_y, te_x, te_y = _problem(n_train, 97, dim, classes, seed=n_train + dim)
    probe = fit_lsr(tr_x, tr_y, classes, L2_REG)
    assert probe.weights.shape == (dim + 1, classes)
    for ref in (lstsq_reference, eigen_reference):
        ref_scores, ref_w = ref(tr_x, tr_y, te_x, classes, L2_REG)
        np.testing.assert_allclose(probe.weights, ref_w, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(probe.scores(te_x), ref_scores, rtol=1e-9, atol=1e-10)
        acc = fewshot_lsr_accuracy(tr_x, tr_y, te_x, te_y, classes)
        assert acc == float(np.mean(np.argmax(ref_scores, 1) == te_y))


def test_l2_reg_matters_and_defaults_to_2_pow_10():
    tr_x, tr_y, te_x, _ = _problem(40, 64, 64, 4, seed=1)
    assert L2_REG == 1024.0
    w_default = fit_lsr(tr_x, tr_y, 4).weights
    np.testing.assert_array_equal(w_default, fit_lsr(tr_x, tr_y, 4, 2.0 ** 10).weights)
    assert not np.allclose(w_default, fit_lsr(tr_x, tr_y, 4, 1.0).weights)
    np.testing.assert_allclose(fit_lsr(tr_x, tr_y, 4, 3.0).weights, lstsq_reference(tr_x, tr_y, te_x, 4, 3.0)[1],
                               rtol=1e-8, atol=1e-10)


def test_whitening_uses_only_fewshot_train_statistics():
    tr_x, tr_y, te_x, te_y = _problem(60, 30, 8, 3, seed=2)
    probe = fit_lsr(tr_x, tr_y, 3)
    np.testing.assert_allclose(probe.mean[0], tr_x.astype(np.float64).mean(0))
    np.testing.assert_allclose(probe.std[0], tr_x.astype(np.float64).std(0) + 1e-5)
    # each test prediction is independent of the rest of the test set (no test statistics); up to
    # rounding only: another batch shape may take another BLAS kernel (bits are guaranteed per shape)
    full = probe.scores(te_x)
    np.testing.assert_allclose(full[:5], probe.scores(te_x[:5]), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(full[7:8], probe.scores(te_x[7:8]), rtol=1e-10, atol=1e-10)

    # A test set that is all one class: whitening it with its own statistics would collapse it to
    # the origin; with the train statistics it stays on its class's side.
    x = np.array([[-1.0, 0.2], [-1.2, -0.1], [1.0, 0.1], [1.1, -0.3]] * 3)
    y = np.array([0, 0, 1, 1] * 3)
    test = np.array([[1.05, 0.0]] * 6)
    assert fewshot_lsr_accuracy(x, y, test, np.ones(6, int), 2) == 1.0
    assert fewshot_lsr_accuracy(x, y, -test, np.zeros(6, int), 2) == 1.0


def test_linearly_separable_toy_problem_is_solved():
    tr_x, tr_y, te_x, te_y = _problem(10 * 25, 500, 32, 10, seed=3, noise=0.05)
    assert fewshot_lsr_accuracy(tr_x, tr_y, te_x, te_y, 10) == 1.0
    # each class raised on its own feature, under a large constant offset and beside nuisance features
    rng = np.random.default_rng(4)

    def sample(y):
        x = np.c_[np.eye(3)[y] * 10.0 + rng.uniform(-1, 1, (len(y), 3)), rng.uniform(-1, 1, (len(y), 5))]
        return x + 1e4

    y, y_te = np.repeat(np.arange(3), 25), np.arange(300) % 3
    assert fewshot_lsr_accuracy(sample(y), y, sample(y_te), y_te, 3) == 1.0


# --- shots -----------------------------------------------------------------------------------------

def test_draws_are_deterministic_per_seed_and_differ_across_seeds():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=400)
    a = draw_shots(labels, 25, 4, seed=0)
    assert np.array_equal(a, draw_shots(labels, 25, 4, seed=0))
    b = draw_shots(labels, 25, 4, seed=1)
    assert not np.array_equal(np.sort(a), np.sort(b))
    for idx in (a, b):
        assert len(idx) == 100 and len(set(idx.tolist())) == 100
        assert np.array_equal(labels[idx], np.repeat(np.arange(4), 25))  # class-major, 25 each
    # the recipe: one generator per draw, a permutation of each class's indices in class order
    g = np.random.default_rng(1)
    expected = np.concatenate([g.permutation(np.flatnonzero(labels == c))[:25] for c in range(4)])
    assert np.array_equal(b, expected)


def test_too_few_examples_per_class_is_an_error():
    labels = np.array([0] * 30 + [1] * 24 + [2] * 30)
    draw_shots(labels, 24, 3, seed=0)
    with pytest.raises(DatasetError, match=r"class\(es\) \[1\] have only \[24\]"):
        draw_shots(labels, 25, 3, seed=0)
    with pytest.raises(DatasetError, match=r"\[3\]"):  # a class absent from the pool
        draw_shots(labels, 5, 4, seed=0)


def test_pool_bounds_the_draws_and_is_fixed():
    labels = np.repeat(np.arange(10), 100)  # ordered by class, as a prepared imagefolder split
    pool = pool_indices(1000, 300)
    assert len(pool) == 300 and np.all(np.diff(pool) > 0) and 0 <= pool[0] and pool[-1] < 1000
    # a fixed seeded subset (not a prefix): the same every call, every class represented
    np.testing.assert_array_equal(pool, pool_indices(1000, 300))
    np.testing.assert_array_equal(pool, np.sort(np.random.default_rng(POOL_SEED).choice(1000, 300, replace=False)))
    assert set(labels[pool].tolist()) == set(range(10))
    # every draw takes its shots from the pool only, and the same shots for the same seed
    for seed in range(3):
        shots = pool[draw_shots(labels[pool], 10, 10, seed)]
        assert set(shots.tolist()) <= set(pool.tolist()) and len(set(shots.tolist())) == 100
        np.testing.assert_array_equal(shots, pool[draw_shots(labels[pool_indices(1000, 300)], 10, 10, seed)])
    # 0 (or a pool at least as large as the split) = all of it
    np.testing.assert_array_equal(pool_indices(1000, 0), np.arange(1000))
    np.testing.assert_array_equal(pool_indices(1000, 5000), np.arange(1000))
    with pytest.raises(ValueError, match="pool_size"):
        pool_indices(1000, -1)


def test_fewshot_transform_resizes_without_keeping_aspect_then_crops():
    """big_vision's ``resize(16)|central_crop(14)|value_range(-1,1)`` on a 3:1 image of three bands."""
    from PIL import Image

    from dpnrepro.data.loader import build_transform
    from dpnrepro.errors import ParamsError

    rows, cols = np.mgrid[0:16, 0:48]
    image = (100 * (cols // 16) + 2 * rows).astype(np.uint8)  # bands 0 / 100 / 200 (+ 2 x row), 48 wide
    cfg = {"image_size": 14, "channels": 1, "eval_resize": 14}
    x = build_transform(fewshot_input(cfg, 16), train=False)(Image.fromarray(image))
    assert x.shape == (1, 14, 14) and x.dtype == torch.float32
    got = np.rint((x[0].numpy() + 1) * 127.5).astype(int)
    # squeezed to 16 x 16 (each band ~5 columns, rows untouched), then rows and columns 1..14 kept:
    # output column j is squeezed column j + 1; away from the band edges the values are exact
    row = 2 * (np.arange(14) + 1)
    for j, band in [(0, 0), (1, 0), (6, 100), (7, 100), (12, 200), (13, 200)]:
        np.testing.assert_array_equal(got[:, j], band + row, err_msg=f"column {j}")
    # keeping the aspect (resize_small(16)) would have cropped the middle band only
    assert set(np.unique(got[0] - row[0]).tolist()) >= {0, 100, 200}
    assert fewshot_input(cfg, 16)["image_size"] == 14
    with pytest.raises(ParamsError, match=r"fewshot.resize \(12\) is smaller than input.image_size \(14\)"):
        fewshot_input(cfg, 12)


def test_fewshot_from_features_reports_draws_mean_and_ci():
    tr_x, tr_y, te_x, te_y = _problem(300, 100, 12, 3, seed=5, noise=2.0)
    res = fewshot_from_features(tr_x, tr_y, te_x, te_y, 3, shots=(5, 25), draws=3)
    assert set(res) == {5, 25}
    for k, r in res.items():
        assert len(r["draws"]) == 3
        expected = [100 * fewshot_lsr_accuracy(tr_x[i], tr_y[i], te_x, te_y, 3)
                    for i in (draw_shots(tr_y, k, 3, s) for s in range(3))]
        assert r["draws"] == expected
        assert (r["mean"], r["ci95"]) == mean_ci95(expected)
    single = fewshot_from_features(tr_x, tr_y, te_x, te_y, 3, shots=5, draws=1)
    assert single[5]["ci95"] is None and single[5]["draws"] == res[5]["draws"][:1]


# --- features and a run ----------------------------------------------------------------------------

INPUT = {"image_size": 28, "channels": 1, "eval_resize": 28, "workers": 0}


def _spec(**over):
    from dpnrepro.training.trainer import ModelSpec

    kw = dict(arch="Mu/7", stem="dpn", placement="pre-pre", num_classes=10, img_size=28, in_chans=1, pool="tok",
              rep_size=True, head_bias_init=-2.2, pos_drop_rate=0.0, proj_drop_rate=0.0,
              drop_path_rate=0.0)
    return ModelSpec(**{**kw, **over})


def test_extract_features_are_the_pre_logits():
    from PIL import Image

    from dpnrepro.data.loader import build_transform

    rng = np.random.default_rng(0)
    ds = [{"image": Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)), "label": i % 3} for i in range(7)]
    torch.manual_seed(0)
    model = _spec(rep_size=32).build()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    feats, labels = extract_features(model, ds, INPUT, batch_size=3, device="cpu")
    assert feats.shape == (7, 32) and feats.dtype == np.float32
    assert labels.tolist() == [i % 3 for i in range(7)]
    tf = build_transform(INPUT, train=False)
    x = torch.stack([tf(ex["image"]) for ex in ds])
    with torch.no_grad():
        tokens = model.forward_features(x)  # encoder output after the final LayerNorm
        ref = torch.tanh(model.pre_logits.fc(tokens[:, 0]))  # class token -> representation layer
        logits = model(x)
    # batches of 3 against one of 7: float32 rounding of [-1, 1] features, absolute (GEMMs blocked by row count)
    np.testing.assert_allclose(feats, ref.numpy(), rtol=1e-5, atol=1e-5)
    # the head reads exactly these features
    np.testing.assert_allclose(feats @ model.head.weight.detach().numpy().T + model.head.bias.detach().numpy(), logits.numpy(),
                               rtol=1e-5, atol=1e-5)
    assert np.all(np.abs(feats) <= 1.0)  # after the tanh of the representation layer


@pytest.mark.usefixtures("hf_cache_in_tmp")
def test_evaluate_fewshot_run(idx_dataset, tmp_path, monkeypatch):
    from dpnrepro.data.loader import load_split
    from dpnrepro.data.prepare import prepare_dataset
    from dpnrepro.training.checkpoint import MODEL_FILE, save_weights

    prepared = tmp_path / "prepared"
    prepare_dataset(data_cfg(idx_dataset), prepared)  # train: 54 examples, >= 5 of each class
    run = tmp_path / "run"
    run.mkdir()
    spec = _spec()
    torch.manual_seed(0)
    model = spec.build()
    save_weights(model, run / MODEL_FILE)
    (run / "model_spec.json").write_text(json.dumps(asdict(spec)))
    (run / "run.json").write_text(json.dumps({"arch": "Mu/7", "stem": "dpn", "seed": 0, "hardware": "cpu",
                                              "params_m": 0.2}))

    out = evaluate_fewshot_run(run, prepared, INPUT, shots=(1, 5), draws=2, resize=32, batch_size=16,
                               device="cpu", progress=False)
    assert {k: out[k] for k in ("arch", "stem", "seed")} == {"arch": "Mu/7", "stem": "dpn", "seed": 0}
    assert out["fewshot_train_pool"] == 54 and out["fewshot_test_examples"] == 30
    assert out["fewshot_draws"] == 2 and out["fewshot_l2_reg"] == 1024.0
    for k in (1, 5):
        draws = out[f"fewshot{k}_top1_draws"]
        assert len(draws) == 2 and all(0.0 <= d <= 100.0 for d in draws)
        assert (out[f"fewshot{k}_top1"], out[f"fewshot{k}_top1_ci95"]) == mean_ci95(draws)
    again = evaluate_fewshot_run(run, prepared, INPUT, shots=(1, 5), draws=2, resize=32, batch_size=16,
                                 device="cpu", progress=False)
    assert again == out  # deterministic: the same computation gives the same bits
    # independent of the batch size up to rounding (another batch shape may take another kernel)
    train, cfg = load_split(prepared, "train"), fewshot_input(INPUT, 32)
    # features are tanh outputs in [-1, 1]: float32 rounding is absolute (MKL blocks a GEMM by its row count)
    np.testing.assert_allclose(extract_features(model, train, cfg, batch_size=7)[0],
                               extract_features(model, train, cfg, batch_size=16)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(DatasetError, match="25-shot"):
        evaluate_fewshot_run(run, prepared, INPUT, shots=25, draws=1, resize=32, device="cpu", progress=False)

    # the pool: features of exactly the pool's examples, with the few-shot preprocessing
    seen = []
    extract = fewshot.extract_features
    monkeypatch.setattr(fewshot, "extract_features",
                        lambda m, ds, cfg, *a, **kw: seen.append((ds, cfg)) or extract(m, ds, cfg, *a, **kw))
    small = evaluate_fewshot_run(run, prepared, INPUT, shots=1, draws=1, resize=32, pool_size=30, device="cpu",
                                 progress=False)
    assert small["fewshot_train_pool"] == 30
    pool = load_split(prepared, "train").select(pool_indices(54, 30))
    assert [ex["image"].tobytes() for ex in seen[0][0]] == [ex["image"].tobytes() for ex in pool]
    assert seen[0][1] == seen[1][1] == fewshot_input(INPUT, 32) and seen[1][0].num_rows == 30
