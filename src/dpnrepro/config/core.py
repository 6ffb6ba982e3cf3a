"""The core sections of ``params.yaml``: the datasets, the input pipeline, the model and the training
recipe every sweep starts from, and the helpers the other config modules share."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

PROFILES = ("smoke", "mini", "full")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # `lr: .inf` is no number


def _rep_size(value: bool | int) -> bool | int:
    if not isinstance(value, bool) and value < 0:
        raise ValueError(f"rep_size is true (the model's width), false or 0 (no pre-logits layer) or a positive "
                         f"width; got {value}")
    return value


RepSize = Annotated[bool | int, AfterValidator(_rep_size)]


class DataParams(_Section):
    """Which dataset, where it lives, and the train[:99%] / train[99%:] / validation protocol."""

    name: str
    format: Literal["idx", "imagefolder", "disk", "hub"]
    source: str
    train_split: str = "train"
    eval_split: str | None = Field("validation", description=(
        "the official held-out split (`val`); null = none (pretraining data, evaluated few-shot on `data`)"))
    minival_fraction: float = Field(0.01, gt=0, lt=1)
    train_examples: int = Field(0, ge=0, description="0 = all")
    minival_examples: int = Field(0, ge=0, description="0 = all")
    val_examples: int = Field(0, ge=0, description="0 = all")
    num_classes: int = Field(gt=1)
    multi_label: bool = Field(False, description=(
        "train on label sets (JFT-style, sigmoid loss): the source's `labels` column (lists of class ids), "
        "or its `label` plus `label_parents`"))
    label_parents: list[int] | None = Field(None, description=(
        "a class hierarchy: the parent class id of each source class, added as a second label "
        "(parents count in num_classes); needs multi_label"))
    skip_corrupt: bool = False
    pixel_store_side: int = Field(0, ge=0, description=(
        "0 = off; N > 0: prepare also decodes the train images once into a uint8 store, shorter side "
        "at most N px, which `input.backend: fast` trains from (data/pixel_store.py)"))
    storage: Literal["copy", "source"] = Field("copy", description=(
        "copy: the prepared splits hold the images (Arrow); source (imagefolder only, for ImageNet-scale "
        "folders): an index of relative path, label and sha256 per file, images read from data.source at "
        "training time (data/source_index.py)"))
    seed: int = 0

    @model_validator(mode="after")
    def _storage_fits(self):
        if self.storage == "source" and self.format != "imagefolder":
            raise ValueError(f"storage: source indexes an image folder; format is {self.format!r} (use copy)")
        if self.storage == "source" and self.pixel_store_side:
            raise ValueError("storage: source keeps no decoded copy; set pixel_store_side: 0 or storage: copy")
        return self

    @model_validator(mode="after")
    def _labels_consistent(self):
        if self.label_parents is not None:
            if not self.multi_label:
                raise ValueError("label_parents needs multi_label: true")
            bad = [p for p in self.label_parents if not len(self.label_parents) <= p < self.num_classes]
            if bad:
                raise ValueError(f"label_parents must be ids in [{len(self.label_parents)}, {self.num_classes}) "
                                 f"(after the {len(self.label_parents)} source classes), got {bad}")
        return self


class ExportParams(_Section):
    """The smoke profile's image folder: an idx dataset (Debian's Fashion-MNIST) written out as
    ``data/raw/imagefolder/{train,test}/<NN_class>/*.png`` by the `export_imagefolder` stage."""

    source: str
    train_per_class: int = Field(0, ge=0, description="first N images of each class; 0 = all")
    test_per_class: int = Field(0, ge=0, description="first N images of each class; 0 = all")


class InputParams(_Section):
    """Preprocessing (appendix C): inception crop + flip + RandAugment for train, resize + crop for eval."""

    image_size: int = Field(gt=0)
    channels: Literal[1, 3] = 3
    eval_resize: int = Field(gt=0)
    inception_crop: bool = True
    crop_min_area: float = Field(0.05, gt=0, le=1, description="inception crop's smallest area fraction (big_vision 0.05; DeiT 0.08)")
    crop_sampler: Literal["torchvision", "big_vision"] = Field("torchvision", description=(
        "inception crop box + resize: 'big_vision' = TF's sample_distorted_bounding_box (aspect 0.75-1.33 "
        "uniform, 100 attempts, else the whole image) + bilinear without antialias (data/crop.py); "
        "'torchvision' = RandomResizedCrop (log-uniform aspect 3/4-4/3, 10 attempts) + antialiased bilinear"))
    squash: bool = Field(False, description=(
        "without inception crop (train) and at evaluation, resize the whole frame to image_size x image_size, "
        "aspect not kept: task_adaptation's and big_vision's transfer `resize(S)` (VTAB); false: "
        "resize_small | central_crop (big_vision's ImageNet evaluation: eval_resize, then image_size)"))
    flip: bool = True
    randaug: str = Field("", description=(
        "'rand-n2-m15-tbigvision' = big_vision randaug(2, 15) (AugReg); any other timm RandAugment spec "
        "(e.g. DeiT's 'rand-m9-mstd0.5-inc1'); '' = off"))
    mixup: float = Field(0.0, ge=0, description="mixup Beta(p, p) parameter; 0 = off")
    cutmix: float = Field(0.0, ge=0, description="CutMix Beta(a, a) parameter (DeiT); 0 = off")
    mix_switch_prob: float = Field(0.5, ge=0, le=1, description="with mixup and cutmix both on: P(cutmix) per batch")
    random_erasing: float = Field(0.0, ge=0, le=1, description="random-erasing probability (DeiT); 0 = off")
    repeated_aug: int = Field(1, ge=1, description="repeated augmentation: copies of each image per batch (DeiT: 3)")
    backend: Literal["pil", "fast"] = Field("pil", description="train-time augmentation pipeline (data/loader.py)")

    @model_validator(mode="after")
    def _crop_fits(self):
        if self.eval_resize < self.image_size:
            raise ValueError(f"eval_resize ({self.eval_resize}) must be >= image_size ({self.image_size})")
        if self.squash and self.eval_resize != self.image_size:
            raise ValueError(f"squash resizes the whole frame to image_size ({self.image_size}); set eval_resize to "
                             f"it too (got {self.eval_resize}: there is no crop for a larger resize to feed)")
        return self


class ModelParams(_Section):
    """Architecture choices shared by every run (arch and stem come from the sweep)."""

    pool: Literal["tok", "gap"] = "tok"
    posemb: Literal["learn", "sincos2d"] = "learn"
    rep_size: RepSize = True
    placement: str = "pre-pre"
    block_norm: Literal["ln", "dtn"] = Field("ln", description=(
        "the blocks' residual-stream normalizer: ln (LayerNorm) or dtn (Dynamic Token Normalization)"))

    @field_validator("placement")
    @classmethod
    def _known_placement(cls, placement):
        from dpnrepro.model_spec import PLACEMENTS

        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; choose one of {', '.join(PLACEMENTS)}")
        return placement
    head_bias_init: float | Literal["prior"] = Field(0.0, description=(
        "the head's initial bias; `prior` = logit(1/K) for the model's K classes (AugReg's -6.9 for 1000), "
        "so a recipe shared by tasks of different K starts every head at its class prior"))
    dropout: float = Field(0.0, ge=0, lt=1)
    stoch_depth: float = Field(0.0, ge=0, lt=1)

    def head_bias(self, num_classes: int) -> float:
        """The initial head bias of a ``num_classes``-way head (``head_bias_init`` resolved)."""
        if self.head_bias_init != "prior":
            return self.head_bias_init
        return -math.log(num_classes - 1)  # logit(1/K) = log(1/K / (1 - 1/K))


class TrainParams(_Section):
    """Optimisation (appendix C for the AugReg values)."""

    loss: Literal["sigmoid_xent", "softmax_xent"] = "sigmoid_xent"
    optimizer: Literal["adam", "adamw", "sgd_momentum"] = "adam"
    lr: float = Field(gt=0)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(gt=0)
    steps: int = Field(gt=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    grad_clip: float = Field(0.0, ge=0, description="global-norm clip; 0 = off")
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="cpu and cuda give different bits")
    deterministic: bool = Field(True, description="deterministic kernels (determinism/cuda.py)")

    @model_validator(mode="after")
    def _consistent(self):
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) exceeds steps ({self.steps})")
        return self


def train_fields(*keys: str, **overrides) -> dict:
    """:class:`TrainParams`' definitions ``(type, Field)`` of ``keys``, in that order, ``overrides`` in place of
    some: for ``pydantic.create_model``, so that a section training another model (LiT's text tower,
    config/lit.py) has the train section's keys, defaults and checks, written once."""
    fields = TrainParams.model_fields
    return {k: overrides[k] if k in overrides else (fields[k].annotation, fields[k]) for k in keys}


def _describe(exc: ValidationError, section: str = "") -> str:
    """Every error of ``exc`` as ``key.path: message`` (under ``section``, when given), joined on one line."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in ((section,) if section else ()) + tuple(err["loc"])) or "(top level)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def _merge(section: _Section, delta: dict, cls: type[_Section]) -> _Section:
    return cls.model_validate({**section.model_dump(), **delta}) if delta else section


def arch_name(arch: str) -> str:
    """Params spell archs DVC-safe ('B-16'); the paper and the model registry use 'B/16'."""
    return arch.replace("-", "/")


def check_patch_grid(arch: str, image_size: int) -> None:
    """A ViT cuts its input into whole patches: ``input.image_size`` must be a multiple of the patch size
    (ValueError naming the key otherwise)."""
    from dpnrepro.model_spec import parse_arch

    patch = parse_arch(arch_name(arch))[1]
    if image_size % patch:
        raise ValueError(f"input.image_size {image_size} is not a multiple of the patch size {patch} of {arch}; "
                         f"use e.g. {max(patch, image_size // patch * patch)}")


def parse_arch_checked(arch: str, why: str = "") -> str:
    """``arch`` when it names a registered size, spelt DVC-safe ('B-16'); else ValueError (with ``why``
    '/' is refused, when given)."""
    from dpnrepro.model_spec import parse_arch

    if "/" in arch:
        raise ValueError(f"write arch {arch!r} as {arch.replace('/', '-')!r}" + (f" ({why})" if why else ""))
    parse_arch(arch_name(arch))  # ValueError listing the valid sizes
    return arch
