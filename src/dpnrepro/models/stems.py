"""Patch-embedding stems of the ViT-DPN family: Dual PatchNorm (eq. 4, ``x = LN(PE(LN(x)))``) and every
stem ablation of Table 6, as one timm ``PatchEmbed`` subclass (:class:`PatchEmbedStem`), passed to timm's
``VisionTransformer`` as ``embed_layer``; with the conv -> Linear kernel reshape and the first LN's
scale as an image (Fig. 3)."""
from typing import Optional, Tuple, Type, Union

import torch
from einops import rearrange
from torch import Tensor, nn
from torch.jit import Final

from timm.layers import Format, LayerNorm, PatchEmbed, to_2tuple

from dpnrepro.model_spec import LN_EPS, STEMS, check_choice

__all__ = ['Affine', 'PatchEmbedStem', 'conv_to_linear_weight', 'first_ln_scale_image']

# stem -> (norm on the patch pixels before the projection, norm on the tokens after it)
_STEM_NORMS = {
    'conv': (False, False),
    'linear': (False, False),
    'dpn': (True, True),
    'pre': (True, False),
    'post': (False, True),
    'post_posemb': (False, False),  # its norm is the model's norm_pre, after the position embedding
    'rmsnorm': (True, True),
    'no_learnable': (True, True),
    'only_learnable': (True, True),
}


class Affine(nn.Module):
    """Per-feature scale and shift without standardisation (Table 6 "Only learnable")."""

    def __init__(self, dim: int, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight + self.bias


def _stem_norm(stem: str, dim: int, **dd) -> nn.Module:
    """The norm used on either side of the patch projection for ``stem``."""
    if stem == 'rmsnorm':
        return nn.RMSNorm(dim, eps=LN_EPS, **dd)
    if stem == 'no_learnable':
        return LayerNorm(dim, eps=LN_EPS, affine=False, **dd)
    if stem == 'only_learnable':
        return Affine(dim, **dd)
    return LayerNorm(dim, eps=LN_EPS, **dd)


@torch.fx.wrap
def _checked_input(x: Tensor, img_size: Tuple[int, int], patch_size: Tuple[int, int], strict: bool,
                   pad: bool) -> Tensor:
    """``x`` after checking its (H, W) against the stem's settings (ValueError); an FX leaf."""
    H, W = x.shape[-2], x.shape[-1]
    if strict and (H != img_size[0] or W != img_size[1]):
        raise ValueError(f'input size ({H}, {W}) does not match the model img_size ({img_size[0]}, {img_size[1]})')
    if not pad and (H % patch_size[0] != 0 or W % patch_size[1] != 0):
        raise ValueError(
            f'input size ({H}, {W}) is not divisible by patch size ({patch_size[0]}, {patch_size[1]})')
    return x


class PatchEmbedStem(PatchEmbed):
    """timm's ``PatchEmbed`` with the paper's stem variants; a drop-in ``embed_layer`` for timm's ViT.

    ``conv`` is timm's Conv2d patch projection. Every other stem patchifies as
    ``b c (h p1) (w p2) -> b (h w) (p1 p2 c)`` (patch row ``p1``, patch column ``p2``, channel ``c``
    fastest; the big_vision order of the paper's appendix B, so a pixel-space vector such as the
    first LN's scale reshapes to ``(p, p, c)`` for Fig. 3) and projects with ``proj = nn.Linear``.

    Modules, in order: ``norm_in`` (on the ``p*p*c`` patch pixels), ``proj``, ``norm_out`` (on the
    ``embed_dim`` tokens, before position embeddings are added); absent ones are ``nn.Identity``.
    ``dpn``: LN, Linear, LN (eq. 4). ``pre``: LN, Linear. ``post``: Linear, LN. ``post_posemb``:
    Linear only (its LN is the model's ``norm_pre``). ``rmsnorm`` / ``no_learnable`` /
    ``only_learnable``: as ``dpn`` with both norms RMSNorm / LN without affine / :class:`Affine`.
    Image/grid bookkeeping (``grid_size``, ``num_patches``, ``feat_ratio``, ``dynamic_feat_size``,
    ``strict_img_size``, ``dynamic_img_pad``) is timm's; outputs are ``NLC`` or ``NHWC`` tokens.
    """
    output_fmt: Format
    dynamic_img_pad: Final[bool]
    patchify: Final[bool]

    def __init__(
            self,
            img_size: Union[int, Tuple[int, int]] = 224,
            patch_size: Union[int, Tuple[int, int]] = 16,
            in_chans: int = 3,
            embed_dim: int = 768,
            stem: str = 'dpn',
            norm_layer: Optional[Type[nn.Module]] = None,
            output_fmt: Optional[str] = None,
            bias: bool = True,
            strict_img_size: bool = True,
            dynamic_img_pad: bool = False,
            device=None,
            dtype=None,
    ) -> None:
        dd = {'device': device, 'dtype': dtype}
        check_choice('stem', stem, STEMS)
        if norm_layer is not None:
            raise ValueError('PatchEmbedStem takes its norms from `stem`; embed_norm_layer is not supported')
        check_choice('output_fmt', output_fmt, (None, 'NLC', 'NHWC'))
        patchify = stem != 'conv'
        super().__init__(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            output_fmt=output_fmt or 'NLC',
            bias=bias,
            strict_img_size=strict_img_size,
            dynamic_img_pad=dynamic_img_pad,
            # the Linear stems replace timm's Conv2d: build that one on meta (no memory, no RNG draws)
            device='meta' if patchify else device,
            dtype=dtype,
        )
        del self.norm  # timm's post-projection norm: ours are norm_in / norm_out
        self.stem = stem
        self.patchify = patchify

        ph, pw = self.patch_size
        patch_dim = ph * pw * in_chans
        has_norm_in, has_norm_out = _STEM_NORMS[stem]
        self.norm_in = _stem_norm(stem, patch_dim, **dd) if has_norm_in else nn.Identity()
        if self.patchify:
            self.proj = nn.Linear(patch_dim, embed_dim, bias=bias, **dd)
        self.norm_out = _stem_norm(stem, embed_dim, **dd) if has_norm_out else nn.Identity()

    def _init_img_size(self, img_size: Union[int, Tuple[int, int]]):
        if img_size is not None and any(s % p for s, p in zip(to_2tuple(img_size), self.patch_size)):
            raise ValueError(f'img_size {tuple(to_2tuple(img_size))} is not divisible by patch size {self.patch_size}')
        return super()._init_img_size(img_size)

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        """Change the expected image size; a new patch size only for the ``conv`` stem (timm resamples)."""
        if patch_size is not None and to_2tuple(patch_size) != self.patch_size and self.patchify:
            raise NotImplementedError(f'the {self.stem!r} stem cannot change its patch size')
        super().set_input_size(img_size=img_size, patch_size=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        ph, pw = self.patch_size
        x = _checked_input(x, self.img_size, self.patch_size, self.strict_img_size, self.dynamic_img_pad)
        if self.dynamic_img_pad:
            H, W = x.shape[-2], x.shape[-1]
            x = nn.functional.pad(x, (0, (pw - W % pw) % pw, 0, (ph - H % ph) % ph))
        B, C, H, W = x.shape
        gh, gw = H // ph, W // pw

        if self.patchify:
            # b c (h p1) (w p2) -> b (h w) (p1 p2 c), as reshapes (scriptable and FX-traceable)
            x = x.reshape(B, C, gh, ph, gw, pw).permute(0, 2, 4, 3, 5, 1).reshape(B, gh * gw, ph * pw * C)
            x = self.proj(self.norm_in(x))
        else:
            x = self.proj(x).flatten(2).transpose(1, 2)
        x = self.norm_out(x)
        if self.output_fmt == Format.NHWC:
            x = x.reshape(B, gh, gw, x.shape[-1])
        return x


def conv_to_linear_weight(conv_weight: Tensor) -> Tensor:
    """Reshape a ``(D, C, p1, p2)`` conv kernel to the ``(D, p1*p2*C)`` weight of the ``linear`` stem."""
    if conv_weight.ndim != 4:
        raise ValueError(f'expected a (D, C, p, p) conv kernel, got shape {tuple(conv_weight.shape)}')
    return rearrange(conv_weight, 'd c p1 p2 -> d (p1 p2 c)')


def first_ln_scale_image(model: nn.Module) -> Tensor:
    """The scale of the stem's first (pixel-space) norm reshaped to ``(p, p, C)`` (paper Fig. 3).

    Works for the ``dpn``, ``pre``, ``rmsnorm`` and ``only_learnable`` stems; ValueError otherwise.
    """
    pe = getattr(model, 'patch_embed', None)
    weight = getattr(getattr(pe, 'norm_in', None), 'weight', None)
    if not isinstance(weight, Tensor):
        stem = getattr(pe, 'stem', type(pe).__name__)
        allowed = [s for s in STEMS if _STEM_NORMS[s][0] and s != 'no_learnable']
        raise ValueError(f'stem {stem!r} has no learnable norm on the patch pixels; '
                         f'expected one of: {", ".join(allowed)}')
    ph, pw = pe.patch_size
    return weight.detach().reshape(ph, pw, weight.numel() // (ph * pw))

