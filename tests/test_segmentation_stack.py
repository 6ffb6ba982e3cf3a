"""The segmentation stack (appendix D, ADE20k with mmsegmentation) is installed and works on CPU.

The environment must provide mmcv 2.1.0 WITH its compiled ops (``tools/build_mmcv.sh``): these
tests fail, never skip, when it does not.
"""
from __future__ import annotations

import importlib

import pytest
import torch

MMCV_VERSION = "2.1.0"
IMG, PATCH, DIMS, CLASSES = 32, 8, 32, 3


def _require(name: str):
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any import failure means the stack is broken
        problem = f"{type(exc).__name__}: {exc}"
    pytest.fail(f"cannot import {name} ({problem}); run `bash tools/build_mmcv.sh` in the virtual "
                "environment (mmsegmentation needs mmcv 2.1.0 with its compiled ops)", pytrace=False)


@pytest.fixture(scope="module")
def mmseg():
    _require("mmcv.ops")
    mod = _require("mmseg")
    from mmseg.utils import register_all_modules

    register_all_modules(init_default_scope=True)
    return mod


def test_versions_and_compiled_ops():
    mmcv = _require("mmcv")
    ops = _require("mmcv.ops")
    mmengine = _require("mmengine")
    mmseg = _require("mmseg")
    assert mmcv.__version__ == MMCV_VERSION
    assert mmseg.__version__ == "1.2.2"
    assert mmengine.__version__.startswith("0.10.")
    # the compiled extension is really there and runs on CPU (mmcv-lite has no _ext)
    _require("mmcv._ext")
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    dets, keep = ops.nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2] and dets.shape == (2, 5)


def _model_cfg(num_convs: int):
    from mmengine.config import ConfigDict  # mmseg reads test_cfg.mode as an attribute, as from a config file

    return ConfigDict(
        type="EncoderDecoder",
        data_preprocessor=dict(
            type="SegDataPreProcessor", mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
            bgr_to_rgb=True, pad_val=0, seg_pad_val=255, size=(IMG, IMG)),
        backbone=dict(
            type="VisionTransformer", img_size=(IMG, IMG), patch_size=PATCH, in_channels=3, embed_dims=DIMS,
            num_layers=1, num_heads=2, mlp_ratio=2, out_indices=(0,), drop_rate=0.0, drop_path_rate=0.0,
            with_cls_token=True, final_norm=True, norm_cfg=dict(type="LN", eps=1e-6)),
        decode_head=dict(
            # FCNHead without convs feeds the features straight to the classifier: channels == in_channels
            type="FCNHead", in_channels=DIMS, in_index=0, channels=16 if num_convs else DIMS, num_convs=num_convs,
            concat_input=False, num_classes=CLASSES, dropout_ratio=0.0, align_corners=False,
            norm_cfg=dict(type="BN", requires_grad=True),
            loss_decode=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0, avg_non_ignore=True)),
        train_cfg=dict(),
        test_cfg=dict(mode="whole"),
    )


def _batch(n: int = 2, seed: int = 0):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    g = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(n):
        inputs.append(torch.randint(0, 256, (3, IMG, IMG), generator=g, dtype=torch.uint8))
        s = SegDataSample()
        s.gt_sem_seg = PixelData(data=torch.randint(0, CLASSES, (1, IMG, IMG), generator=g))
        s.set_metainfo(dict(img_shape=(IMG, IMG), ori_shape=(IMG, IMG), pad_shape=(IMG, IMG)))
        samples.append(s)
    return {"inputs": inputs, "data_samples": samples}


@pytest.mark.parametrize("num_convs", [0, 1])
def test_vit_fcn_encoder_decoder(mmseg, num_convs):
    from mmseg.registry import MODELS

    torch.manual_seed(0)
    model = MODELS.build(_model_cfg(num_convs))
    assert type(model).__name__ == "EncoderDecoder"
    assert type(model.backbone).__name__ == "VisionTransformer"
    assert type(model.decode_head).__name__ == "FCNHead"

    data = model.data_preprocessor(_batch(), training=True)
    x = data["inputs"]
    assert x.shape == (2, 3, IMG, IMG) and x.dtype == torch.float32

    # features and raw logits: one map of width DIMS at stride PATCH, CLASSES logits per location
    model.eval()
    with torch.no_grad():
        feats = model.extract_feat(x)
        assert len(feats) == 1 and feats[0].shape == (2, DIMS, IMG // PATCH, IMG // PATCH)
        logits = model._forward(x, data["data_samples"])
    assert logits.shape == (2, CLASSES, IMG // PATCH, IMG // PATCH)
    assert torch.isfinite(logits).all()

    # full-resolution prediction
    with torch.no_grad():
        preds = model(x, data["data_samples"], mode="predict")
    assert len(preds) == 2
    assert preds[0].seg_logits.data.shape == (CLASSES, IMG, IMG)
    assert preds[0].pred_sem_seg.data.shape == (1, IMG, IMG)
    assert set(preds[0].pred_sem_seg.data.unique().tolist()) <= set(range(CLASSES))

    # a finite loss that back-propagates into the backbone
    model.train()
    losses = model(x, data["data_samples"], mode="loss")
    assert "decode.loss_ce" in losses
    loss = sum(v for k, v in losses.items() if "loss" in k)
    assert torch.isfinite(loss) and float(loss) > 0
    # untrained, near-uniform predictions over 3 classes: cross-entropy close to log(3)
    assert 0.3 < float(losses["decode.loss_ce"]) < 5.0
    loss.backward()
    g = model.backbone.patch_embed.projection.weight.grad
    assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0


def test_train_step_reduces_loss(mmseg):
    from mmengine.optim import OptimWrapper
    from mmseg.registry import MODELS

    torch.manual_seed(0)
    model = MODELS.build(_model_cfg(1))
    model.train()
    optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=3e-3))
    batch = _batch(seed=1)
    first = model.train_step(batch, optim)
    for _ in range(8):
        last = model.train_step(batch, optim)
    assert torch.isfinite(first["loss"]) and torch.isfinite(last["loss"])
    assert last["loss"].item() < first["loss"].item()  # it learns (overfits one batch)
