"""A VTAB task's local copy → its ``train800`` / ``val200`` / ``train800val200`` / ``test`` splits.

The copy is a ``datasets`` directory (``disk``: ``save_to_disk`` of a DatasetDict), an image folder
(``imagefolder``: ``<root>/<split>/<class>/<img>``, or images with a ``metadata.jsonl`` carrying the
raw fields of a structured task) or, only when online, a hub name (``hub``). Its splits are the ones the
task's TFDS builder has (``train``, ``validation``, ``test``); :class:`~dpnrepro.transfer.tasks.SplitRule`
cuts VTAB's splits out of them and the task's label rule gives each example its VTAB label.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from dpnrepro.errors import DatasetError
from dpnrepro.transfer.tasks import VtabTask

FORMATS = ("disk", "imagefolder", "hub")


def load_source(fmt: str, source: str):
    """The copy as a ``datasets.DatasetDict``; a one-line :class:`DatasetError` when it cannot be read."""
    import datasets

    if fmt == "disk":
        if not Path(source, "dataset_dict.json").exists():
            raise DatasetError(f"{source} is not a `datasets` save_to_disk directory of splits "
                               "(no dataset_dict.json); point the task's `source` at one")
        return datasets.load_from_disk(source)
    if fmt == "imagefolder":
        if not Path(source).is_dir():
            raise DatasetError(f"image folder {source} does not exist")
        return datasets.load_dataset("imagefolder", data_dir=source)
    if fmt == "hub":
        if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
            raise DatasetError(f"hub dataset {source!r} needs the network: set HF_HUB_OFFLINE=0 "
                               "HF_DATASETS_OFFLINE=0 once, or point `source` at a local copy (`disk`)")
        try:
            return datasets.load_dataset(source)
        except Exception as exc:  # noqa: BLE001 - the hub raises many types; the user needs one line
            raise DatasetError(f"cannot load hub dataset {source!r}: {type(exc).__name__}: {exc}") from None
    raise DatasetError(f"unknown task source format {fmt!r}; choose one of {', '.join(FORMATS)}")


def task_classes(task: VtabTask, src) -> int:
    """The class count of ``task`` read from ``src`` (a TaskSourceParams): the stand-in's own where it
    declares fewer classes than the task has (MNIST's 10 standing in for Sun397's 397), else the task's."""
    k = src.num_classes or task.num_classes
    if k > task.num_classes:
        raise DatasetError(f"{task.name} has {task.num_classes} classes; its source {src.source} declares {k}")
    return k


def test_chance(labels, num_classes: int) -> dict:
    """A test split's chance rate: ``majority_test`` (%, the accuracy of always predicting its most frequent
    class: the score of a model that learned nothing) and ``classes_in_test``."""
    import numpy as np

    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_classes)
    return {"classes_in_test": int((counts > 0).sum()), "majority_test": 100.0 * int(counts.max()) / int(counts.sum())}


def vtab_splits(task: VtabTask, source, names=("train800", "val200", "train800val200", "test"), *,
                num_classes: int | None = None) -> dict:
    """``{name: Dataset(image, label)}`` of ``task`` from the DatasetDict ``source``.

    Each split is a ``select`` of the source rows the task's split rule names (so the examples keep
    their source identity: ``train800`` and ``val200`` never share a row), with ``label`` set by the
    task's label rule; ``num_classes`` (a stand-in's, :func:`task_classes`) bounds the labels further.
    """
    import datasets

    slices = {name: task.splits.slices()[name] for name in names}
    missing = sorted({sl.split for sls in slices.values() for sl in sls} - set(source))
    if missing:
        raise DatasetError(f"{task.name} needs the source split(s) {missing} ({task.reference}); "
                           f"the copy has {sorted(source)}")
    out = {}
    for name in names:
        parts = []
        for sl in slices[name]:
            # keep_in_memory: a transform of a dataset read with load_from_disk otherwise writes cache
            # files into the source directory, which is a DVC output (it would change under DVC's feet)
            parts.append(source[sl.split].select(sl.indices(len(source[sl.split])), keep_in_memory=True))
        ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
        out[name] = with_vtab_labels(task, ds, num_classes)
    return out


def with_vtab_labels(task: VtabTask, ds, num_classes: int | None = None):
    """``ds`` reduced to ``image`` and the task's ``label`` (computed from the raw fields when present),
    its images through the task's pixel rule when it has one (dSprites: 0/1 -> 0/255, RGB). Labels at or
    above ``num_classes`` (a stand-in's class count) are an error."""

    import datasets

    if "image" not in ds.column_names:
        raise DatasetError(f"{task.name}: the source has no `image` column (columns: {ds.column_names})")
    other = [c for c in ds.column_names if c != "image"]
    labels = [task.label_of(row) for row in ds.select_columns(other)]
    if num_classes is not None and labels and max(labels) >= num_classes:
        raise DatasetError(f"{task.name}: label {max(labels)} in a source declared to have {num_classes} classes")
    # in memory, not as cache files next to the source (see vtab_splits)
    ds = ds.select_columns(["image"]).flatten_indices(keep_in_memory=True)
    if task.pixels is not None:
        # a fingerprint of the input and the rule (datasets would otherwise hash the closure, or fall back
        # to a random one: checkpoints keyed by it would never resume)
        fp = hashlib.sha256(f"{ds._fingerprint}|{task.pixels.__module__}.{task.pixels.__qualname__}".encode())
        ds = ds.map(lambda ex: {"image": task.pixels(ex["image"])}, keep_in_memory=True,
                    new_fingerprint=fp.hexdigest()[:16])
    return ds.add_column("label", labels, feature=datasets.Value("int64"))


DECODE_BUDGET_BYTES = 1 << 30  # pixels a split may hold in memory (decoded_if_small)


class DecodedSplit:
    """A split decoded once into memory (PIL images, labels), read by index like a ``datasets`` split.

    The protocols train and score dozens of models on the same few thousand images; decoding a
    ``datasets`` row per access was most of a smoke fine-tune's time. Same images, same fingerprint, so
    results and resumable checkpoints are those of the ``datasets`` split. Built through
    :func:`decoded_if_small`, which bounds its memory.
    """

    column_names = ["image", "label"]

    def __init__(self, ds, budget: int | None = None):
        """Decode ``ds`` in chunks; :class:`MemoryError` as soon as its pixels pass ``budget`` bytes."""
        self._fingerprint = ds._fingerprint
        self.images, self.labels, size = [], [], 0
        for chunk in ds.iter(batch_size=256):
            for im in chunk["image"]:
                size += im.width * im.height * len(im.getbands())
                if budget is not None and size > budget:
                    raise MemoryError(f"split holds more than {budget} bytes of pixels")
                self.images.append(im)
            self.labels += [int(y) for y in chunk["label"]]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "label": self.labels[i]}

    def select(self, indices) -> "DecodedSplit":
        """The rows ``indices``, in that order, as ``datasets.Dataset.select`` gives them (an evaluation
        shard under torchrun: :func:`dpnrepro.data.loader.eval_batches`); the decoded images are shared."""
        indices = list(indices)
        part = object.__new__(DecodedSplit)
        part.images, part.labels = [self.images[i] for i in indices], [self.labels[i] for i in indices]
        rows = hashlib.sha256(repr(indices).encode()).hexdigest()[:16]
        part._fingerprint = f"{self._fingerprint}:select:{rows}"
        return part


def decoded_if_small(ds, budget: int = DECODE_BUDGET_BYTES):
    """``ds`` decoded into memory (:class:`DecodedSplit`) when its pixels fit in ``budget`` bytes, else
    ``ds`` itself, read row by row: the same images either way (so the same results), and host memory
    bounded whatever the split's size. For splits read many times (training, model selection); a split
    scored once per model (``test``) is streamed as it is."""
    try:
        return DecodedSplit(ds, budget)
    except MemoryError:
        return ds
