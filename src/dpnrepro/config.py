"""The typed schema of ``params.yaml``: unknown keys, wrong types and bad values are rejected up front.

Every stage calls :func:`load_params` before doing any work, so a malformed ``params.yaml`` fails in
seconds with one line naming the key, instead of hours into a run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dpnrepro.errors import ParamsError

PROFILES = ("smoke", "mini", "full")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataParams(_Section):
    """Which dataset, where it lives, and the train[:99%] / train[99%:] / validation protocol."""

    name: str
    format: Literal["idx", "imagefolder", "disk", "hub"]
    source: str
    train_split: str = "train"
    eval_split: str = "validation"
    minival_fraction: float = Field(0.01, gt=0, lt=1)
    train_examples: int = Field(0, ge=0, description="0 = all")
    minival_examples: int = Field(0, ge=0, description="0 = all")
    val_examples: int = Field(0, ge=0, description="0 = all")
    num_classes: int = Field(gt=1)
    skip_corrupt: bool = False
    seed: int = 0


class InputParams(_Section):
    """Preprocessing (appendix C): inception crop + flip + RandAugment for train, resize + crop for eval."""

    image_size: int = Field(gt=0)
    channels: Literal[1, 3] = 3
    eval_resize: int = Field(gt=0)
    inception_crop: bool = True
    flip: bool = True
    randaug: str = Field("", description="timm RandAugment spec, e.g. 'rand-m15-n2'; '' = off")
    mixup: float = Field(0.0, ge=0, description="mixup Beta(p, p) parameter; 0 = off")
    workers: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _crop_fits(self):
        if self.eval_resize < self.image_size:
            raise ValueError(f"eval_resize ({self.eval_resize}) must be >= image_size ({self.image_size})")
        return self


class ModelParams(_Section):
    """Architecture choices shared by every run (arch and stem come from the sweep)."""

    pool: Literal["tok", "gap"] = "tok"
    rep_size: bool | int = True
    placement: str = "pre-pre"

    @field_validator("placement")
    @classmethod
    def _known_placement(cls, placement):
        from dpnrepro.models import PLACEMENTS

        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; choose one of {', '.join(PLACEMENTS)}")
        return placement
    head_bias_init: float = 0.0
    dropout: float = Field(0.0, ge=0, lt=1)
    stoch_depth: float = Field(0.0, ge=0, lt=1)


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
    log_every: int = Field(10, gt=0)
    ckpt_every: int = Field(100, gt=0)
    eval_batch_size: int = Field(256, gt=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    deterministic: bool = True
    devices: int = Field(1, gt=0, description="number of data-parallel processes the batch is split over")

    @model_validator(mode="after")
    def _consistent(self):
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) exceeds steps ({self.steps})")
        if self.batch_size % self.devices:
            raise ValueError(f"batch_size ({self.batch_size}) is not divisible by devices ({self.devices})")
        return self


class ArchOverride(_Section):
    """Per-architecture recipe differences (appendix C: RandAugment/mixup per model, dropout and
    stochastic depth for B models only, no representation layer for S/32)."""

    dropout: float | None = Field(None, ge=0, lt=1)
    stoch_depth: float | None = Field(None, ge=0, lt=1)
    rep_size: bool | int | None = None
    randaug: str | None = None
    mixup: float | None = Field(None, ge=0)


class SweepParams(_Section):
    """The matrix a table is built from: arch × stem × seed (+ per-arch recipe overrides)."""

    archs: list[str] = Field(min_length=1)
    stems: list[str] = Field(min_length=1)
    seeds: list[int] = Field(min_length=1)
    overrides: dict[str, ArchOverride] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _overrides_name_archs(self):
        unknown = sorted(set(self.overrides) - set(self.archs))
        if unknown:
            raise ValueError(f"overrides for archs not in the sweep: {unknown}")
        return self

    @field_validator("archs")
    @classmethod
    def _dvc_safe(cls, archs):
        from dpnrepro.models import parse_arch

        for a in archs:
            if "/" in a:
                raise ValueError(f"write arch {a!r} as {a.replace('/', '-')!r} (DVC stage names cannot hold '/')")
            parse_arch(arch_name(a))  # ValueError listing the valid sizes
        return archs

    @field_validator("stems")
    @classmethod
    def _known_stems(cls, stems):
        from dpnrepro.models import STEMS

        unknown = [s for s in stems if s not in STEMS]
        if unknown:
            raise ValueError(f"unknown stem(s) {unknown}; choose from {', '.join(STEMS)}")
        return stems


class Params(_Section):
    profile: Literal["smoke", "mini", "full"]
    data: DataParams
    input: InputParams
    model: ModelParams
    train: TrainParams
    table1: SweepParams


def _one_line(exc: ValidationError, path: Path) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        parts.append(f"{loc}: {msg}")
    return f"invalid {path}: " + "; ".join(parts)


def parse_params(raw: dict, path: Path | str = "params.yaml") -> Params:
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        raise ParamsError(_one_line(exc, Path(path))) from None


def load_params(path: str | os.PathLike = "params.yaml") -> Params:
    """Read and validate ``params.yaml``; ParamsError (one line) on any problem."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found; run from the repository root or copy a profile from profiles/")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ParamsError(f"{path} is not UTF-8 text (invalid byte at offset {exc.start}); re-save it as UTF-8") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ParamsError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path} must be a mapping of sections, got {type(raw).__name__}")
    return parse_params(raw, path)


def resolve_run(params: Params, sweep: str, arch: str) -> tuple[ModelParams, InputParams]:
    """The model and input sections of one arch of ``sweep``, with its overrides applied."""
    ov = getattr(params, sweep).overrides.get(arch)
    if ov is None:
        return params.model, params.input
    model_keys = {k: v for k, v in ov.model_dump().items() if v is not None and k in ModelParams.model_fields}
    input_keys = {k: v for k, v in ov.model_dump().items() if v is not None and k in InputParams.model_fields}
    return params.model.model_copy(update=model_keys), params.input.model_copy(update=input_keys)


def arch_name(arch: str) -> str:
    """Params spell archs DVC-safe ('B-16'); the paper and the model registry use 'B/16'."""
    return arch.replace("-", "/")
