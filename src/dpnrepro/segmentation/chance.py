"""The constant-prediction baseline of a Table 5 run: what mIoU a segmentor that learned nothing gets.

A model that ignores its input can at best predict one class everywhere. :func:`constant_prediction_miou`
scores every such constant map on the run's own validation set, read by the run's own dataset and
pipeline (``reduce_zero_label``, ignore index 255), with the run's own evaluator (``val_evaluator``:
mmseg's ``IoUMetric``), and returns the best one. With ``K`` classes present in the masks and class
``c`` covering a share ``f_c`` of the labelled pixels, that is ``max_c f_c / K`` (every other class
present scores IoU 0), but it is measured here, not derived, so that it follows the configuration.
"""

from __future__ import annotations


def _val_label_maps(cfg) -> list:
    """Every validation ground-truth map (``gt_sem_seg.data``) as the run's val pipeline loads it."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import DATASETS
    from mmseg.utils import register_all_modules

    import dpnrepro.segmentation  # noqa: F401  (registers FashionCanvasDataset)

    register_all_modules(init_default_scope=False)
    init_default_scope("mmseg")
    dataset = DATASETS.build(cfg.val_dataloader.dataset)
    return dataset.metainfo, [dataset[i]["data_samples"].gt_sem_seg.data for i in range(len(dataset))]


def constant_prediction_miou(cfg) -> dict:
    """``{"mIoU": best constant map's mIoU (%), "class": its class name}`` under ``cfg.val_evaluator``."""
    import logging

    import torch
    from mmseg.registry import METRICS

    metainfo, labels = _val_label_maps(cfg)
    best = None
    logging.disable(logging.INFO)  # IoUMetric logs a per-class table for every constant map
    try:
        for index, name in enumerate(metainfo["classes"]):
            metric = METRICS.build(dict(cfg.val_evaluator))
            metric.dataset_meta = metainfo
            metric.process({}, [{"pred_sem_seg": {"data": torch.full_like(gt, index)}, "gt_sem_seg": {"data": gt}}
                                for gt in labels])
            miou = float(metric.compute_metrics(metric.results)["mIoU"])
            if best is None or miou > best["mIoU"]:
                best = {"mIoU": miou, "class": name}
    finally:
        logging.disable(logging.NOTSET)
    return best
