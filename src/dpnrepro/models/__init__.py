"""ViT model family of the Dual PatchNorm reproduction (stems, LayerNorm placements, timm registry).

Importing this package (``import dpnrepro.models``, in any order with timm) registers
``vit_<size>_patch<p>_{dpn,linear,conv}`` with timm, as timm's own families register on import, so
``timm.create_model("vit_base_patch16_dpn", stem=..., placement=...)`` builds them. ``import dpnrepro``
alone loads neither torch nor timm.

Files: :mod:`dpnrepro.model_spec` (sizes, stems, placements and the other choices; outside this package,
torch-free, re-exported here), ``stems`` (the patch embedding:
DPN and the Table 6 ablations), ``block`` (the LayerNorm placements), ``dtn`` (Dynamic Token
Normalization), ``posemb`` (sin-cos table, resampling), ``vision_transformer_dpn`` (the model, its
init and the timm entrypoints).
"""
from dpnrepro.model_spec import ARCHS, BLOCK_NORMS, PLACEMENTS, POOLS, POSEMBS, STEMS, ArchSpec, parse_arch

from .block import Block, subln_init_gain
from .dtn import DynamicTokenNorm
from .posemb import posemb_sincos_2d
from .stems import Affine, PatchEmbedStem, conv_to_linear_weight, first_ln_scale_image
from .vision_transformer_dpn import VisionTransformerDPN, build_vit, init_weights_vit_dpn

__all__ = [
    'ARCHS', 'BLOCK_NORMS', 'PLACEMENTS', 'POOLS', 'POSEMBS', 'STEMS', 'Affine', 'ArchSpec', 'Block',
    'DynamicTokenNorm', 'PatchEmbedStem', 'VisionTransformerDPN', 'build_vit', 'conv_to_linear_weight',
    'first_ln_scale_image', 'init_weights_vit_dpn', 'parse_arch', 'posemb_sincos_2d', 'subln_init_gain',
]
