"""The transformer block of the ViT-DPN family with a selectable LayerNorm placement (paper Sec. 4.1,
Fig. 1: pre / post / prepost per sublayer, NormFormer, Sub-LN), passed to timm's ``VisionTransformer``
as ``block_fn``; with Sub-LN's init gain."""
import math
from typing import Optional, Type, Union

from torch import Tensor, nn

from timm.layers import Attention, DropPath, LayerNorm, Mlp

from dpnrepro.model_spec import PLACEMENTS, check_choice

__all__ = ['Block', 'subln_init_gain']


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
    ``norm_layer``; :class:`~dpnrepro.models.dtn.DynamicTokenNorm` for ``block_norm='dtn'``); the
    norms inside attention and MLP (NormFormer, Sub-LN) stay ``norm_layer``. Attention and MLP are
    timm's; no LayerScale.
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
        check_choice('placement', placement, PLACEMENTS)
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
