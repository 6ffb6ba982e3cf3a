"""The 19 VTAB-1k tasks: each one's group, classes, split rule and label rule, as google-research's
``task_adaptation`` defines them (``task_adaptation/data/*.py``; the task list of
``scripts/run_all_tasks.sh``).

A task reads a *source* dataset with the splits of its TFDS builder (``train``, ``validation``,
``test``: whichever that builder has) and the fields its label rule needs. Most tasks use the source's
``label`` as is; the structured ones compute it from the source's annotations (TFDS field names):

* Clevr-Count (``clevr(task="count_all")``): number of objects − 3 (3..10 objects → 8 classes);
* Clevr-Dist (``clevr(task="closest_object_distance")``): the smallest depth ``objects/pixel_coords[:, 2]``
  binned by the thresholds 0, 8, 8.5, 9, 9.5, 10, 100 (6 classes);
* KITTI-Dist (``kitti(task="closest_vehicle_distance")``): the smallest ``objects/location[:, 2]`` of the
  Car/Van/Truck objects (``type`` < 3; 1000 when there is none) binned by −100, 8, 20, 999 (4 classes:
  three distance ranges and "no vehicle");
* dSpr-Loc / dSpr-Ori (``dsprites(predicted_attribute=..., num_classes=16)``): ``label_x_position``
  (32 values) or ``label_orientation`` (40 values) grouped into 16 classes, ``floor(v / (K / 16))``;
* sNORB-Azim / sNORB-Elev (``smallnorb(predicted_attribute=...)``): ``label_azimuth`` (18 classes) and
  ``label_elevation`` (9 classes) as they are.

Pixels: dSprites (TFDS ``dsprites``) stores its 64 × 64 shapes as one channel of 0/1;
task_adaptation's dsprites tiles it to 3 channels and multiplies by 255 (:func:`dsprites_pixels`). Every
other task's images reach the model as stored.

A binned label is the largest index ``i`` with ``thresholds[i] < value`` (``tf.reduce_max(tf.where(
(thrs - dist) < 0))``), so a value equal to a threshold falls into the bin below it.

A source that already carries VTAB's labels (e.g. a hub export with a ``label`` column and none of the
raw fields) is read as is; its labels are range-checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np

from dpnrepro.errors import DatasetError

Group = Literal["natural", "specialized", "structured"]
GROUPS: tuple[Group, ...] = ("natural", "specialized", "structured")

# --------------------------------------------------------------------------------------------------
# Label rules (each takes one source example, a dict with TFDS's field names)

CLEVR_DISTANCE_THRESHOLDS = (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0)
KITTI_DISTANCE_THRESHOLDS = (-100.0, 8.0, 20.0, 999.0)
KITTI_NO_VEHICLE_DEPTH = 1000.0
KITTI_VEHICLE_TYPES = 3  # TFDS kitti object types 0, 1, 2 = Car, Van, Truck


def bin_by_thresholds(value: float, thresholds) -> int:
    """The largest ``i`` with ``thresholds[i] < value`` (task_adaptation's binning)."""
    below = [i for i, t in enumerate(thresholds) if t < value]
    if not below:
        raise DatasetError(f"value {value} is not above the lowest threshold {thresholds[0]}")
    return max(below)


def clevr_count(ex: dict) -> int:
    """CLEVR count_all: number of objects − 3 (scenes hold 3 to 10 objects)."""
    return len(ex["objects"]["size"]) - 3


def clevr_closest_distance(ex: dict) -> int:
    """CLEVR closest_object_distance: the nearest object's depth, binned."""
    depth = min(float(c[2]) for c in ex["objects"]["pixel_coords"])
    return bin_by_thresholds(depth, CLEVR_DISTANCE_THRESHOLDS)


def kitti_closest_vehicle_distance(ex: dict) -> int:
    """KITTI closest_vehicle_distance: nearest Car/Van/Truck depth binned; 'no vehicle' is the last class."""
    objects = ex["objects"]
    depths = [float(loc[2]) for t, loc in zip(objects["type"], objects["location"]) if int(t) < KITTI_VEHICLE_TYPES]
    return bin_by_thresholds(min(depths + [KITTI_NO_VEHICLE_DEPTH]), KITTI_DISTANCE_THRESHOLDS)


def grouped(field: str, original: int, classes: int) -> Callable[[dict], int]:
    """dSprites with ``num_classes``: ``floor(value / (original / classes))``, in float32 as TF does."""
    factor = np.float32(original) / np.float32(classes)

    def rule(ex: dict) -> int:
        v = int(ex[field])
        if not 0 <= v < original:
            raise DatasetError(f"{field} = {v} outside [0, {original})")
        return int(math.floor(np.float32(v) / factor))

    rule.__name__ = f"{field}_in_{classes}"
    return rule


def dsprites_pixels(image):
    """task_adaptation's dSprites image: ``tf.tile(image, [1, 1, 3]) * 255`` (TFDS stores 0/1), as an RGB
    PIL image. A copy already at 0-255 (a stand-in, or an export that scaled it; any pixel above 1) is
    only tiled: multiplying it would wrap around in uint8."""
    from PIL import Image

    arr = np.asarray(image.convert("L") if image.mode != "L" else image)
    if arr.max() <= 1:
        arr = arr * np.uint8(255)
    return Image.fromarray(np.repeat(arr[:, :, None], 3, axis=2), mode="RGB")


def attribute(field: str) -> Callable[[dict], int]:
    def rule(ex: dict) -> int:
        return int(ex[field])

    rule.__name__ = field
    return rule


# --------------------------------------------------------------------------------------------------
# Splits


@dataclass(frozen=True)
class Slice:
    """``split[start:stop]`` of a source; ``start``/``stop`` are counts, or percentages of the split
    as ``"90%"`` (``P * n // 100``, as task_adaptation computes its counts); ``length``: exactly that
    many from ``start`` (an error when ``[start, stop)`` holds fewer)."""

    split: str
    start: int | str = 0
    stop: int | str | None = None
    length: int | None = None

    def indices(self, n: int) -> range:
        def pos(v):
            if v is None:
                return n
            if isinstance(v, str):
                return int(v.rstrip("%")) * n // 100
            return v

        lo, hi = pos(self.start), pos(self.stop)
        if self.length is not None:
            if lo + self.length > hi:
                raise DatasetError(f"split {self.split!r} ({n} examples) holds {max(hi - lo, 0)} from position "
                                   f"{lo}; the VTAB protocol needs {self.length} there")
            hi = lo + self.length
        if hi > n:
            raise DatasetError(f"split {self.split!r} has {n} examples; the VTAB protocol needs {hi}")
        return range(lo, hi)


@dataclass(frozen=True)
class SplitRule:
    """Where a task's ``train``/``val``/``test`` come from; ``train800`` and ``val200`` are the first 800
    of ``train`` and the first 200 of ``val`` (task_adaptation's ``train[:800]``, ``val[:200]``)."""

    train: Slice
    val: Slice
    test: Slice

    def slices(self) -> dict[str, list[Slice]]:
        t, v = self.train, self.val
        train800 = Slice(t.split, t.start, t.stop, 800)
        val200 = Slice(v.split, v.start, v.stop, 200)
        return {"train": [t], "val": [v], "trainval": [t, v], "test": [self.test],
                "train800": [train800], "val200": [val200], "train800val200": [train800, val200]}


def _official(val: str = "validation", test: str = "test") -> SplitRule:
    return SplitRule(Slice("train"), Slice(val), Slice(test))


def _held_out(train_pct: int, test: str = "test") -> SplitRule:
    """val = the end of the source train split (``train[P%:]``)."""
    return SplitRule(Slice("train", 0, f"{train_pct}%"), Slice("train", f"{train_pct}%"), Slice(test))


def _three_way(train_pct: int, val_pct: int) -> SplitRule:
    """train / val / test all cut from the source train split."""
    end = f"{train_pct + val_pct}%"
    return SplitRule(Slice("train", 0, f"{train_pct}%"), Slice("train", f"{train_pct}%", end), Slice("train", end))


# --------------------------------------------------------------------------------------------------
# The tasks


@dataclass(frozen=True)
class VtabTask:
    name: str                    # as the paper's Table 3 prints it
    group: Group
    num_classes: int
    splits: SplitRule
    label: Callable[[dict], int] | None = None  # None: the source's `label`
    raw_fields: tuple[str, ...] = ()             # the fields `label` reads
    reference: str = ""          # task_adaptation's constructor
    pixels: Callable | None = None               # the task's image preprocessing (PIL -> PIL); None: as stored

    def label_of(self, ex: dict) -> int:
        if self.label is None or not all(f in ex for f in self.raw_fields):
            if "label" not in ex:
                raise DatasetError(f"{self.name}: an example has neither `label` nor {list(self.raw_fields)}")
            y = int(ex["label"])
        else:
            y = self.label(ex)
        if not 0 <= y < self.num_classes:
            raise DatasetError(f"{self.name}: label {y} outside [0, {self.num_classes})")
        return y


def _t(name, group, classes, splits, reference, label=None, raw=(), pixels=None):
    return VtabTask(name, group, classes, splits, label, tuple(raw), reference, pixels)


TASKS: dict[str, VtabTask] = {t.name: t for t in (
    # Natural
    _t("Caltech101", "natural", 102, _held_out(90), "caltech101"),
    _t("CIFAR-100", "natural", 100, _held_out(90), "cifar(num_classes=100)"),
    _t("DTD", "natural", 47, _official(), "dtd"),
    _t("Flowers102", "natural", 102, _official(), "oxford_flowers102"),
    _t("Pets", "natural", 37, _held_out(80), "oxford_iiit_pet"),
    _t("Sun397", "natural", 397, _official(), "sun397"),
    _t("SVHN", "natural", 10, _held_out(90), "svhn"),
    # Specialized
    _t("Camelyon", "specialized", 2, _official(), "patch_camelyon"),
    _t("EuroSAT", "specialized", 10, _three_way(60, 20), "eurosat"),
    _t("Resisc45", "specialized", 45, _three_way(60, 20), "resisc45"),
    _t("Retinopathy", "specialized", 5, _official(), 'diabetic_retinopathy(config="btgraham-300")'),
    # Structured
    _t("Clevr-Count", "structured", 8, _held_out(90, test="validation"), 'clevr(task="count_all")',
       clevr_count, ("objects",)),
    _t("Clevr-Dist", "structured", 6, _held_out(90, test="validation"), 'clevr(task="closest_object_distance")',
       clevr_closest_distance, ("objects",)),
    _t("DMLab", "structured", 6, _official(), "dmlab"),
    _t("dSpr-Loc", "structured", 16, _three_way(80, 10),
       'dsprites(predicted_attribute="label_x_position",num_classes=16)',
       grouped("label_x_position", 32, 16), ("label_x_position",), dsprites_pixels),
    _t("dSpr-Ori", "structured", 16, _three_way(80, 10),
       'dsprites(predicted_attribute="label_orientation",num_classes=16)',
       grouped("label_orientation", 40, 16), ("label_orientation",), dsprites_pixels),
    _t("KITTI-Dist", "structured", 4, _official(), 'kitti(task="closest_vehicle_distance")',
       kitti_closest_vehicle_distance, ("objects",)),
    _t("sNORB-Azim", "structured", 18, SplitRule(Slice("train"), Slice("test", 0, "50%"), Slice("test", "50%")),
       'smallnorb(predicted_attribute="label_azimuth")', attribute("label_azimuth"), ("label_azimuth",)),
    _t("sNORB-Elev", "structured", 9, SplitRule(Slice("train"), Slice("test", 0, "50%"), Slice("test", "50%")),
       'smallnorb(predicted_attribute="label_elevation")', attribute("label_elevation"), ("label_elevation",)),
)}


def get_task(name: str) -> VtabTask:
    if name not in TASKS:
        raise DatasetError(f"unknown VTAB task {name!r}; the 19 tasks are: {', '.join(TASKS)}")
    return TASKS[name]
