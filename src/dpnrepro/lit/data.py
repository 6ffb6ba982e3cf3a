"""LiT's data: an image-caption corpus (any ``datasets`` copy with an image and a text column) and the
labelled image sets zero-shot classification is scored on, all as (PIL image, ...) sequences.

Zero-shot sets (``lit.zeroshot.datasets``), by ``format``:
  * ``imagefolder``  ``<source>/<split>/<class>/<img>`` with classes in sorted folder order (ImageNet's
                     ``n01440764 ...`` order is the order of CLIP's class names);
  * ``disk``         a ``datasets`` ``save_to_disk`` copy with ``image`` and ``label`` columns;
  * ``idx``          MNIST-format files (Debian's Fashion-MNIST);
  * ``foolbox``      the labelled sample images inside the ``foolbox`` wheel (``foolbox/data/
                     <source>_<i>_<label>.<ext>``, e.g. ``source: imagenet``: 20 real ImageNet photos),
                     read as files; foolbox itself is never imported.
"""

from __future__ import annotations

from pathlib import Path

from dpnrepro.errors import DatasetError


def load_caption_corpus(source: str, *, split: str, image_column: str, text_column: str, examples: int = 0):
    """The ``split`` of a ``datasets`` directory (``save_to_disk``) with image and text columns, as a
    ``datasets.Dataset`` with columns ``image`` and ``text``; the first ``examples`` rows (0 = all)."""
    import datasets

    path = Path(source)
    if not path.exists():
        raise DatasetError(f"image-caption corpus {source} does not exist; point lit.data.source at a `datasets` "
                           f"save_to_disk directory with {image_column!r} and {text_column!r} columns")
    try:
        ds = datasets.load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise DatasetError(f"{source} is not a `datasets` save_to_disk directory ({exc})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DatasetError(f"image-caption corpus {source} has no split {split!r} (has {', '.join(ds)})")
        ds = ds[split]
    missing = [c for c in (image_column, text_column) if c not in ds.column_names]
    if missing:
        raise DatasetError(f"image-caption corpus {source} lacks column(s) {missing} (has {ds.column_names}); "
                           "set lit.data.image_column / text_column")
    ds = ds.select_columns([image_column, text_column])
    if image_column != "image":
        ds = ds.rename_column(image_column, "image")
    if text_column != "text":
        ds = ds.rename_column(text_column, "text")
    if examples:
        ds = ds.select(range(min(examples, len(ds))))
    if len(ds) == 0:
        raise DatasetError(f"image-caption corpus {source} split {split!r} is empty")
    return ds


def foolbox_dir() -> Path:
    """The ``data`` folder of the installed foolbox wheel, located without importing foolbox."""
    import importlib.util

    spec = importlib.util.find_spec("foolbox")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("the foolbox wheel is not installed (`pip install --no-deps foolbox`); its data/ "
                           "holds the sample images")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def labelled_images(fmt: str, source: str, *, split: str = "test", per_class: int = 0):
    """(images: list of PIL images, labels: list of int) of a zero-shot set (see the module docstring);
    ``per_class`` > 0 keeps the first that many images of each class."""
    from PIL import Image

    if fmt == "foolbox":
        files = sorted(foolbox_dir().glob(f"{source}_*_*.*"))
        if not files:
            raise DatasetError(f"no foolbox sample images named {source}_<i>_<label>.* in {foolbox_dir()}")
        images, labels = [], []
        for f in files:
            with Image.open(f) as im:
                images.append(im.convert("RGB"))
            labels.append(int(f.stem.rsplit("_", 1)[1]))
    elif fmt == "idx":
        from dpnrepro.data.sources import load_idx

        arrays, label_array = load_idx(source, split, key="the task's source")
        images, labels = [Image.fromarray(a) for a in arrays], label_array.tolist()
    elif fmt in ("imagefolder", "disk"):
        from dpnrepro.data.sources import load_source

        ds = load_source(fmt, source, {"eval": split})["eval"]
        images, labels = ds["image"], ds["label"]
    else:
        raise DatasetError(f"unknown zero-shot data format {fmt!r}; choose imagefolder, disk, idx or foolbox")
    if per_class:
        counts: dict[int, int] = {}
        keep = []
        for i, y in enumerate(labels):
            if counts.get(y, 0) < per_class:
                counts[y] = counts.get(y, 0) + 1
                keep.append(i)
        images, labels = [images[i] for i in keep], [labels[i] for i in keep]
    return images, labels


def class_names(kind: str) -> list[str]:
    """Class names by source: ``imagenet`` (CLIP's 1000 names, as open_clip ships them, in ImageNet's
    class-id order) or ``fashion_mnist`` (the dataset's 10)."""
    if kind == "imagenet":
        from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

        return list(IMAGENET_CLASSNAMES)
    if kind == "fashion_mnist":
        from dpnrepro.data.sources import FASHION_MNIST_CLASSES

        return list(FASHION_MNIST_CLASSES)
    raise DatasetError(f"unknown class_names {kind!r}; choose imagenet or fashion_mnist")
