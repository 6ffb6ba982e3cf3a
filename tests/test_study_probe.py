"""What DPN's first LayerNorm removes (dpnrepro.study.probe): the patch order, the defining property that
a patch's mean and contrast are gone after it, the census, and the probes on hand-made images."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dpnrepro.study.probe import (GREY_LEVEL, LN_EPS, patch_census, patch_features, patchify, probe_accuracies,
                                  to_model_scale)
from helpers import REPO


def test_patchify_takes_row_major_patches_each_flattened_row_by_row():
    img = np.arange(16, dtype=np.float64).reshape(1, 4, 4)
    p = patchify(img, 2)
    assert p.shape == (1, 4, 4)
    assert p[0].tolist() == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]
    with pytest.raises(ValueError, match="not divisible"):
        patchify(np.zeros((1, 5, 5)), 2)


def test_normalised_patches_match_the_dpn_stems_layernorm_and_lose_mean_and_contrast():
    from dpnrepro.models import build_vit

    stem = build_vit("Mu/7", stem="dpn", img_size=28, in_chans=1, num_classes=10).patch_embed
    assert LN_EPS == stem.norm_in.eps == stem.norm_out.eps
    rng = np.random.default_rng(0)
    shape = rng.random((1, 1, 49))
    # the same shape at three brightnesses and contrasts, then two constant patches (black and white)
    x = np.concatenate([shape, 0.5 * shape + 0.2, 2.0 * shape - 1.0, np.full((1, 1, 49), -1.0),
                        np.full((1, 1, 49), 1.0)], axis=1)
    img = x.reshape(1, 35, 7)  # 5 patches of 7 x 7 stacked into a 35 x 7 strip (one patch per 7 rows)
    f = patch_features(img, 7)
    normed = f["normalized_patches"].reshape(5, 49)
    torch_ln = torch.nn.functional.layer_norm(torch.from_numpy(x[0]), (49,), eps=LN_EPS).numpy()
    np.testing.assert_allclose(normed, torch_ln, atol=1e-9)
    np.testing.assert_allclose(normed[0], normed[1], atol=1e-4)  # brightness and contrast are gone
    np.testing.assert_allclose(normed[0], normed[2], atol=1e-4)
    assert np.array_equal(normed[3], normed[4]) and not normed[3].any()  # black and white: the same token
    mean_std = f["patch_mean_std"][0]
    assert mean_std[:5].tolist() == pytest.approx(x[0].mean(axis=1).tolist())
    assert mean_std[5:].tolist() == pytest.approx(x[0].std(axis=1).tolist())


def test_census_counts_constant_ink_and_low_contrast_patches():
    u8 = np.zeros((1, 4, 12), dtype=np.uint8)  # three 4 x 4 patches: background, ink, faint
    u8[0, :, 4:8] = 255
    u8[0, 0, 8] = 1                            # one pixel one grey level above background
    c = patch_census(to_model_scale(u8), 4)
    assert c["patches"] == 3
    assert c["constant_pct"] == pytest.approx(200 / 3, abs=0.01)
    assert c["constant_not_background_pct"] == pytest.approx(100 / 3, abs=0.01)
    assert c["low_contrast_pct"] == pytest.approx(100 / 3, abs=0.01)
    assert GREY_LEVEL == pytest.approx(2 / 255)


def test_probes_read_the_class_from_brightness_only_when_it_is_kept():
    """Images whose class is the brightness of uniform patches: the mean/std probe reads it, the probe on
    normalised patches (every patch maps to zeros) is at chance, the pixel probe reads it."""
    def images(n, seed):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 2, n)
        level = np.where(y == 1, 200, 60) + rng.integers(-20, 21, n)
        return to_model_scale(np.broadcast_to(level[:, None, None], (n, 8, 8)).astype(np.uint8)), y

    acc = probe_accuracies(images(200, 0), images(100, 1), 4, 2)
    assert acc["patch_mean_std"]["top1"] == 100.0 and acc["pixels"]["top1"] == 100.0
    assert acc["normalized_patches"]["top1"] < 70.0
    assert acc["normalized_patches"]["dims"] == 64 and acc["patch_mean_std"]["dims"] == 8


def test_committed_probe_covers_every_study_dataset_and_patch_size():
    from dpnrepro.study.config import PARAMS_FILE, load_study_params

    params = load_study_params(REPO / PARAMS_FILE)
    probe = json.loads((REPO / "metrics" / "study_probe.json").read_text())
    assert set(probe["datasets"]) == set(params.datasets)
    patches = {a.split("-")[1] for a in params.comparison.archs}
    for d in probe["datasets"].values():
        assert set(d["patch"]) == patches
        for e in d["patch"].values():
            assert set(e["probes"]) == {"pixels", "patch_mean_std", "normalized_patches"}
            assert all(0 <= p["correct"] <= d["test_examples"] for p in e["probes"].values())
