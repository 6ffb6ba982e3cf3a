"""mmseg dataset of the smoke canvases (:mod:`dpnrepro.data.segmentation`): ADE20K layout, 10 classes."""

from __future__ import annotations

from mmseg.datasets import BaseSegDataset
from mmseg.registry import DATASETS

from dpnrepro.data.segmentation import FASHION_CLASSES, IMG_SUFFIX, SEG_SUFFIX

# a fixed palette for mmseg's visualiser (one colour per class)
_PALETTE = [[(37 * k) % 256, (91 * k + 60) % 256, (173 * k + 120) % 256] for k in range(len(FASHION_CLASSES))]


@DATASETS.register_module()
class FashionCanvasDataset(BaseSegDataset):
    """Canvases of real Fashion-MNIST items in the ADE20K layout; label 0 ("other") is ignored
    (``reduce_zero_label``), so classes 1..10 train as 0..9, as ADE20K's 1..150 do."""

    METAINFO = dict(classes=FASHION_CLASSES, palette=_PALETTE)

    def __init__(self, img_suffix=IMG_SUFFIX, seg_map_suffix=SEG_SUFFIX, reduce_zero_label=True, **kwargs):
        super().__init__(img_suffix=img_suffix, seg_map_suffix=seg_map_suffix,
                         reduce_zero_label=reduce_zero_label, **kwargs)
