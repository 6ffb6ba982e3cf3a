"""ViT model family of the Dual PatchNorm reproduction (stems, LayerNorm placements, timm registry).

Importing this package (``import dpnrepro`` does) registers ``vit_<size>_patch<p>_{dpn,linear,conv}``
with timm, so ``timm.create_model("vit_base_patch16_dpn", stem=..., placement=...)`` builds them.
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
    init_weights_vit_dpn,
    parse_arch,
    posemb_sincos_2d,
    subln_init_gain,
)

__all__ = [
    'ARCHS', 'PLACEMENTS', 'POOLS', 'POSEMBS', 'STEMS', 'Affine', 'ArchSpec', 'Block', 'PatchEmbedStem',
    'VisionTransformerDPN', 'build_vit', 'conv_to_linear_weight', 'first_ln_scale_image', 'init_weights_vit_dpn',
    'parse_arch',
    'posemb_sincos_2d', 'subln_init_gain',
]
