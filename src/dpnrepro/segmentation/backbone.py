"""Our ViT family (:mod:`dpnrepro.models`, any stem of ``STEMS``) as an mmsegmentation backbone.

The encoder is built by :func:`dpnrepro.models.build_vit` (``timm.create_model``) without head or
pre-logits layer, and its feature maps come from timm's ``forward_intermediates``: the patch tokens of
the chosen blocks as ``(B, width, H/p, W/p)`` maps, the class token dropped, which is what a decode
head (``FCNHead`` for the paper's linear decoder) expects. ``dynamic_img_size`` lets sliding-window
windows at an image border (smaller than the crop) through, with the position embeddings resampled on
the fly as timm does; training crops use the native grid.
"""

from __future__ import annotations

from typing import Sequence

import torch
from mmengine.model import BaseModule
from mmseg.registry import MODELS

from dpnrepro.models import build_vit


@MODELS.register_module()
class DPNVisionTransformer(BaseModule):
    """mmseg backbone: ``arch`` (``"B/16"`` or ``"B-16"``), ``stem`` (``dpn``, ``conv``, any Table 6 stem).

    Args:
        img_size: the training crop (appendix G: 512, so B/16 has a 32 x 32 position-embedding grid).
        out_indices: blocks whose outputs are returned (negative = from the end; appendix G: the last).
        final_norm: apply the encoder's final LayerNorm to the returned maps (appendix G
            ``out_with_norm = False``).
        pretrained: a pretraining run directory (``runs/<sweep>/<run>``) or its ``model.safetensors``;
            loaded by :meth:`init_weights` through :func:`dpnrepro.segmentation.convert.backbone_state_from_run`.
        drop_path_rate, placement, pool, posemb, in_channels: as :class:`dpnrepro.models.VisionTransformerDPN`.
    """

    def __init__(self, arch: str = "B/16", stem: str = "dpn", img_size: int | Sequence[int] = 512,
                 in_channels: int = 3, placement: str = "pre-pre", pool: str = "tok", posemb: str = "learn",
                 drop_path_rate: float = 0.0, out_indices: Sequence[int] | int = (-1,), final_norm: bool = False,
                 pretrained: str | None = None, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        self.arch = arch.replace("-", "/")
        self.vit = build_vit(self.arch, stem=stem, img_size=img_size, in_chans=in_channels, placement=placement,
                             pool=pool, posemb=posemb, drop_path_rate=drop_path_rate, num_classes=0,
                             rep_size=False, dynamic_img_size=True)
        depth = len(self.vit.blocks)
        indices = [out_indices] if isinstance(out_indices, int) else list(out_indices)
        self.out_indices = tuple(i % depth for i in indices)
        self.final_norm = final_norm
        self.pretrained = pretrained

    @property
    def grid_size(self) -> tuple[int, int]:
        return tuple(self.vit.patch_embed.grid_size)

    def init_weights(self) -> None:
        super().init_weights()
        if self.pretrained:
            from dpnrepro.segmentation.convert import backbone_state_from_run

            self.load_state_dict(backbone_state_from_run(self.pretrained, self))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        maps = self.vit.forward_intermediates(x, indices=list(self.out_indices), norm=self.final_norm,
                                              output_fmt="NCHW", intermediates_only=True)
        return tuple(maps)
