"""Analytic FLOP counts for the ViTs of :mod:`dpnrepro.models`, and the peak FLOP/s used for MFU.

Convention: a multiply-add is **2 FLOPs** (timm / fvcore print multiply-accumulates, so timm's
"17.6 GFLOPs" for ViT-B/16 is 35.2 GFLOP in this convention). Only the matrix products are counted,
which is what model-FLOPs utilisation (MFU, PaLM appendix B) counts:

* patch embedding ``2·N·(p²·C)·D`` (the conv stem and the linear/DPN stems are the same product),
* per block: QKV ``2·T·D·3D``, attention scores ``Q·Kᵀ`` ``2·T²·D``, ``softmax·V`` ``2·T²·D``,
  output projection ``2·T·D²``, MLP ``2·T·D·M`` twice,
* head: optional pre-logits ``2·D·R`` and the classifier ``2·R·K`` (on the pooled token only),

with ``N`` patches, ``T = N + 1`` tokens when there is a class token, width ``D``, MLP width ``M``.
**Excluded**: LayerNorms (so the two DPN LayerNorms add nothing: all stems of one arch get the same
model FLOPs, and MFU differences between stems are time differences), softmax, GELU, tanh, bias and
residual additions, position-embedding addition, pooling, the loss and the optimizer update. For
ViT-B/16 at 224 px they are well under 1 % of the total.

Training FLOPs are ``3 ×`` forward (backward = 2 × forward: gradients w.r.t. activations and weights;
no activation recomputation is counted).

``torch.utils.flop_counter.FlopCounterMode`` counts the same matmuls (``mm``/``addmm``/``bmm``/
``convolution``, 2 FLOPs per multiply-add, biases not counted). For attention it counts
``aten._scaled_dot_product_{flash,efficient,cudnn}_attention`` (the CUDA SDPA kernels) as the two
attention matmuls, ``4·B·H·T²·d``, identical to the formula here; the CPU kernel
``aten._scaled_dot_product_flash_attention_for_cpu`` has no registered formula in torch 2.14, so on
CPU FlopCounterMode misses the attention matmuls unless timm's non-fused attention path is used
(``attn.fused_attn = False``: explicit ``q @ kᵀ`` and ``attn @ v``, counted as ``bmm``). The tests
check both cases.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from dpnrepro.model_spec import ArchSpec, parse_arch

__all__ = [
    "PEAK_BF16_TFLOPS",
    "TRAIN_FLOPS_MULTIPLIER",
    "ViTFlops",
    "peak_bf16_tflops",
    "train_flops_per_image",
    "vit_forward_flops",
]

TRAIN_FLOPS_MULTIPLIER = 3  # forward + backward (2 × forward)


@dataclass(frozen=True)
class ViTFlops:
    """Forward FLOPs of one image, split by component (2 FLOPs per multiply-add)."""

    patch_embed: int
    qkv: int
    attn_scores: int   # Q·Kᵀ, all blocks
    attn_values: int   # softmax(·)·V, all blocks
    attn_proj: int
    mlp: int
    head: int          # pre-logits (if any) + classifier
    tokens: int
    patches: int

    @property
    def total(self) -> int:
        return (self.patch_embed + self.qkv + self.attn_scores + self.attn_values + self.attn_proj
                + self.mlp + self.head)

    @property
    def attention_matmuls(self) -> int:
        """The two matmuls inside SDPA (what FlopCounterMode misses for the CPU SDPA kernel)."""
        return self.attn_scores + self.attn_values

    def as_dict(self) -> dict:
        return dict(asdict(self), total=self.total)


def vit_forward_flops(
        arch: str | ArchSpec,
        *,
        patch: int | None = None,
        img_size: int = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        class_token: bool = True,
        rep_size: int = 0,
) -> ViTFlops:
    """Forward FLOPs per image of the ViT ``arch`` (``"B/16"``, ``"B-16"`` or an :class:`ArchSpec`
    with ``patch``). ``rep_size``: width of the pre-logits layer (0 = none, as timm's stock ViTs).

    >>> round(vit_forward_flops("B/16").total / 1e9, 2)
    35.13
    """
    if isinstance(arch, ArchSpec):
        if patch is None:
            raise ValueError("patch is required when arch is an ArchSpec")
        spec = arch
    else:
        spec, p = parse_arch(arch.replace("-", "/"))
        patch = p if patch is None else patch
    if img_size % patch:
        raise ValueError(f"img_size {img_size} is not divisible by patch size {patch}")
    d, depth, m = spec.width, spec.depth, spec.mlp_dim
    n = (img_size // patch) ** 2
    t = n + (1 if class_token else 0)
    head_in = rep_size or d
    return ViTFlops(
        patch_embed=2 * n * patch * patch * in_chans * d,
        qkv=depth * 2 * t * d * 3 * d,
        attn_scores=depth * 2 * t * t * d,
        attn_values=depth * 2 * t * t * d,
        attn_proj=depth * 2 * t * d * d,
        mlp=depth * 2 * (2 * t * d * m),
        head=(2 * d * rep_size if rep_size else 0) + 2 * head_in * num_classes,
        tokens=t,
        patches=n,
    )


def train_flops_per_image(arch: str | ArchSpec, **kwargs) -> int:
    """Training FLOPs per image: ``3 ×`` :func:`vit_forward_flops` ``.total``."""
    return TRAIN_FLOPS_MULTIPLIER * vit_forward_flops(arch, **kwargs).total


# Dense (no 2:4 sparsity) bf16 tensor-core peaks in TFLOP/s from NVIDIA's datasheets, matched against
# ``torch.cuda.get_device_name()`` in this order (first match wins; more specific names first).
PEAK_BF16_TFLOPS: tuple[tuple[str, str, float], ...] = (
    (r"\bGH200\b", "GH200 (H100/H200 SXM class)", 989.4),
    (r"\bH200\b.*\bNVL\b", "H200 NVL", 835.5),
    (r"\bH200\b", "H200 SXM", 989.4),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", 756.0),
    (r"\bH100\b.*\bNVL\b", "H100 NVL", 835.5),
    (r"\bH100\b", "H100 SXM", 989.4),
    (r"\bH800\b.*\bPCIe\b", "H800 PCIe", 756.0),
    (r"\bH800\b", "H800 SXM", 989.4),
    (r"\bA100\b", "A100", 312.0),
    (r"\bA800\b", "A800", 312.0),
    (r"\bL40S\b", "L40S", 362.05),
    (r"\bL4\b", "L4", 121.0),
    (r"\bA10\b", "A10", 125.0),
)


def peak_bf16_tflops(device_name: str) -> tuple[float, str] | None:
    """``(dense bf16 peak TFLOP/s, matched entry)`` for a CUDA device name, or None if unknown."""
    for pattern, label, tflops in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return tflops, label
    return None
