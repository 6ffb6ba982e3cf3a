"""Vision Transformer with Dual PatchNorm and the paper's LayerNorm ablations.

`Dual PatchNorm` - Kumar, Dehghani, Houlsby, TMLR 2023 (arXiv:2302.01327).

One model family built on timm's :class:`~timm.models.vision_transformer.VisionTransformer`:

* the stem (``stem=``) is a :class:`~dpnrepro.models.stems.PatchEmbedStem`, a timm ``PatchEmbed``
  passed as ``embed_layer``; it covers DPN (eq. 4, ``x = LN(PE(LN(x)))``) and every stem ablation of
  Table 6;
* the transformer block (``placement=``) is a :class:`~dpnrepro.models.block.Block` passed as timm's
  ``block_fn``; it covers the nine pre/post/prepost LayerNorm placements of Sec. 4.1 / Fig. 1 plus
  NormFormer and Sub-LN; ``block_norm='dtn'`` swaps its residual-stream LayerNorms for
  :class:`~dpnrepro.models.dtn.DynamicTokenNorm`;
* the head follows big_vision: ``tok`` or ``gap`` pooling, optional ``pre_logits`` (Linear + tanh),
  zero-init head weight and a constant head bias.

Where timm and big_vision differ, big_vision (the code base of the paper) is followed: position
embeddings are added to the patch tokens only (``no_embed_class=True``), the encoder norm comes before
``gap`` pooling, and weights use big_vision's init (timm's JAX init, see :func:`init_weights_vit_dpn`).
Dropout arguments mean what they mean in timm: ``drop_rate`` is the head dropout, big_vision's
``dropout`` is ``pos_drop_rate`` plus ``proj_drop_rate``.

This file holds the model class, its weight init and, at the bottom as in timm, the registered
entrypoints ``vit_<size>_patch<p>_{dpn,linear,conv}``: models are built with
``timm.create_model("vit_base_patch16_dpn", stem=..., placement=...)`` (registered by importing
:mod:`dpnrepro.models`); :func:`build_vit` maps ``"B/16"``-style names onto it. The names of sizes, stems and
placements are in :mod:`dpnrepro.model_spec`.
"""
from collections import OrderedDict
from functools import partial
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

from timm.data import IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD
from timm.layers import LayerNorm, lecun_normal_
from timm.models import build_model_with_cfg, create_model, generate_default_cfgs, named_apply, register_model
from timm.models.vision_transformer import VisionTransformer, init_weights_vit_jax

from dpnrepro.model_spec import BLOCK_NORMS, PLACEMENTS, POOLS, POSEMBS, STEMS, check_choice, parse_arch

from .block import Block, subln_init_gain
from .dtn import DynamicTokenNorm
from .posemb import posemb_sincos_2d
from .stems import PatchEmbedStem

__all__ = ['VisionTransformerDPN', 'init_weights_vit_dpn', 'build_vit']  # register_model appends the entrypoints


def _cfg(**kwargs) -> dict:
    return {
        'url': '',
        'num_classes': 1000,
        'input_size': (3, 224, 224),
        'pool_size': None,
        'crop_pct': 0.875,  # big_vision eval: resize_small(256) | central_crop(224)
        'interpolation': 'bilinear',
        'fixed_input_size': True,
        'mean': IMAGENET_INCEPTION_MEAN,  # big_vision value_range(-1, 1)
        'std': IMAGENET_INCEPTION_STD,
        'first_conv': 'patch_embed.proj',
        'classifier': 'head',
        'license': 'apache-2.0',
        'paper_ids': 'arXiv:2302.01327',
        'paper_name': 'Dual PatchNorm',
        **kwargs,
    }


def init_weights_vit_dpn(module: nn.Module, name: str = '', head_bias: float = 0.0, needs_reset: bool = True) -> None:
    """big_vision's ViT init of one module: timm's JAX init (:func:`init_weights_vit_jax`), except that
    q, k and v are xavier-uniform each as its own D x D matrix and the Linear patch projection and
    ``pre_logits.fc`` are lecun-normal (big_vision's Conv / Dense kernels), biases zero."""
    if isinstance(module, nn.Linear) and (name.endswith('attn.qkv') or name in ('patch_embed.proj', 'pre_logits.fc')):
        if name.endswith('attn.qkv'):
            for w in module.weight.chunk(3, dim=0):
                nn.init.xavier_uniform_(w)
        else:
            lecun_normal_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    else:
        init_weights_vit_jax(module, name, head_bias=head_bias, needs_reset=needs_reset)


class VisionTransformerDPN(VisionTransformer):
    """ViT with a selectable stem (Dual PatchNorm and its ablations) and LayerNorm placement.

    big_vision flavour of timm's VisionTransformer: position embeddings on patch tokens only, encoder
    norm before pooling (also for ``gap``), optional ``pre_logits`` (Linear + tanh), zero-init head.
    Every other timm ``VisionTransformer`` argument is accepted and passed through (except
    ``embed_layer`` / ``block_fn``, which ``stem`` / ``placement`` choose).
    """

    def __init__(
            self,
            img_size: Union[int, Tuple[int, int]] = 224,
            patch_size: Union[int, Tuple[int, int]] = 16,
            in_chans: int = 3,
            num_classes: int = 1000,
            embed_dim: int = 768,
            depth: int = 12,
            num_heads: int = 12,
            mlp_ratio: float = 4.,
            stem: str = 'dpn',
            placement: str = 'pre-pre',
            block_norm: str = 'ln',
            pool: str = 'tok',
            rep_size: Union[int, bool] = False,
            head_bias_init: float = 0.0,
            posemb: str = 'learn',
            drop_rate: float = 0.,
            pos_drop_rate: float = 0.,
            proj_drop_rate: float = 0.,
            attn_drop_rate: float = 0.,
            drop_path_rate: float = 0.,
            weight_init: str = '',
            device=None,
            dtype=None,
            **kwargs,
    ) -> None:
        """
        Args:
            stem: patch embedding, one of :data:`STEMS` (see :class:`PatchEmbedStem`).
            placement: LayerNorm placement in the blocks, one of :data:`PLACEMENTS` (see :class:`Block`).
            block_norm: the blocks' residual-stream normalizer, one of :data:`BLOCK_NORMS`: ``ln``
                (LayerNorm) or ``dtn`` (:class:`DynamicTokenNorm`, one group per attention head). The
                stem's norms and the encoder's final norm are unaffected.
            pool: ``tok`` (class token) or ``gap`` (mean of the patch tokens, no class token).
            rep_size: pre-logits Linear + tanh: False/0 none, True the width, an int that size.
            head_bias_init: constant init of the head bias (head weight is zero).
            posemb: ``learn`` or big_vision's fixed ``sincos2d`` (not trained).
            drop_rate: head dropout (timm). big_vision's ``dropout`` is ``pos_drop_rate`` (after the
                position embedding) plus ``proj_drop_rate`` (attention output, inside and after the MLP).
            attn_drop_rate, drop_path_rate: attention dropout and stochastic depth (timm).
            weight_init: ``''`` / ``'jax'`` big_vision's init (:meth:`init_weights`), ``'skip'`` none.
            **kwargs: further arguments of timm's ``VisionTransformer`` (``qkv_bias``, ``reg_tokens``,
                ``dynamic_img_size``, ``global_pool``, ...).
        """
        check_choice('stem', stem, STEMS)
        check_choice('placement', placement, PLACEMENTS)
        check_choice('block norm', block_norm, BLOCK_NORMS)
        check_choice('pool', pool, POOLS)
        check_choice('posemb', posemb, POSEMBS)
        check_choice('weight_init', weight_init, ('', 'jax', 'skip'))
        for key, ours in (('embed_layer', 'stem'), ('block_fn', 'placement')):
            if key in kwargs:
                raise ValueError(f'{key} is chosen by `{ours}`; it cannot be passed to VisionTransformerDPN')
        if isinstance(rep_size, bool):
            rep = embed_dim if rep_size else 0
        elif isinstance(rep_size, int) and rep_size >= 0:
            rep = rep_size
        else:
            raise ValueError(f'rep_size must be a bool or a non-negative int, got {rep_size!r}')
        dd = {'device': device, 'dtype': dtype}

        vit_args = dict(
            global_pool='token' if pool == 'tok' else 'avg',
            class_token=pool == 'tok',
            no_embed_class=True,
            pre_norm=stem == 'post_posemb',
            final_norm=True,
            fc_norm=False,
            norm_layer=LayerNorm,  # timm's LayerNorm, eps 1e-6 as flax
            act_layer=nn.GELU,
        )
        vit_args.update(kwargs)
        residual_norm = None
        if block_norm == 'dtn':
            num_prefix = int(bool(vit_args['class_token'])) + int(vit_args.get('reg_tokens', 0) or 0)
            residual_norm = partial(DynamicTokenNorm, num_heads=num_heads, num_prefix_tokens=num_prefix)
        super().__init__(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            num_classes=num_classes,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            drop_rate=drop_rate,
            pos_drop_rate=pos_drop_rate,
            proj_drop_rate=proj_drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate,
            weight_init='skip',
            embed_layer=partial(PatchEmbedStem, stem=stem),
            block_fn=partial(Block, placement=placement, residual_norm_layer=residual_norm),
            **vit_args,
            **dd,
        )
        self.stem = stem
        self.placement = placement
        self.block_norm = block_norm
        self.pool_type = pool
        self.rep_size = rep
        self.head_bias_init = float(head_bias_init)
        self.posemb = posemb
        if posemb == 'sincos2d' and self.pos_embed is not None:
            self.pos_embed.requires_grad_(False)  # fixed, not trained (kept a parameter for state dicts)

        self.head_hidden_size = rep or embed_dim
        if rep:
            self.pre_logits = nn.Sequential(OrderedDict([
                ('fc', nn.Linear(embed_dim, rep, **dd)),
                ('act', nn.Tanh()),
            ]))
            if num_classes > 0:
                self.head = nn.Linear(rep, num_classes, **dd)
        else:
            self.pre_logits = nn.Identity()
        self.weight_init_mode = 'jax'
        if weight_init != 'skip':
            self.init_weights(needs_reset=False)

    @torch.no_grad()
    def init_weights(self, mode: str = '', needs_reset: bool = True) -> None:
        """big_vision's ViT init, for every parameter of the model (``mode``: ``''`` or ``'jax'``).

        Modules: :func:`init_weights_vit_dpn` (timm's JAX init: xavier-uniform Linear, MLP biases
        ~ N(0, 1e-6), other biases zero, lecun-normal conv, reset norms, zero head weight and bias
        ``head_bias_init``; q/k/v, Linear patch projection and ``pre_logits`` as big_vision). Position
        embedding ~ N(0, 1/D) (or the fixed sin-cos table), class token zero. For ``subln`` the v,
        attention-output and MLP weights are then multiplied by :func:`subln_init_gain`.
        """
        check_choice('weight init mode', mode or self.weight_init_mode, ('jax',))
        named_apply(partial(init_weights_vit_dpn, head_bias=self.head_bias_init, needs_reset=needs_reset), self)
        if self.pos_embed is not None:
            if self.posemb == 'sincos2d':
                self.pos_embed.copy_(posemb_sincos_2d(*self.patch_embed.grid_size, self.embed_dim))
            else:
                nn.init.normal_(self.pos_embed, std=self.embed_dim ** -0.5)
        if self.cls_token is not None:
            nn.init.zeros_(self.cls_token)
        if self.reg_token is not None:
            nn.init.normal_(self.reg_token, std=1e-6)
        if self.placement == 'subln':
            gain = subln_init_gain(len(self.blocks))
            for blk in self.blocks:
                blk.attn.qkv.weight.chunk(3, dim=0)[2].mul_(gain)
                blk.attn.proj.weight.mul_(gain)
                blk.mlp.fc1.weight.mul_(gain)
                blk.mlp.fc2.weight.mul_(gain)
        if self.fix_init:
            self.fix_init_weight()

    @torch.no_grad()
    def _init_head(self) -> None:
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)
            nn.init.constant_(self.head.bias, self.head_bias_init)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """Replace the head (zero weight, ``head_bias_init`` bias); ``global_pool`` uses timm's names."""
        super().reset_classifier(num_classes, global_pool)
        if num_classes > 0 and self.head_hidden_size != self.embed_dim:
            self.head = nn.Linear(self.head_hidden_size, num_classes, device=self.head.weight.device,
                                  dtype=self.head.weight.dtype)
        self._init_head()

    def prune_intermediate_layers(
            self,
            indices: Union[int, list] = 1,
            prune_norm: bool = False,
            prune_head: bool = True,
    ) -> list:
        """timm's pruning for feature extraction; pruning the head also drops ``pre_logits``."""
        take_indices = super().prune_intermediate_layers(indices, prune_norm=prune_norm, prune_head=prune_head)
        if prune_head:
            self.pre_logits = nn.Identity()
            self.head_hidden_size = self.embed_dim
        return take_indices

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        """timm's resize (position embeddings resampled); a ``sincos2d`` table is recomputed instead."""
        super().set_input_size(img_size=img_size, patch_size=patch_size)
        if self.posemb == 'sincos2d' and self.pos_embed is not None:
            with torch.no_grad():
                self.pos_embed.copy_(posemb_sincos_2d(*self.patch_embed.grid_size, self.embed_dim))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        x = self.pool(x)
        x = self.fc_norm(x)
        x = self.pre_logits(x)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)


def build_vit(arch: str, *, stem: str = 'dpn', **kwargs) -> VisionTransformerDPN:
    """``timm.create_model`` for ``arch`` (``"<size>/<patch>"``, e.g. ``"B/16"``, any patch size).

    Uses the registered entry of that size and stem (``"B/16"``, ``stem="dpn"`` ->
    ``vit_base_patch16_dpn``; the Table 6 ablation stems use the ``_dpn`` entry; an unregistered patch
    size overrides ``patch_size`` of an entry of that size). ``kwargs`` are
    :class:`VisionTransformerDPN`'s (``placement``, ``pool``, ``img_size``, ``num_classes``,
    ``pos_drop_rate``, ...). Unknown names and an ``img_size`` not divisible by the patch raise ValueError.
    """
    _, patch = parse_arch(arch)
    check_choice('stem', stem, STEMS)
    size = arch.strip().split('/')[0]
    bases = [b for b, a in _REGISTERED_ARCHS.items() if a.split('/')[0] == size]
    base = next((b for b in bases if _REGISTERED_ARCHS[b] == f'{size}/{patch}'), bases[0])
    name = f'{base}_{stem if stem in _REGISTERED_STEMS else "dpn"}'
    return create_model(name, stem=stem, patch_size=patch, **kwargs)


# ---------------------------------------------------------------------------------------------------
# timm registry: vit_<size>_patch<p>_<stem>, e.g. vit_base_patch16_dpn

_REGISTERED_ARCHS = {
    'vit_mu_patch4': 'Mu/4',
    'vit_tiny_patch16': 'Ti/16',
    'vit_small_patch16': 'S/16',
    'vit_small_patch32': 'S/32',
    'vit_base_patch16': 'B/16',
    'vit_base_patch32': 'B/32',
    'vit_large_patch16': 'L/16',
    'vit_huge_patch14': 'H/14',
}
_REGISTERED_STEMS = ('dpn', 'linear', 'conv')

default_cfgs = generate_default_cfgs({
    f'{base}_{stem}': _cfg() for base in _REGISTERED_ARCHS for stem in _REGISTERED_STEMS})


def _arch_args(arch: str) -> dict:
    spec, patch = parse_arch(arch)
    return dict(patch_size=patch, embed_dim=spec.width, depth=spec.depth, num_heads=spec.heads,
                mlp_ratio=spec.mlp_dim / spec.width)


def _create_vit_dpn(variant: str, arch: str, pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """The entry ``variant``: ``arch``'s size and patch, the stem its name ends with; ``kwargs`` override."""
    model_args = dict(_arch_args(arch), stem=variant.rsplit('_', 1)[1])
    kwargs = dict(model_args, **kwargs)
    out_indices = kwargs.pop('out_indices', 3)
    return build_model_with_cfg(
        VisionTransformerDPN,
        variant,
        pretrained,
        feature_cfg=dict(out_indices=out_indices, feature_cls='getter'),
        **kwargs,
    )


@register_model
def vit_mu_patch4_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-Mu/4, Dual PatchNorm stem (LN, Dense, LN)."""
    return _create_vit_dpn('vit_mu_patch4_dpn', 'Mu/4', pretrained, **kwargs)

@register_model
def vit_mu_patch4_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-Mu/4, Linear patch stem."""
    return _create_vit_dpn('vit_mu_patch4_linear', 'Mu/4', pretrained, **kwargs)

@register_model
def vit_mu_patch4_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-Mu/4, Conv2d patch stem."""
    return _create_vit_dpn('vit_mu_patch4_conv', 'Mu/4', pretrained, **kwargs)

@register_model
def vit_tiny_patch16_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-Ti/16, Dual PatchNorm stem (LN, Dense, LN)."""
    return _create_vit_dpn('vit_tiny_patch16_dpn', 'Ti/16', pretrained, **kwargs)

@register_model
def vit_tiny_patch16_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-Ti/16, Linear patch stem."""
    return _create_vit_dpn('vit_tiny_patch16_linear', 'Ti/16', pretrained, **kwargs)

@register_model
def vit_tiny_patch16_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-Ti/16, Conv2d patch stem."""
    return _create_vit_dpn('vit_tiny_patch16_conv', 'Ti/16', pretrained, **kwargs)

@register_model
def vit_small_patch16_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/16, Dual PatchNorm stem (LN, Dense, LN)."""
    return _create_vit_dpn('vit_small_patch16_dpn', 'S/16', pretrained, **kwargs)

@register_model
def vit_small_patch16_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/16, Linear patch stem."""
    return _create_vit_dpn('vit_small_patch16_linear', 'S/16', pretrained, **kwargs)

@register_model
def vit_small_patch16_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/16, Conv2d patch stem."""
    return _create_vit_dpn('vit_small_patch16_conv', 'S/16', pretrained, **kwargs)

@register_model
def vit_small_patch32_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/32, Dual PatchNorm stem (LN, Dense, LN)."""
    return _create_vit_dpn('vit_small_patch32_dpn', 'S/32', pretrained, **kwargs)

@register_model
def vit_small_patch32_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/32, Linear patch stem."""
    return _create_vit_dpn('vit_small_patch32_linear', 'S/32', pretrained, **kwargs)

@register_model
def vit_small_patch32_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/32, Conv2d patch stem."""
    return _create_vit_dpn('vit_small_patch32_conv', 'S/32', pretrained, **kwargs)

@register_model
def vit_base_patch16_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/16, Dual PatchNorm stem (LN, Dense, LN)."""
    return _create_vit_dpn('vit_base_patch16_dpn', 'B/16', pretrained, **kwargs)

@register_model
def vit_base_patch16_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/16, Linear patch stem."""
    return _create_vit_dpn('vit_base_patch16_linear', 'B/16', pretrained, **kwargs)

@register_model
def vit_base_patch16_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/16, Conv2d patch stem."""
    return _create_vit_dpn('vit_base_patch16_conv', 'B/16', pretrained, **kwargs)

@register_model
def vit_base_patch32_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/32, Dual PatchNorm stem (LN, Dense, LN)."""
    return _create_vit_dpn('vit_base_patch32_dpn', 'B/32', pretrained, **kwargs)

@register_model
def vit_base_patch32_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/32, Linear patch stem."""
    return _create_vit_dpn('vit_base_patch32_linear', 'B/32', pretrained, **kwargs)

@register_model
def vit_base_patch32_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/32, Conv2d patch stem."""
    return _create_vit_dpn('vit_base_patch32_conv', 'B/32', pretrained, **kwargs)

@register_model
def vit_large_patch16_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-L/16, Dual PatchNorm stem (LN, Dense, LN)."""
    return _create_vit_dpn('vit_large_patch16_dpn', 'L/16', pretrained, **kwargs)

@register_model
def vit_large_patch16_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-L/16, Linear patch stem."""
    return _create_vit_dpn('vit_large_patch16_linear', 'L/16', pretrained, **kwargs)

@register_model
def vit_large_patch16_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-L/16, Conv2d patch stem."""
    return _create_vit_dpn('vit_large_patch16_conv', 'L/16', pretrained, **kwargs)

@register_model
def vit_huge_patch14_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-H/14, Dual PatchNorm stem (LN, Dense, LN)."""
    return _create_vit_dpn('vit_huge_patch14_dpn', 'H/14', pretrained, **kwargs)

@register_model
def vit_huge_patch14_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-H/14, Linear patch stem."""
    return _create_vit_dpn('vit_huge_patch14_linear', 'H/14', pretrained, **kwargs)

@register_model
def vit_huge_patch14_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-H/14, Conv2d patch stem."""
    return _create_vit_dpn('vit_huge_patch14_conv', 'H/14', pretrained, **kwargs)
