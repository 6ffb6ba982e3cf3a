"""What DPN's first LayerNorm removes from the study's images, measured (the study report's last section).

The DPN stem normalises every flattened patch to zero mean and unit variance before its dense layer, so a
patch's mean (brightness) and standard deviation (contrast) never reach the model: patches that differ
only by them give the same token, and every constant patch (empty background, a fully inked or a
uniformly coloured patch alike) gives the LayerNorm's bias. That is 2 of the 768 numbers of a 16 x 16 RGB
patch at the paper's scale, but 2 of 49 or 16 on the study's 28-px grey images at patch 7 or 4.
Two measurements per dataset and patch size, on the same train / test splits as the study's cells:

* a census of patches: constant ones (everything about them is removed), constant ones that are not
  background (they become indistinguishable from it), and low-contrast ones (standard deviation under
  one grey level), whose faint variation the LayerNorm scales up to unit variance;
* linear probes, big_vision's least-squares probe (:func:`dpnrepro.evaluation.fewshot.fit_lsr`) fitted on
  the whole train split, top-1 on the test split: on the raw pixels (the conv stem's input), on each
  patch's mean and standard deviation alone (what the LayerNorm removes), and on the normalised patches
  (what it passes on). The probes are linear, so they bound nothing about what a ViT can learn; they
  say how much class information lies, linearly readable, in what the first LayerNorm removes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from dpnrepro.config.core import arch_name
from dpnrepro.model_spec import LN_EPS, parse_arch  # LN_EPS: the DPN stem's LayerNorm eps
from dpnrepro.study.config import StudyParams

METRICS_NAME = "study_probe.json"  # under metrics/ (stage study_probe); the report reads it when present
GREY_LEVEL = 2.0 / 255.0  # one grey level on the model's input scale, value_range(-1, 1)
PROBE_FEATURES = {
    "pixels": "raw pixels (the conv stem's input)",
    "patch_mean_std": "per-patch mean and std only (what DPN's first LN removes)",
    "normalized_patches": "LN-normalised patches (what DPN's first LN passes on)",
}


def to_model_scale(images: np.ndarray) -> np.ndarray:
    """uint8 ``(N, H, W)`` grey images -> float64 in [-1, 1], as the model sees them."""
    return images.astype(np.float64) / 127.5 - 1.0


def patchify(images: np.ndarray, patch: int) -> np.ndarray:
    """``(N, H, W)`` -> ``(N, (H // patch) * (W // patch), patch * patch)``: row-major patches, each
    flattened row by row (the order of the stem's patchify; which order does not change any statistic)."""
    n, h, w = images.shape
    if h % patch or w % patch:
        raise ValueError(f"image {h}x{w} is not divisible into {patch}x{patch} patches")
    x = images.reshape(n, h // patch, patch, w // patch, patch).transpose(0, 1, 3, 2, 4)
    return x.reshape(n, (h // patch) * (w // patch), patch * patch)


def patch_features(images: np.ndarray, patch: int) -> dict[str, np.ndarray]:
    """The three probe inputs (:data:`PROBE_FEATURES`), each ``(N, D)``, from images on the model's scale."""
    x = patchify(images, patch)
    mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)
    normed = (x - mean) / np.sqrt(var + LN_EPS)
    n = len(x)
    return {"pixels": x.reshape(n, -1),
            "patch_mean_std": np.concatenate([mean[..., 0], np.sqrt(var[..., 0])], axis=1),
            "normalized_patches": normed.reshape(n, -1)}


def patch_census(images: np.ndarray, patch: int) -> dict:
    """Shares (%) of all patches that are constant, constant but not background (the image's darkest
    value, -1), and low-contrast (0 < std < one grey level)."""
    x = patchify(images, patch)
    std, mean = x.std(axis=-1), x.mean(axis=-1)
    constant = std == 0
    total = std.size
    return {"patches": int(total),
            "constant_pct": round(100.0 * constant.sum() / total, 2),
            "constant_not_background_pct": round(100.0 * (constant & (mean > -1.0)).sum() / total, 2),
            "low_contrast_pct": round(100.0 * ((std > 0) & (std < GREY_LEVEL)).sum() / total, 2)}


def probe_accuracies(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray], patch: int,
                     num_classes: int) -> dict:
    """Test top-1 (%) and correct count of the least-squares probe on each of :data:`PROBE_FEATURES`."""
    from dpnrepro.evaluation.fewshot import fit_lsr

    train_f, test_f = patch_features(train[0], patch), patch_features(test[0], patch)
    out = {}
    for name in PROBE_FEATURES:
        probe = fit_lsr(train_f[name], train[1], num_classes)
        correct = int((probe.predict(test_f[name]) == test[1]).sum())
        out[name] = {"dims": int(train_f[name].shape[1]), "correct": correct,
                     "top1": round(100.0 * correct / len(test[1]), 2)}
    return out


def load_images(prepared_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A prepared split's grey images on the model's scale ``(N, H, W)`` and labels ``(N,)``."""
    import datasets

    from dpnrepro.data.loader import load_split
    from dpnrepro.data.pixel_store import _decode

    ds = load_split(prepared_dir, split)
    side = max(ds[0]["image"].size)
    raw = ds.cast_column("image", datasets.Image(decode=False))["image"]
    images = np.stack([_decode(item, side)[..., 0] for item in raw])
    return to_model_scale(images), np.asarray(ds["label"], dtype=np.int64)


def run_probes(params: StudyParams) -> dict:
    """Census and probes for every study dataset at every patch size of the comparison."""
    from dpnrepro.study.run import prepare_study_dataset

    patches = sorted({parse_arch(arch_name(arch))[1] for arch in params.comparison.archs}, reverse=True)
    out = {"profile": "study", "ln_eps": LN_EPS, "grey_level": GREY_LEVEL, "features": PROBE_FEATURES,
           "datasets": {}}
    for name, dataset in params.datasets.items():
        with tempfile.TemporaryDirectory(prefix="dpnrepro-probe-") as tmp:
            prepared = prepare_study_dataset(dataset, Path(tmp))
            train, test = load_images(prepared, "train"), load_images(prepared, "val")
        entry = {"train_examples": len(train[1]), "test_examples": len(test[1]), "patch": {}}
        for p in patches:
            entry["patch"][str(p)] = {"census": patch_census(train[0], p),
                                      "probes": probe_accuracies(train, test, p, dataset.data.num_classes)}
        out["datasets"][name] = entry
    return out
