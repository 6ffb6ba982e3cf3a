"""The sweeps behind the tables: their one definition (:data:`SWEEPS`), the schema of a sweep's
params section and the resolution of one run's recipe (:func:`sweep_config`). Adding a sweep is one
:data:`SWEEPS` entry plus its params section: the schema (:mod:`dpnrepro.config.params`) and dvc.yaml
(:mod:`dpnrepro.pipeline`) follow this mapping."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal, NamedTuple

from pydantic import Field, create_model, field_validator, model_validator

from dpnrepro.config.core import (DataParams, InputParams, ModelParams, TrainParams, RepSize, _merge, _Section,
                                  parse_arch_checked)
from dpnrepro.config.runtime import RuntimeParams
from dpnrepro.errors import ParamsError

if TYPE_CHECKING:
    from dpnrepro.config.params import Params


class FewshotParams(_Section):
    """big_vision's fewshot_lsr evaluator: closed-form ridge on pre-logits, shots per class × draws."""

    shots: int = Field(25, gt=0)
    draws: int = Field(3, gt=0, description="independent random draws of the shots (the paper's 3 seeds)")
    l2_reg: float = Field(2.0**10, gt=0)
    train_split: str = "train"
    test_split: str = "val"
    resize: int = Field(256, gt=0, description="resize to resize x resize (aspect not kept), then central crop "
                                               "to input.image_size (big_vision: 256 -> 224)")
    pool_size: int = Field(0, ge=0, description="train examples (a fixed seeded subset) the shots are drawn "
                                                "from; 0 = all (big_vision's ImageNet pool: 65000)")


class EvaluatorDef(NamedTuple):
    """An evaluator of the sweeps: the module that holds its ``Evaluator`` (a
    :class:`dpnrepro.evaluation.base.RunEvaluator`; loaded by name, as big_vision loads its evaluators, so
    this package imports no torch) and the schema of its settings, which a sweep it evaluates must then
    give under the evaluator's name (``<sweep>.<name>``) and no other sweep may."""

    module: str
    params: type[_Section] | None = None
    label: str = ""  # how the params checks name it ("few-shot")


# The evaluators, by the name a SweepDef's `evaluate` gives. Adding one: its module under evaluation/,
# one line here, and its params schema (when it takes settings).
EVALUATORS: dict[str, EvaluatorDef] = {
    "top1": EvaluatorDef("dpnrepro.evaluation.classification"),    # top-1 on minival and val
    "fewshot": EvaluatorDef("dpnrepro.evaluation.fewshot", FewshotParams, "few-shot"),  # 25-shot linear probe on `data`
}


class SweepDef(NamedTuple):
    """What a sweep is, whatever the profile: the table (or figure, e.g. ``"figure1"``) it fills, the dataset section it trains on, the
    sweep whose runs initialise it (fine-tuning) and how it is evaluated (an :data:`EVALUATORS` name: top-1
    on minival/val, or few-shot on `data`, whose settings are then the sweep's required ``fewshot`` params).
    dvc.yaml is generated from this table (``python -m dpnrepro.pipeline``), so adding a table block is one
    entry here plus its params."""

    table: int | str
    dataset: Literal["data", "data_i21k", "data_jft"] = "data"
    init_from: str | None = None
    evaluate: Literal[tuple(EVALUATORS)] = "top1"
    variants: bool = False  # runs per named model variant (the sweep's `variants` params; Figure 1)

    @property
    def report(self) -> str:
        """The report the sweep feeds: ``table<N>`` or the figure's name; its stages are
        ``evaluate-<report>`` and ``<report>``."""
        return f"table{self.table}" if isinstance(self.table, int) else self.table


# The sweeps behind the tables, in dvc.yaml order. table1 is Table 1's "ViT AugReg" block. Few-shot
# sweeps (i21k_*, jft_*) are evaluated on `data` whatever they train on.
SWEEPS: dict[str, SweepDef] = {
    "table1": SweepDef(1),                                            # Table 1 left: ViT AugReg
    "splus": SweepDef(1),                                             # S/16+
    "deit": SweepDef(1),                                              # DeiT
    "ft384": SweepDef(1, init_from="table1"),                         # AugReg + 384 fine-tune
    "i21k_93k": SweepDef(1, dataset="data_i21k", evaluate="fewshot"),  # Table 1 right: 21k, 25-shot
    "i21k_930k": SweepDef(1, dataset="data_i21k", evaluate="fewshot"),
    "jft_220k": SweepDef(2, dataset="data_jft", evaluate="fewshot"),   # Table 2 left: JFT-style, 25-shot
    "jft_1100k": SweepDef(2, dataset="data_jft", evaluate="fewshot"),
    "jft_220k_ft224": SweepDef(2, init_from="jft_220k"),              # Table 2 right: fine-tunes
    "jft_220k_ft384": SweepDef(2, init_from="jft_220k"),
    "jft_1100k_ft224": SweepDef(2, init_from="jft_1100k"),
    "jft_1100k_ft384": SweepDef(2, init_from="jft_1100k"),
    "table6": SweepDef(6),                                            # Table 6: stem ablations vs DPN
    "figure1": SweepDef("figure1", variants=True),                                  # Fig. 1: in-block LN placements (+ DTN)
}


def reports() -> list[str]:
    """The reports the sweeps feed, in SWEEPS order (one evaluate stage each)."""
    return list(dict.fromkeys(d.report for d in SWEEPS.values()))


class ArchOverride(_Section):
    """Per-architecture recipe differences (appendix C: RandAugment/mixup per model, dropout and
    stochastic depth for B models only, no representation layer for S/32)."""

    dropout: float | None = Field(None, ge=0, lt=1)
    stoch_depth: float | None = Field(None, ge=0, lt=1)
    rep_size: RepSize | None = None
    randaug: str | None = None
    mixup: float | None = Field(None, ge=0)


class RecipeParams(_Section):
    """How a sweep's runs are trained: the top-level ``input``/``model``/``train`` sections with these
    deltas, then the per-arch ``overrides``. The dataset and the sweep a fine-tune starts from (same
    arch/stem/seed; position embeddings resized, head re-initialised) are the sweep's :data:`SWEEPS` entry.
    """

    input: dict = Field(default_factory=dict, description="deltas to the top-level input section")
    model: dict = Field(default_factory=dict, description="deltas to the top-level model section")
    train: dict = Field(default_factory=dict, description="deltas to the top-level train section")
    overrides: dict[str, ArchOverride] = Field(default_factory=dict, description="per-arch deltas")


def _refuse_unknown(names, known, message: str) -> None:
    """ValueError ``message`` (its ``{}`` the sorted list of them) when ``names`` holds any not in ``known``."""
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(message.format(unknown))


class _SweepParams(_Section):
    """One block of a table: arch × stem × seed, trained with one recipe, evaluated one way."""

    archs: list[str] = Field(min_length=1)
    stems: list[str] = Field(min_length=1)
    seeds: list[int] = Field(min_length=1)
    recipe: RecipeParams
    variants: dict[str, dict] = Field(default_factory=dict, description=(
        "named model variants, each a delta to the model section (e.g. {post-pre: {placement: post-pre}}): "
        "every arch x stem x seed is trained once per variant (Figure 1); empty = one unnamed variant"))
    runtime: dict = Field(default_factory=dict, description=(
        "deltas to the top-level runtime section for this sweep (execution only; not tracked by DVC)"))

    @model_validator(mode="after")
    def _overrides_name_archs(self):
        _refuse_unknown(self.recipe.overrides, self.archs, "recipe.overrides for archs not in the sweep: {}")
        return self

    @field_validator("variants")
    @classmethod
    def _variants_are_model_deltas(cls, variants):
        for name, delta in variants.items():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+-]*", name):
                raise ValueError(f"variant name {name!r}: letters, digits, '.', '+', '-' only (it names run directories)")
            _refuse_unknown(delta, ModelParams.model_fields, f"variant {name!r} sets {{}}, which are not model keys")
        return variants

    @field_validator("archs")
    @classmethod
    def _dvc_safe(cls, archs):
        return [parse_arch_checked(a, "DVC stage names cannot hold '/'") for a in archs]

    @field_validator("stems")
    @classmethod
    def _known_stems(cls, stems):
        from dpnrepro.model_spec import STEMS

        unknown = [s for s in stems if s not in STEMS]
        if unknown:
            raise ValueError(f"unknown stem(s) {unknown}; choose from {', '.join(STEMS)}")
        return stems


# The sweep schema: one optional section per evaluator that takes settings (`<sweep>.fewshot`), after the rest
SweepParams = create_model(
    "SweepParams", __base__=_SweepParams, __doc__=_SweepParams.__doc__,
    **{name: (ev.params | None, Field(None, description=f"the {ev.label or name} evaluator (sweeps it evaluates)"))
       for name, ev in EVALUATORS.items() if ev.params is not None})


class SweepConfig(NamedTuple):
    """The resolved recipe of one arch of a sweep."""

    data: DataParams
    input: InputParams
    model: ModelParams
    train: TrainParams
    runtime: RuntimeParams

    def recipe(self) -> dict:
        """The fully resolved recipe: everything that decides what a run computes (not runtime)."""
        return {"data": self.data.model_dump(), "input": self.input.model_dump(),
                "model": self.model.model_dump(), "train": self.train.model_dump()}


def get_sweep(params: Params, sweep: str) -> SweepParams:
    sw = params.sweeps().get(sweep)
    if sw is None:
        defined = ", ".join(params.sweeps())
        raise ParamsError(f"sweep {sweep!r} is not defined in params.yaml (defined: {defined})")
    return sw


def sweep_config(params: Params, sweep: str, arch: str, variant: str = "") -> SweepConfig:
    """Top-level sections + the sweep's deltas + the arch's overrides + the variant's model delta (validated)."""
    sw = get_sweep(params, sweep)
    if variant and variant not in sw.variants:
        raise ParamsError(f"sweep {sweep!r} has no variant {variant!r} (defined: {', '.join(sw.variants) or 'none'})")
    rc = sw.recipe
    inp = _merge(params.input, rc.input, InputParams)
    model = _merge(params.model, rc.model, ModelParams)
    train = _merge(params.train, rc.train, TrainParams)
    ov = rc.overrides.get(arch)
    if ov is not None:
        set_keys = {k: v for k, v in ov.model_dump().items() if v is not None}
        model = _merge(model, {k: v for k, v in set_keys.items() if k in ModelParams.model_fields}, ModelParams)
        inp = _merge(inp, {k: v for k, v in set_keys.items() if k in InputParams.model_fields}, InputParams)
    if variant:
        model = _merge(model, sw.variants[variant], ModelParams)
    data = getattr(params, SWEEPS[sweep].dataset)
    runtime = _merge(params.runtime, get_sweep(params, sweep).runtime, RuntimeParams)
    return SweepConfig(data, inp, model, train, runtime)
