"""ViT model family of the Dual PatchNorm reproduction (stems, LayerNorm placements, timm registry).

Importing this package registers ``vit_<size>_patch<p>_{dpn,linear,conv}`` with timm.
"""
from .vision_transformer_dpn import (
    ARCHS,
    PLACEMENTS,
    POOLS,
    POSEMBS,
    STEMS,
    Affine,
    ArchSpec,
    Block,
    PatchEmbedStem,
    VisionTransformerDPN,
    build_vit,
    conv_to_linear_weight,
    first_ln_scale_image,
    parse_arch,
    posemb_sincos_2d,
    subln_init_gain,
)

__all__ = [
    'ARCHS', 'PLACEMENTS', 'POOLS', 'POSEMBS', 'STEMS', 'Affine', 'ArchSpec', 'Block', 'PatchEmbedStem',
    'VisionTransformerDPN', 'build_vit', 'conv_to_linear_weight', 'first_ln_scale_image', 'parse_arch',
    'posemb_sincos_2d', 'subln_init_gain',
]
