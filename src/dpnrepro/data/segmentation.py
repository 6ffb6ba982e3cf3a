"""Segmentation data: the ADE20K layout, seeded training fractions, and the smoke canvases.

ADE20K (``ADEChallengeData2016``) is read by mmseg's ``ADE20KDataset`` from the user's root::

    <root>/images/{training,validation}/*.jpg
    <root>/annotations/{training,validation}/*.png     0 = "other" (ignored: reduce_zero_label), 1..150

:func:`check_layout` stops with one line when that tree is missing or inconsistent, before a Runner
is built. :func:`fraction_indices` picks a run's training subset (Table 5's 1/16 ... 1): a seeded
permutation per seed, its first ``round(n * fraction)`` images, so the subsets of one seed are nested.

The smoke data uses the same layout and reader (:class:`FashionCanvasDataset`, ``reduce_zero_label``):
canvases composed of real Fashion-MNIST items (Debian's idx files), each pixel labelled with its item's
class where the item's own silhouette is (pixel value above :data:`SILHOUETTE_THRESHOLD`), the rest 0 =
"other", ignored as ADE20K's. Training canvases take items from Fashion-MNIST's train split, validation
canvases from its test split, so no item is seen in both.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np

from dpnrepro.errors import DatasetError

SPLITS = {"train": "training", "val": "validation"}
IMG_SUFFIX, SEG_SUFFIX = ".jpg", ".png"
SILHOUETTE_THRESHOLD = 16  # Fashion-MNIST background is 0; anti-aliased edges below this count as background
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")


def parse_fraction(text: str | float) -> Fraction:
    """``"1/16"`` -> Fraction(1, 16); a fraction must lie in (0, 1]."""
    try:
        value = Fraction(str(text))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"fraction {text!r} is not a number like '1/16' or '0.25'") from None
    if not 0 < value <= 1:
        raise ValueError(f"fraction {text!r} must be in (0, 1]")
    return value


def fraction_indices(n: int, fraction: str | float, seed: int) -> list[int]:
    """Sorted indices of a seeded ``fraction`` of ``n`` training images (at least one).

    The first ``round(n * fraction)`` of ``default_rng(seed).permutation(n)``: nested across
    fractions for one seed, different across seeds."""
    k = max(1, round(n * parse_fraction(fraction)))
    return sorted(int(i) for i in np.random.default_rng(seed).permutation(n)[:k])


def _listing(folder: Path, suffix: str) -> list[str]:
    return sorted(p.name[: -len(suffix)] for p in folder.iterdir() if p.name.endswith(suffix))


def check_layout(root: str | os.PathLike, *, img_suffix: str = IMG_SUFFIX, seg_suffix: str = SEG_SUFFIX) -> dict:
    """Image counts per split of an ADE20K-layout root; DatasetError (one line) when it is not one."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"segmentation data root {root} does not exist; point segmentation.data_root at "
                           "ADEChallengeData2016 (images/ and annotations/, each with training/ and validation/)")
    counts = {}
    for split, folder in SPLITS.items():
        img_dir, seg_dir = root / "images" / folder, root / "annotations" / folder
        for d in (img_dir, seg_dir):
            if not d.is_dir():
                raise DatasetError(f"{d} is missing: {root} is not in the ADE20K layout "
                                   f"(images/{{training,validation}}, annotations/{{training,validation}})")
        images, labels = _listing(img_dir, img_suffix), set(_listing(seg_dir, seg_suffix))
        if not images:
            raise DatasetError(f"{img_dir} has no *{img_suffix} images")
        unlabelled = [name for name in images if name not in labels]
        if unlabelled:
            raise DatasetError(f"{len(unlabelled)} image(s) in {img_dir} have no annotation in {seg_dir} "
                               f"(first: {unlabelled[0]}{img_suffix} -> {unlabelled[0]}{seg_suffix})")
        counts[split] = len(images)
    return counts


def compose_canvases(images: np.ndarray, labels: np.ndarray, count: int, *, size: int, items: tuple[int, int],
                     seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` grey canvases ``(count, size, size)`` and their label maps (0 other, class + 1).

    Each canvas holds ``items[0]..items[1]`` Fashion-MNIST items at seeded positions, painted in order
    (a later item occludes an earlier one where their silhouettes overlap), on a background of seeded
    low-amplitude noise so that "other" is not a constant."""
    rng = np.random.default_rng(seed)
    h, w = images.shape[1:]
    canvases = np.empty((count, size, size), np.uint8)
    maps = np.zeros((count, size, size), np.uint8)
    for c in range(count):
        canvas = rng.integers(0, 24, (size, size)).astype(np.uint8)
        for _ in range(int(rng.integers(items[0], items[1] + 1))):
            i = int(rng.integers(len(images)))
            y, x = int(rng.integers(0, size - h + 1)), int(rng.integers(0, size - w + 1))
            silhouette = images[i] > SILHOUETTE_THRESHOLD
            canvas[y:y + h, x:x + w][silhouette] = images[i][silhouette]
            maps[c, y:y + h, x:x + w][silhouette] = labels[i] + 1
        canvases[c] = canvas
    return canvases, maps


def export_canvases(source: str | os.PathLike, out: str | os.PathLike, *, train_images: int, val_images: int,
                    size: int, items: tuple[int, int], seed: int) -> dict:
    """Write the smoke canvases in the ADE20K layout under ``out``; returns the counts per split."""
    from PIL import Image

    from dpnrepro.data.sources import load_idx

    out = Path(out)
    counts = {}
    for split, n, source_split in (("train", train_images, "train"), ("val", val_images, "test")):
        images, labels = load_idx(source, source_split, key="export_seg_canvases.source")
        canvases, maps = compose_canvases(images, labels, n, size=size, items=items, seed=seed + (split == "val"))
        folder = SPLITS[split]
        (out / "images" / folder).mkdir(parents=True)
        (out / "annotations" / folder).mkdir(parents=True)
        for k in range(n):
            name = f"canvas_{split}_{k:05d}"
            Image.fromarray(canvases[k]).save(out / "images" / folder / f"{name}{IMG_SUFFIX}", quality=95)
            Image.fromarray(maps[k]).save(out / "annotations" / folder / f"{name}{SEG_SUFFIX}")
        counts[split] = n
    return counts
