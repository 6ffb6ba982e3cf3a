"""The segmentation sections (Table 5): the smoke canvases and the mmsegmentation sweep."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from dpnrepro.config.core import _Section
from dpnrepro.config.sweeps import SweepParams


class SegCanvasParams(_Section):
    """The smoke segmentation data (Table 5): canvases of real Fashion-MNIST items in the ADE20K layout,
    written to ``data/raw/seg_canvases`` by the `export_seg_canvases` stage (data/segmentation.py)."""

    source: str = Field(description="an idx dataset directory (Debian's Fashion-MNIST)")
    train_images: int = Field(gt=0)
    val_images: int = Field(gt=0)
    size: int = Field(gt=28, description="canvas side in pixels (items are 28 px)")
    items: tuple[int, int] = Field(description="fewest and most items per canvas")
    seed: int = 0

    @model_validator(mode="after")
    def _items(self):
        if not 1 <= self.items[0] <= self.items[1]:
            raise ValueError(f"items must be [min, max] with 1 <= min <= max, got {list(self.items)}")
        return self


class SegmentationParams(_Section):
    """Table 5: fine-tune a pretrained ViT per (stem, training fraction, seed) with an mmseg config file.

    The recipe is the config file's (``config``: an mmseg config inheriting mmseg's bundled ones;
    ``options`` overrides it as mmseg's ``--cfg-options`` do); the sweep and the data are params."""

    config: str = Field(description="mmseg config file (configs/segmentation/)")
    data_root: str = Field(description="ADE20K layout: images/{training,validation}, annotations/{...}")
    arch: str
    stems: list[str] = Field(min_length=1)
    fractions: list[str] = Field(min_length=1, description="of the train set, as the paper prints them: '1/16', '1'")
    seeds: list[int] = Field(min_length=1)
    pretrained_seed: int | None = Field(0, description=(
        "initialise from runs/table1/<arch>_<stem>_s<this seed> (the ImageNet-style pretraining); null = random init"))
    options: dict = Field(default_factory=dict, description="dotted-key overrides of the config file")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=(
        "cpu: fp32 on every machine (the GPUs hidden); cuda: bf16 AMP (AmpOptimWrapper); auto: cuda when visible"))

    @field_validator("stems")
    @classmethod
    def _known_stems(cls, stems):
        return SweepParams._known_stems(stems)

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, fractions):
        from dpnrepro.data.segmentation import parse_fraction

        for f in fractions:
            parse_fraction(f)
        return fractions

    @field_validator("arch")
    @classmethod
    def _arch(cls, arch):
        return SweepParams._dvc_safe([arch])[0]

    def check(self, params) -> None:
        """Against the rest of params.yaml (:func:`dpnrepro.config.params.parse_params`)."""
        if self.pretrained_seed is not None:
            src = params.table1
            missing = ([self.arch] if self.arch not in src.archs else []) + sorted(set(self.stems) - set(src.stems)) + \
                ([f"seed {self.pretrained_seed}"] if self.pretrained_seed not in src.seeds else [])
            if missing:
                raise ValueError(f"segmentation starts from table1 runs that table1 does not train: {missing} "
                                 "(or set segmentation.pretrained_seed: null for a random init)")

