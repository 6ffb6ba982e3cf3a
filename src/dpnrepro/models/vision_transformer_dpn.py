"""Vision Transformer with Dual PatchNorm and the paper's LayerNorm ablations.

`Dual PatchNorm` - Kumar, Dehghani, Houlsby, TMLR 2023 (arXiv:2302.01327).

One model family built on timm's :class:`~timm.models.vision_transformer.VisionTransformer`:

* the stem (``stem=``) is a :class:`PatchEmbedStem`, a timm ``PatchEmbed`` passed as ``embed_layer``; it
  covers DPN (eq. 4, ``x = LN(PE(LN(x)))``) and every stem ablation of Table 6;
* the transformer block (``placement=``) is a :class:`Block` passed as timm's ``block_fn``; it covers
  the nine pre/post/prepost LayerNorm placements of Sec. 4.1 / Fig. 1 plus NormFormer and Sub-LN;
* the head follows big_vision: ``tok`` or ``gap`` pooling, optional ``pre_logits`` (Linear + tanh),
  zero-init head weight and a constant head bias.

Where timm and big_vision differ, big_vision (the code base of the paper) is followed: position
embeddings are added to the patch tokens only (``no_embed_class=True``), the encoder norm comes before
``gap`` pooling, and weights use big_vision's init (timm's JAX init, see :func:`init_weights_vit_dpn`).
Dropout arguments mean what they mean in timm: ``drop_rate`` is the head dropout, big_vision's
``dropout`` is ``pos_drop_rate`` plus ``proj_drop_rate``.

Models are built with ``timm.create_model("vit_base_patch16_dpn", stem=..., placement=...)`` (the
entries are registered by importing :mod:`dpnrepro`); :func:`build_vit` maps ``"B/16"``-style names
onto it.
"""
import math
import re
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from typing import Optional, Tuple, Type, Union

import torch
from einops import rearrange
from torch import Tensor, nn
from torch.jit import Final

from timm.data import IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD
from timm.layers import Attention, DropPath, Format, LayerNorm, Mlp, PatchEmbed, lecun_normal_, to_2tuple
from timm.models import build_model_with_cfg, create_model, generate_default_cfgs, named_apply, register_model
from timm.models.vision_transformer import VisionTransformer, init_weights_vit_jax

__all__ = [
    'ArchSpec', 'ARCHS', 'STEMS', 'PLACEMENTS', 'POOLS', 'parse_arch', 'build_vit',
    'PatchEmbedStem', 'Block', 'Affine', 'VisionTransformerDPN', 'init_weights_vit_dpn',
    'conv_to_linear_weight', 'first_ln_scale_image', 'subln_init_gain', 'BLOCK_NORMS', 'DynamicTokenNorm',
]  # register_model appends the registered entrypoints


# ---------------------------------------------------------------------------------------------------
# Names

@dataclass(frozen=True)
class ArchSpec:
    """Transformer size: hidden width, number of blocks, attention heads, MLP hidden width."""
    width: int
    depth: int
    heads: int
    mlp_dim: int


# Ti..H as in the paper's appendix G (big_vision sizes); Mu is a smoke-test size.
ARCHS: dict[str, ArchSpec] = {
    'Mu': ArchSpec(64, 4, 4, 256),
    'Ti': ArchSpec(192, 12, 3, 768),
    'S': ArchSpec(384, 12, 6, 1536),
    'B': ArchSpec(768, 12, 12, 3072),
    'L': ArchSpec(1024, 24, 16, 4096),
    'H': ArchSpec(1280, 32, 16, 5120),
}

STEMS: tuple[str, ...] = (
    'conv', 'linear', 'dpn', 'pre', 'post', 'post_posemb', 'rmsnorm', 'no_learnable', 'only_learnable')

_SUBLAYER_NORMS = ('pre', 'post', 'prepost')
PLACEMENTS: tuple[str, ...] = tuple(
    f'{sa}-{mlp}' for sa in _SUBLAYER_NORMS for mlp in _SUBLAYER_NORMS) + ('normformer', 'subln')

# the normalizer of the blocks' residual stream (norm1 / norm2 and the post-LNs): LayerNorm, or
# Dynamic Token Normalization (Shao et al., ICLR 2022; :class:`DynamicTokenNorm`)
BLOCK_NORMS: tuple[str, ...] = ('ln', 'dtn')

POOLS: tuple[str, ...] = ('tok', 'gap')
POSEMBS: tuple[str, ...] = ('learn', 'sincos2d')

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

_LN_EPS = 1e-6  # flax / big_vision LayerNorm default


def _check_choice(kind: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f'unknown {kind} {value!r}; expected one of: {", ".join(map(str, allowed))}')


def parse_arch(arch: str) -> tuple[ArchSpec, int]:
    """``"B/16"`` -> ``(ARCHS["B"], 16)``; any positive integer patch size is accepted."""
    m = re.fullmatch(r'([A-Za-z]+)/([0-9]+)', arch.strip()) if isinstance(arch, str) else None
    if m is None or m.group(1) not in ARCHS or int(m.group(2)) < 1:
        raise ValueError(
            f'unknown arch {arch!r}; expected "<size>/<patch>" with size one of: {", ".join(ARCHS)} '
            f'and a positive integer patch, e.g. "B/16"')
    return ARCHS[m.group(1)], int(m.group(2))


# ---------------------------------------------------------------------------------------------------
# Stem

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
        return nn.RMSNorm(dim, eps=_LN_EPS, **dd)
    if stem == 'no_learnable':
        return LayerNorm(dim, eps=_LN_EPS, affine=False, **dd)
    if stem == 'only_learnable':
        return Affine(dim, **dd)
    return LayerNorm(dim, eps=_LN_EPS, **dd)


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
        _check_choice('stem', stem, STEMS)
        if norm_layer is not None:
            raise ValueError('PatchEmbedStem takes its norms from `stem`; embed_norm_layer is not supported')
        _check_choice('output_fmt', output_fmt, (None, 'NLC', 'NHWC'))
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


# ---------------------------------------------------------------------------------------------------
# Dynamic Token Normalization

class DynamicTokenNorm(nn.Module):
    """Dynamic Token Normalization (DTN; Shao et al., "Dynamic Token Normalization Improves Vision
    Transformers", ICLR 2022, arXiv:2112.02624), a drop-in for the blocks' LayerNorm.

    Tokens ``x`` (B, T, C), channels split into ``num_heads`` groups ``x^h`` (B, T, C/H). Per head,
    intra-token (LayerNorm) and inter-token statistics are mixed by a learnable ``λ^h ∈ [0, 1]``::

        μ^h  = λ^h μ_ln + (1 − λ^h) P^h x^h
        σ²^h = λ^h σ²_ln + (1 − λ^h) [P^h (x^h ⊙ x^h) − (P^h x^h) ⊙ (P^h x^h)]
        y    = γ (x − concat_h μ^h) / sqrt(concat_h σ²^h + eps) + β

    ``μ_ln`` / ``σ²_ln`` are the mean and (biased) variance of each token over all C channels.
    ``P^h = softmax_j(R_ij · a^h)`` is a row-stochastic T × T positional attention over the patch grid,
    ``R_ij = [δx² + δy², δx, δy]`` the shift from patch i to patch j, ``a^h`` learnable and initialised
    to ``[−1, 2Δx^h, 2Δy^h]`` so that head h looks at offset ``Δ^h`` of a √H × √H neighbourhood (heads
    beyond the square repeat its offsets). ``λ^h = sigmoid(lam_logit^h)``, initialised to 1/2. λ = 1
    gives LayerNorm; λ = 0 with a uniform ``P`` gives InstanceNorm over the tokens.

    As defined in the paper (not the reference code's extra per-head RMS pre-scaling). Prefix tokens
    (class / register tokens, not on the grid) get the LayerNorm statistics. The patch grid is taken to
    be square (``T − num_prefix_tokens`` a perfect square).
    """

    def __init__(self, dim: int, num_heads: int = 1, num_prefix_tokens: int = 0, eps: float = _LN_EPS,
                 locality_strength: float = 1.0, device=None, dtype=None) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'DTN: dim {dim} is not divisible by num_heads {num_heads}')
        dd = {'device': device, 'dtype': dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.num_prefix_tokens = num_prefix_tokens
        self.eps = eps
        self.locality_strength = locality_strength
        self.weight = nn.Parameter(torch.empty(dim, **dd))
        self.bias = nn.Parameter(torch.empty(dim, **dd))
        self.lam_logit = nn.Parameter(torch.empty(num_heads, **dd))
        self.pos_weight = nn.Parameter(torch.empty(num_heads, 3, **dd))  # a^h
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        nn.init.zeros_(self.lam_logit)
        k = max(1, int(math.isqrt(self.num_heads)))
        center = (k - 1) / 2
        with torch.no_grad():
            for h in range(self.num_heads):
                i = h % (k * k)
                dx, dy = i % k - center, i // k - center
                self.pos_weight[h] = torch.tensor([-1.0, 2 * dx, 2 * dy]) * self.locality_strength

    @staticmethod
    def relative_positions(side: int, device: Optional[torch.device] = None) -> Tensor:
        """``R`` of a ``side`` × ``side`` grid in row-major token order: (T, T, 3) = [δx² + δy², δx, δy]."""
        idx = torch.arange(side * side, device=device)
        y, x = idx // side, idx % side
        dx = (x[None, :] - x[:, None]).float()
        dy = (y[None, :] - y[:, None]).float()
        return torch.stack([dx * dx + dy * dy, dx, dy], dim=-1)

    def positional_attention(self, num_patches: int) -> Tensor:
        """``P`` of every head, (H, T, T), rows summing to 1."""
        side = int(math.isqrt(num_patches))
        if side * side != num_patches:
            raise ValueError(f'DTN needs a square patch grid, got {num_patches} patch tokens')
        rel = self.relative_positions(side, self.pos_weight.device).to(self.pos_weight.dtype)
        return torch.einsum('ijc,hc->hij', rel, self.pos_weight).softmax(dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        H, n_pre = self.num_heads, self.num_prefix_tokens
        xf = x.float()
        mean_ln = xf.mean(dim=-1, keepdim=True)                          # (B, T, 1)
        var_ln = (xf - mean_ln).pow(2).mean(dim=-1, keepdim=True)
        patches = xf[:, n_pre:].reshape(B, T - n_pre, H, C // H).transpose(1, 2)  # (B, H, N, C/H)
        pos = self.positional_attention(T - n_pre).float()              # (H, N, N)
        mean_in = torch.matmul(pos, patches)
        var_in = (torch.matmul(pos, patches * patches) - mean_in * mean_in).clamp_min(0.)
        lam = torch.sigmoid(self.lam_logit.float()).view(1, H, 1, 1)
        mean_p = mean_ln[:, n_pre:].unsqueeze(1)                          # (B, 1, N, 1)
        var_p = var_ln[:, n_pre:].unsqueeze(1)
        mean = (lam * mean_p + (1 - lam) * mean_in).transpose(1, 2).reshape(B, T - n_pre, C)
        var = (lam * var_p + (1 - lam) * var_in).transpose(1, 2).reshape(B, T - n_pre, C)
        mean = torch.cat([mean_ln[:, :n_pre].expand(-1, -1, C), mean], dim=1)
        var = torch.cat([var_ln[:, :n_pre].expand(-1, -1, C), var], dim=1)
        y = (xf - mean) * torch.rsqrt(var + self.eps)
        return (y * self.weight.float() + self.bias.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f'{self.dim}, num_heads={self.num_heads}, num_prefix_tokens={self.num_prefix_tokens}, eps={self.eps}'


# ---------------------------------------------------------------------------------------------------
# Block

def posemb_sincos_2d(h: int, w: int, width: int, temperature: float = 10_000.) -> Tensor:
    """big_vision's fixed 2-D sin-cos position embedding, shape (1, h*w, width), row-major grid.

    Features are [sin(x ω), cos(x ω), sin(y ω), cos(y ω)] with ω_k = temperature^(-k / (width/4 - 1)).
    """
    if width % 4:
        raise ValueError(f'sincos2d position embeddings need a width divisible by 4, got {width}')
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing='ij')
    omega = 1.0 / temperature ** (torch.arange(width // 4, dtype=torch.float64) / (width // 4 - 1))
    x = x.flatten()[:, None] * omega[None]
    y = y.flatten()[:, None] * omega[None]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)[None].float()


def subln_init_gain(depth: int) -> float:
    """Magneto's Sub-LN init gain for an encoder-only stack of ``depth`` layers: ``sqrt(log(2N))``.

    Wang et al. 2022, "Foundation Transformers"; applied by :meth:`VisionTransformerDPN.init_weights`
    to the value projection, the attention output projection and both MLP layers (weights only).
    """
    return math.sqrt(math.log(2 * depth))


class Block(nn.Module):
    """Transformer block with a selectable LayerNorm placement (paper Sec. 4.1, Fig. 1).

    ``placement`` is ``"<sa>-<mlp>"``, each of ``pre`` ``x + f(LN(x))`` (standard ViT), ``post``
    ``LN(x + f(x))`` or ``prepost`` ``LN(x + f(LN(x)))``; or ``normformer`` (pre-LN plus a LN on the
    attention output after its projection, ``attn_out_norm``, and one after the MLP activation,
    ``mlp.norm``; NormFormer's head and residual scaling are not included); or ``subln`` (pre-LN plus a
    LN before the attention output projection, ``attn.norm``, and after the MLP activation,
    ``mlp.norm``; its init gain is :func:`subln_init_gain`, applied by the model's init).

    Norm modules: ``norm1`` / ``norm2`` before attention / MLP, ``norm1_post`` / ``norm2_post`` after
    the residual sums; absent ones are ``nn.Identity``. They are ``residual_norm_layer`` (default
    ``norm_layer``; :class:`DynamicTokenNorm` for ``block_norm='dtn'``); the norms inside attention and
    MLP (NormFormer, Sub-LN) stay ``norm_layer``. Attention and MLP are timm's; no LayerScale.
    """

    def __init__(
            self,
            dim: int,
            num_heads: int,
            mlp_ratio: float = 4.,
            qkv_bias: bool = True,
            qk_norm: bool = False,
            scale_attn_norm: bool = False,
            scale_mlp_norm: bool = False,
            proj_bias: bool = True,
            proj_drop: float = 0.,
            attn_drop: float = 0.,
            init_values: Optional[float] = None,
            drop_path: float = 0.,
            act_layer: Type[nn.Module] = nn.GELU,
            norm_layer: Type[nn.Module] = LayerNorm,
            mlp_layer: Type[nn.Module] = Mlp,
            attn_layer: Union[str, Type[nn.Module]] = Attention,
            depth: int = 0,
            placement: str = 'pre-pre',
            residual_norm_layer: Optional[Type[nn.Module]] = None,
            device=None,
            dtype=None,
    ) -> None:
        super().__init__()
        dd = {'device': device, 'dtype': dtype}
        _check_choice('placement', placement, PLACEMENTS)
        if init_values:
            raise ValueError('LayerScale (init_values) is not supported by this Block')
        if scale_attn_norm or scale_mlp_norm:
            raise ValueError('use placement="subln" instead of scale_attn_norm / scale_mlp_norm')
        self.placement = placement
        sa, mlp = placement.split('-') if '-' in placement else ('pre', 'pre')
        attn_layer = Attention if attn_layer in (None, '', 'attn') else attn_layer

        residual_norm_layer = residual_norm_layer or norm_layer

        def norm_if(flag: bool, layer: Type[nn.Module] = residual_norm_layer) -> nn.Module:
            return layer(dim, **dd) if flag else nn.Identity()

        self.norm1 = norm_if(sa in ('pre', 'prepost'))
        self.attn = attn_layer(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            scale_norm=placement == 'subln',
            proj_bias=proj_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            norm_layer=norm_layer,
            **dd,
        )
        self.attn_out_norm = norm_if(placement == 'normformer', norm_layer)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm1_post = norm_if(sa in ('post', 'prepost'))

        self.norm2 = norm_if(mlp in ('pre', 'prepost'))
        self.mlp = mlp_layer(
            in_features=dim,
            hidden_features=int(dim * mlp_ratio),
            act_layer=act_layer,
            norm_layer=norm_layer if placement in ('normformer', 'subln') else None,
            bias=proj_bias,
            drop=proj_drop,
            **dd,
        )
        self.drop_path2 = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2_post = norm_if(mlp in ('post', 'prepost'))

    def forward(self, x: Tensor, attn_mask: Optional[Tensor] = None, is_causal: bool = False) -> Tensor:
        y = self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)
        x = self.norm1_post(x + self.drop_path1(self.attn_out_norm(y)))
        x = self.norm2_post(x + self.drop_path2(self.mlp(self.norm2(x))))
        return x


# ---------------------------------------------------------------------------------------------------
# Model

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
        _check_choice('stem', stem, STEMS)
        _check_choice('placement', placement, PLACEMENTS)
        _check_choice('block norm', block_norm, BLOCK_NORMS)
        _check_choice('pool', pool, POOLS)
        _check_choice('posemb', posemb, POSEMBS)
        _check_choice('weight_init', weight_init, ('', 'jax', 'skip'))
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
        _check_choice('weight init mode', mode or self.weight_init_mode, ('jax',))
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
    _check_choice('stem', stem, STEMS)
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


def _create_vit_dpn(variant: str, pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
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
    model_args = dict(_arch_args('Mu/4'), stem='dpn')
    return _create_vit_dpn('vit_mu_patch4_dpn', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_mu_patch4_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-Mu/4, Linear patch stem."""
    model_args = dict(_arch_args('Mu/4'), stem='linear')
    return _create_vit_dpn('vit_mu_patch4_linear', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_mu_patch4_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-Mu/4, Conv2d patch stem."""
    model_args = dict(_arch_args('Mu/4'), stem='conv')
    return _create_vit_dpn('vit_mu_patch4_conv', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_tiny_patch16_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-Ti/16, Dual PatchNorm stem (LN, Dense, LN)."""
    model_args = dict(_arch_args('Ti/16'), stem='dpn')
    return _create_vit_dpn('vit_tiny_patch16_dpn', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_tiny_patch16_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-Ti/16, Linear patch stem."""
    model_args = dict(_arch_args('Ti/16'), stem='linear')
    return _create_vit_dpn('vit_tiny_patch16_linear', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_tiny_patch16_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-Ti/16, Conv2d patch stem."""
    model_args = dict(_arch_args('Ti/16'), stem='conv')
    return _create_vit_dpn('vit_tiny_patch16_conv', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_small_patch16_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/16, Dual PatchNorm stem (LN, Dense, LN)."""
    model_args = dict(_arch_args('S/16'), stem='dpn')
    return _create_vit_dpn('vit_small_patch16_dpn', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_small_patch16_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/16, Linear patch stem."""
    model_args = dict(_arch_args('S/16'), stem='linear')
    return _create_vit_dpn('vit_small_patch16_linear', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_small_patch16_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/16, Conv2d patch stem."""
    model_args = dict(_arch_args('S/16'), stem='conv')
    return _create_vit_dpn('vit_small_patch16_conv', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_small_patch32_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/32, Dual PatchNorm stem (LN, Dense, LN)."""
    model_args = dict(_arch_args('S/32'), stem='dpn')
    return _create_vit_dpn('vit_small_patch32_dpn', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_small_patch32_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/32, Linear patch stem."""
    model_args = dict(_arch_args('S/32'), stem='linear')
    return _create_vit_dpn('vit_small_patch32_linear', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_small_patch32_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-S/32, Conv2d patch stem."""
    model_args = dict(_arch_args('S/32'), stem='conv')
    return _create_vit_dpn('vit_small_patch32_conv', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_base_patch16_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/16, Dual PatchNorm stem (LN, Dense, LN)."""
    model_args = dict(_arch_args('B/16'), stem='dpn')
    return _create_vit_dpn('vit_base_patch16_dpn', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_base_patch16_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/16, Linear patch stem."""
    model_args = dict(_arch_args('B/16'), stem='linear')
    return _create_vit_dpn('vit_base_patch16_linear', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_base_patch16_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/16, Conv2d patch stem."""
    model_args = dict(_arch_args('B/16'), stem='conv')
    return _create_vit_dpn('vit_base_patch16_conv', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_base_patch32_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/32, Dual PatchNorm stem (LN, Dense, LN)."""
    model_args = dict(_arch_args('B/32'), stem='dpn')
    return _create_vit_dpn('vit_base_patch32_dpn', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_base_patch32_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/32, Linear patch stem."""
    model_args = dict(_arch_args('B/32'), stem='linear')
    return _create_vit_dpn('vit_base_patch32_linear', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_base_patch32_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-B/32, Conv2d patch stem."""
    model_args = dict(_arch_args('B/32'), stem='conv')
    return _create_vit_dpn('vit_base_patch32_conv', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_large_patch16_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-L/16, Dual PatchNorm stem (LN, Dense, LN)."""
    model_args = dict(_arch_args('L/16'), stem='dpn')
    return _create_vit_dpn('vit_large_patch16_dpn', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_large_patch16_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-L/16, Linear patch stem."""
    model_args = dict(_arch_args('L/16'), stem='linear')
    return _create_vit_dpn('vit_large_patch16_linear', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_large_patch16_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-L/16, Conv2d patch stem."""
    model_args = dict(_arch_args('L/16'), stem='conv')
    return _create_vit_dpn('vit_large_patch16_conv', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_huge_patch14_dpn(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-H/14, Dual PatchNorm stem (LN, Dense, LN)."""
    model_args = dict(_arch_args('H/14'), stem='dpn')
    return _create_vit_dpn('vit_huge_patch14_dpn', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_huge_patch14_linear(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-H/14, Linear patch stem."""
    model_args = dict(_arch_args('H/14'), stem='linear')
    return _create_vit_dpn('vit_huge_patch14_linear', pretrained=pretrained, **dict(model_args, **kwargs))

@register_model
def vit_huge_patch14_conv(pretrained: bool = False, **kwargs) -> VisionTransformerDPN:
    """ViT-H/14, Conv2d patch stem."""
    model_args = dict(_arch_args('H/14'), stem='conv')
    return _create_vit_dpn('vit_huge_patch14_conv', pretrained=pretrained, **dict(model_args, **kwargs))
