"""Raw dataset sources, all returned as Hugging Face ``datasets`` objects with ``image`` and ``label``
(or, multi-label, ``labels``: a list of class ids per image, e.g. from an imagefolder's metadata.jsonl).

Supported ``format`` values:
  * ``idx``         a directory with the (gzipped) MNIST idx files, e.g. Debian's
                    ``dataset-fashion-mnist`` package at ``/usr/share/datasets/fashion-mnist``;
  * ``imagefolder`` a directory ``<root>/<split>/<class>/<image>`` (the ImageNet train/val layout);
  * ``disk``        a ``DatasetDict`` written with ``save_to_disk``;
  * ``hub``         a Hugging Face hub name (needs a network, or a warm local cache).
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from dpnrepro.errors import DatasetError

FORMATS = ("idx", "imagefolder", "disk", "hub")

FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _open_maybe_gz(path: Path):
    for candidate in (path.with_name(path.name + ".gz"), path):
        if candidate.exists():
            return gzip.open(candidate, "rb") if candidate.suffix == ".gz" else open(candidate, "rb")
    raise DatasetError(
        f"missing dataset file {path}(.gz); on Debian install it with "
        "`apt-get install dataset-fashion-mnist`, or point data.source at a directory holding it"
    )


def read_idx(path: Path) -> np.ndarray:
    """Read one MNIST idx file (uint8 data) into an array, validating its header and length."""
    with _open_maybe_gz(path) as f:
        try:
            raw = f.read()
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:  # a truncated or damaged .gz
            raise DatasetError(f"truncated or corrupt gzip file {getattr(f, 'name', path)} ({exc}); "
                               "reinstall the dataset") from None
    if len(raw) < 4:
        raise DatasetError(f"corrupt idx file {path}: {len(raw)} bytes; reinstall the dataset")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise DatasetError(f"corrupt idx file {path}: bad magic header; reinstall the dataset")
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    body = raw[4 + 4 * ndim :]
    expected = int(np.prod(shape))
    if len(body) != expected:
        raise DatasetError(
            f"truncated idx file {path}: {len(body)} of {expected} bytes; reinstall the dataset"
        )
    return np.frombuffer(body, dtype=np.uint8).reshape(shape)


def load_idx(root: str | os.PathLike, split: str, key: str = "data.source") -> tuple[np.ndarray, np.ndarray]:
    """Images (N, H, W) uint8 and labels (N,) int64 of one idx split ('train' or 'test'); ``key``: the params
    key that names ``root``, for the error when it is missing."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(
            f"dataset directory {root} does not exist; on Debian run "
            f"`apt-get install dataset-fashion-mnist`, or set {key} in params.yaml"
        )
    images_name, labels_name = _IDX_FILES[split]
    images = read_idx(root / images_name)
    labels = read_idx(root / labels_name).astype(np.int64)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DatasetError(
            f"inconsistent idx split {split!r} in {root}: {images.shape} images vs "
            f"{labels.shape} labels; reinstall the dataset"
        )
    return images, labels


def load_idx_checked(root: str | os.PathLike, split: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`load_idx` of a Fashion-MNIST-labelled source, every label checked to name one of its classes."""
    images, labels = load_idx(root, split)
    bad = np.flatnonzero((labels < 0) | (labels >= len(FASHION_MNIST_CLASSES)))
    if len(bad):
        raise DatasetError(
            f"idx split {split!r} in {root}: example {bad[0]} has label {labels[bad[0]]} "
            f"outside [0, {len(FASHION_MNIST_CLASSES)}); reinstall the dataset"
        )
    return images, labels


def idx_as_dataset(images: np.ndarray, labels: np.ndarray, rows: np.ndarray | None = None):
    """Idx arrays as a ``datasets.Dataset`` (``image`` PNG-encoded, ``label``), only ``rows`` of them, in that
    order, when given: encoding is what costs (Fashion-MNIST's 60,000 train images take ~20 s)."""
    import datasets

    if rows is not None:
        images, labels = images[rows], labels[rows]
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=list(FASHION_MNIST_CLASSES))}
    )
    return datasets.Dataset.from_dict({"image": list(images), "label": labels.tolist()}, features=features)


# our split name -> the params key (DataParams) naming its split in the source
SPLIT_KEYS = {"train": "train_split", "val": "eval_split"}


def load_source(fmt: str, source: str, splits: dict[str, str]) -> dict:
    """Load the raw splits named in ``splits`` ({our name: source split}) as ``datasets.Dataset``s.

    Every returned dataset has an ``image`` column (``datasets.Image``) and a ``label`` column
    (``datasets.ClassLabel``).
    """
    import datasets

    if fmt not in FORMATS:
        raise DatasetError(f"unknown data.format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "idx":
        return {name: idx_as_dataset(*load_idx_checked(source, src_split)) for name, src_split in splits.items()}
    if fmt in ("imagefolder", "disk") and not Path(source).exists():
        raise DatasetError(f"dataset path {source} does not exist; fix data.source in params.yaml")
    try:
        if fmt == "imagefolder":
            ds = datasets.load_dataset("imagefolder", data_dir=source)
        elif fmt == "disk":
            ds = datasets.load_from_disk(source)
        else:
            ds = datasets.load_dataset(source)
    except DatasetError:
        raise
    except Exception as exc:  # datasets raises many types; the user needs one line
        hint = (
            " (offline: download it once with network access, or save it with save_to_disk and "
            "use data.format: disk)"
            if fmt == "hub" and os.environ.get("HF_DATASETS_OFFLINE") == "1"
            else ""
        )
        raise DatasetError(f"cannot load {fmt} dataset {source!r}: {type(exc).__name__}: {exc}{hint}") from exc
    missing = {name: s for name, s in splits.items() if s not in ds}
    if missing:
        keys = " / ".join(f"data.{SPLIT_KEYS.get(name, name)}" for name in missing)
        raise DatasetError(
            f"dataset {source!r} has no split(s) {list(missing.values())}; it has {sorted(ds)}; fix {keys}"
        )
    out = {}
    for name, src_split in splits.items():
        split = ds[src_split]
        if "image" not in split.column_names or not {"label", "labels"} & set(split.column_names):
            raise DatasetError(
                f"dataset {source!r} split {src_split!r} needs an 'image' column and a 'label' (or, "
                f"multi-label, 'labels') column, has {split.column_names}"
            )
        out[name] = split
    return out


def folder_name(class_id: int, name: str) -> str:
    """A class folder name that sorts in class-id order and is a valid path component."""
    return f"{class_id:02d}_" + "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def export_idx_as_imagefolder(source: str | os.PathLike, out: str | os.PathLike, *, per_class: dict[str, int],
                              class_names=FASHION_MNIST_CLASSES) -> dict[str, int]:
    """Write the first ``per_class[split]`` images of each class of an idx dataset as PNG files in the
    ImageNet layout ``<out>/<split>/<NN_class>/<index>.png`` (0 = all); returns the counts per split.

    This turns the bundled Fashion-MNIST into the layout every ImageNet user has (class folders, files
    listed class by class), so the smoke profile runs the ``imagefolder`` path end to end.
    """
    from PIL import Image

    out = Path(out)
    written = {}
    for split, n_per_class in per_class.items():
        images, labels = load_idx(source, split, key="export_imagefolder.source")
        counts = np.zeros(len(class_names), dtype=np.int64)
        for d in range(len(class_names)):
            (out / split / folder_name(d, class_names[d])).mkdir(parents=True, exist_ok=True)
        for i in range(len(images)):
            c = int(labels[i])
            if n_per_class and counts[c] >= n_per_class:
                continue
            counts[c] += 1
            # compress_level fixed: the same PNG bytes on every machine (DVC hashes them)
            Image.fromarray(images[i]).save(out / split / folder_name(c, class_names[c]) / f"{i:05d}.png",
                                            compress_level=6)
        written[split] = int(counts.sum())
    return written
