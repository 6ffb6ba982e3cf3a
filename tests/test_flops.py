"""Analytic ViT FLOP counts (dpnrepro.benchmarks.flops) against timm's figure and FlopCounterMode."""
from __future__ import annotations

import pytest
import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

from dpnrepro.benchmarks.flops import (
    TRAIN_FLOPS_MULTIPLIER,
    peak_bf16_tflops,
    train_flops_per_image,
    vit_forward_flops,
)
from dpnrepro.models import build_vit


def counted_flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(x)
    return counter.get_total_flops() // x.shape[0]


def test_b16_forward_is_35_2_gflop():
    """timm lists ViT-B/16 as 17.6 GMACs; at 2 FLOPs per multiply-add that is 35.2 GFLOP/img."""
    f = vit_forward_flops("B/16", img_size=224, num_classes=1000)
    assert f.patches == 196 and f.tokens == 197
    assert abs(f.total / 35.2e9 - 1) < 0.01
    assert f.total == 35_127_656_448  # the exact matmul count, see the meta-device check below
    assert vit_forward_flops("B-16").total == f.total  # the DVC-safe spelling works too
    assert train_flops_per_image("B/16") == TRAIN_FLOPS_MULTIPLIER * f.total == 3 * f.total


def test_h100_50pct_mfu_is_about_4700_img_per_s():
    peak, label = peak_bf16_tflops("NVIDIA H100 80GB HBM3")
    img_s = 0.5 * peak * 1e12 / train_flops_per_image("B/16")
    assert label == "H100 SXM" and abs(img_s / 4700 - 1) < 0.01


@pytest.mark.parametrize("stem", ["conv", "linear", "dpn"])
def test_matches_flop_counter_on_small_model(stem):
    """FlopCounterMode counts mm/addmm/bmm/convolution at 2 FLOPs per multiply-add, biases and norms
    not counted: with timm's explicit attention (q @ kᵀ, attn @ v as bmm) it equals the formula exactly.
    With fused SDPA on CPU (aten._scaled_dot_product_flash_attention_for_cpu, no registered formula
    in torch 2.14) it misses exactly the two attention matmuls; CUDA's SDPA kernels are counted."""
    model = build_vit("Mu/7", stem=stem, img_size=28, num_classes=10).eval()
    x = torch.randn(2, 3, 28, 28)
    analytic = vit_forward_flops("Mu/7", img_size=28, num_classes=10)
    fused = counted_flops(model, x)
    assert fused in (analytic.total, analytic.total - analytic.attention_matmuls)
    for blk in model.blocks:
        blk.attn.fused_attn = False
    assert counted_flops(model, x) == analytic.total


def test_gap_pool_and_pre_logits():
    model = build_vit("Mu/7", stem="dpn", img_size=28, num_classes=10, pool="gap", rep_size=48).eval()
    for blk in model.blocks:
        blk.attn.fused_attn = False
    analytic = vit_forward_flops("Mu/7", img_size=28, num_classes=10, class_token=False, rep_size=48)
    assert analytic.tokens == analytic.patches == 16
    assert counted_flops(model, torch.randn(1, 3, 28, 28)) == analytic.total


@pytest.mark.parametrize("arch", ["Ti/16", "S/16", "B/16", "L/16"])
def test_full_size_models_on_meta_device(arch):
    """The benchmarked sizes, counted without computing anything (meta tensors take SDPA's math path,
    whose bmm's are counted); our DPN model and timm's stock model give the same count."""
    with torch.device("meta"):
        ours = build_vit(arch, stem="dpn", img_size=224, num_classes=1000)
    x = torch.empty(1, 3, 224, 224, device="meta")
    expected = vit_forward_flops(arch).total
    assert counted_flops(ours, x) == expected
    if arch == "B/16":
        with torch.device("meta"):
            stock = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000)
        assert counted_flops(stock, x) == expected


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.4),
    ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", 835.5),
    ("NVIDIA H200", 989.4),
    ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA A10", 125.0),
    ("NVIDIA L4", 121.0),
])
def test_peak_table(name, tflops):
    assert peak_bf16_tflops(name)[0] == tflops


def test_unknown_device_has_no_peak():
    assert peak_bf16_tflops("NVIDIA GeForce RTX 4090") is None
    assert peak_bf16_tflops("AMD EPYC 7B13") is None
