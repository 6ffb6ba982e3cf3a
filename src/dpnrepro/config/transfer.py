"""The transfer sections (Tables 3 and 7): the smoke stand-ins, VTAB-1k fine-tunes and Sun397 from
scratch; their recipes are the top-level sections plus the section's recipe deltas."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from dpnrepro.config.core import InputParams, ModelParams, TrainParams, _describe, _merge, _Section, parse_arch_checked
from dpnrepro.config.sweeps import RecipeParams

if TYPE_CHECKING:
    from dpnrepro.config.params import Params

VTAB_INIT_SWEEP = "table1"  # Table 3 fine-tunes the ImageNet (AugReg) runs of Table 1


class TaskSourceParams(_Section):
    """Where a VTAB task's local copy lives (transfer/sources.py) and, for the smoke profile's
    stand-ins, which real data it is (printed in the report)."""

    format: Literal["disk", "imagefolder", "hub"]
    source: str
    stand_in: str = Field("", description="'' = the task's own data; else what real data stands in for it")
    num_classes: int | None = Field(None, gt=1, description=(
        "a stand-in's class count when it has fewer classes than the task (MNIST's 10 for Sun397's 397): the "
        "head's size and the range its labels are checked against; None = the task's"))


class TransferDataParams(_Section):
    """Smoke only: the offline stand-ins the `transfer_data` stage builds (transfer/smoke_data.py), one
    DatasetDict per entry under ``out``/<name>; empty at mini/full (point the tasks at real copies)."""

    out: str = "data/transfer"
    fashion_mnist: str = "/usr/share/datasets/fashion-mnist"
    sources: dict[str, "SmokeSource"] = Field(default_factory=dict)


class SmokeSource(_Section):
    kind: str = Field(description="a builder of transfer/smoke_data.py (checked when the stage starts)")
    counts: dict[str, int] = Field(description="source split -> number of examples")
    seed: int = 0


TransferDataParams.model_rebuild()


class VtabParams(_Section):
    """Table 3: fine-tune the `table1` runs (VTAB_INIT_SWEEP) on each task with the VTAB-1k protocol:
    every lr × seed on train800, the lr chosen by mean val200 accuracy, test accuracy of that lr per seed."""

    init_seed: int = Field(0, description="which pretraining run (seed) of each arch/stem is fine-tuned")
    archs: list[str] = Field(min_length=1)
    stems: list[str] = Field(min_length=1)
    seeds: list[int] = Field(min_length=1)
    lrs: list[float] = Field(min_length=1)
    retrain_on_train800val200: bool = Field(False, description=(
        "after choosing the lr, retrain on train800val200 (standard VTAB-1k) instead of reporting the "
        "train800 runs; the paper does not say which it did"))
    tasks: dict[str, TaskSourceParams] = Field(min_length=1, description=(
        "VTAB task name (transfer/tasks.py, checked when the stage starts) -> its local copy"))
    recipe: RecipeParams

    @field_validator("lrs")
    @classmethod
    def _positive(cls, lrs):
        if any(lr <= 0 for lr in lrs) or len(set(lrs)) != len(lrs):
            raise ValueError(f"lrs must be distinct and positive, got {lrs}")
        return lrs

    def check(self, params) -> None:
        """Against the rest of params.yaml (:func:`dpnrepro.config.params.parse_params`)."""
        src = params.table1
        missing = [f"{a}/{st}" for a in self.archs for st in self.stems if a not in src.archs or st not in src.stems]
        if missing or self.init_seed not in src.seeds:
            raise ValueError(f"vtab fine-tunes {VTAB_INIT_SWEEP} runs it lacks: {missing or ''} "
                             f"seed {self.init_seed} (table1 seeds {src.seeds})")
        for lr in self.lrs:
            vtab_config(params, lr)



class ScratchGrid(_Section):
    lr: list[float] = Field(min_length=1)
    weight_decay: list[float] = Field(min_length=1)
    dropout: list[float] = Field(min_length=1)


class AugGrid(_Section):
    mixup: list[float] = Field(min_length=1)
    randaug_magnitude: list[int] = Field(min_length=1, description="big_vision randaug(2, m); 0 = no RandAugment")


class ScratchParams(_Section):
    """Table 7 (appendix F): train from scratch on Sun397's train split; (1) lr × weight decay × dropout,
    (2) mixup × RandAugment magnitude, (3) the chosen setting for ``longer_steps``; each chosen on val,
    reported on test."""

    data: TaskSourceParams
    archs: list[str] = Field(min_length=1)
    stems: list[str] = Field(min_length=1)
    seed: int = 0
    grid: ScratchGrid
    aug_grid: AugGrid
    longer_steps: int = Field(gt=0)
    recipe: RecipeParams

    @model_validator(mode="after")
    def _search_sets_the_augmentation(self):
        set_here = sorted({"mixup", "randaug"} & set(self.recipe.input))
        if set_here:
            raise ValueError(f"recipe.input sets {set_here}, but the search does (appendix F: none in step 1, "
                             "aug_grid's in step 2); remove them")
        return self

    def check(self, params) -> None:
        """Against the rest of params.yaml (:func:`dpnrepro.config.params.parse_params`)."""
        for arch in self.archs:
            parse_arch_checked(arch)



def transfer_config(params: Params, recipe: RecipeParams, **train_delta) -> tuple[InputParams, ModelParams, TrainParams]:
    """Top-level input/model/train + ``recipe``'s deltas (+ ``train_delta``), validated; a bad value is
    reported at its key in the recipe (``vtab.recipe.input: ...``)."""
    where = next((f"{name}.recipe" for name in ("vtab", "sun397_scratch")
                  if getattr(getattr(params, name, None), "recipe", None) is recipe), "recipe")
    merged = []
    for section, top, delta, cls in (("input", params.input, recipe.input, InputParams),
                                     ("model", params.model, recipe.model, ModelParams),
                                     ("train", params.train, {**recipe.train, **train_delta}, TrainParams)):
        try:
            merged.append(_merge(top, delta, cls))
        except ValidationError as exc:
            raise ValueError(_describe(exc, f"{where}.{section}")) from None
    return tuple(merged)


def vtab_config(params: Params, lr: float) -> tuple[InputParams, ModelParams, TrainParams]:
    return transfer_config(params, params.vtab.recipe, lr=lr)
