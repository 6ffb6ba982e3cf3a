"""The typed schema of ``params.yaml``: unknown keys, wrong types and bad values are rejected up front.

Every stage calls :func:`load_params` before doing any work, so a malformed ``params.yaml`` fails in
seconds with one line naming the key, instead of hours into a run.

:class:`Params` holds the core sections (:mod:`.core`, :mod:`.runtime`) and one field per sweep of
:data:`~dpnrepro.config.sweeps.SWEEPS`. Every other section belongs to one concern (:data:`SECTIONS`) whose
module holds its schema and its checks against the rest of the file (a ``check(params)`` method). The
code that reads such a section imports that module; :func:`parse_params` loads the others by name, to
validate the whole file in every stage. A stage's code deps (:mod:`dpnrepro.codedeps`: what can change
its outputs) are thus what it imports: an edit of ``config/lit.py`` reruns the LiT stages, not Table 1.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml
from pydantic import Field, ValidationError, create_model, model_validator

from dpnrepro.config.core import (DataParams, ExportParams, InputParams, ModelParams, TrainParams, _describe, _Section,
                                  check_patch_grid)
from dpnrepro.config.runtime import RuntimeParams
from dpnrepro.config.sweeps import EVALUATORS, SWEEPS, SweepParams, sweep_config
from dpnrepro.errors import ParamsError


class Section(NamedTuple):
    """A params section of one concern: its module under ``dpnrepro.config``, its schema class, and
    whether a missing section takes the schema's defaults (else it is None)."""

    module: str
    schema: str
    default: bool = False


SECTIONS = {
    "figures": Section("figures", "FiguresParams", default=True),
    "export_seg_canvases": Section("segmentation", "SegCanvasParams"),
    "segmentation": Section("segmentation", "SegmentationParams"),   # Table 5 (ADE20K, mmsegmentation)
    "benchmark": Section("benchmarks", "BenchmarkParams", default=True),
    "transfer_data": Section("transfer", "TransferDataParams", default=True),
    "vtab": Section("transfer", "VtabParams"),                       # Table 3 (transfer/vtab.py)
    "sun397_scratch": Section("transfer", "ScratchParams"),          # Table 7 (transfer/scratch.py)
    "lit_captions": Section("lit", "LitCaptionsParams"),             # smoke: Fashion-MNIST captions from labels
    "lit": Section("lit", "LitParams"),                              # Table 4: LiT on locked pretraining runs
}


class _CoreParams(_Section):
    profile: Literal["smoke", "mini", "full"]
    export_imagefolder: ExportParams | None = None
    data: DataParams
    data_i21k: DataParams | None = Field(None, description="ImageNet-21k: the pretraining data of Table 1 right")
    data_jft: DataParams | None = Field(None, description="a large JFT-style dataset of your own: Table 2")
    input: InputParams
    model: ModelParams
    train: TrainParams
    runtime: RuntimeParams = Field(default_factory=RuntimeParams)

    @model_validator(mode="after")
    def _sweeps_resolve(self):
        if self.data.multi_label:
            raise ValueError("data.multi_label: the evaluation dataset `data` must be single-label; "
                             "put multi-label pretraining data in data_jft or data_i21k")
        for name, sw in self.sweeps().items():
            definition = SWEEPS[name]
            for evaluator, ev in EVALUATORS.items():  # an evaluator's settings: on the sweeps it evaluates only
                if ev.params is None:
                    continue
                given = getattr(sw, evaluator) is not None
                if given != (definition.evaluate == evaluator):
                    raise ValueError(f"{name}.{evaluator}: " + (
                        f"only {ev.label or evaluator} sweeps take it" if given
                        else f"required: the sweep is evaluated {ev.label or evaluator} (config.sweeps.SWEEPS)"))
            if bool(sw.variants) != definition.variants:
                raise ValueError(f"{name}.variants: " + ("required (config.sweeps.SWEEPS)" if definition.variants
                                                         else "this sweep takes none (config.sweeps.SWEEPS)"))
            if getattr(self, definition.dataset) is None:
                raise ValueError(f"{name} trains on {definition.dataset} (config.sweeps.SWEEPS) but params.yaml "
                                 f"has no {definition.dataset} section")
            if definition.init_from is not None:
                src = self.sweeps().get(definition.init_from)
                if src is None:
                    raise ValueError(f"{name} fine-tunes the runs of {definition.init_from}, which this profile "
                                     "does not define")
                missing = sorted(set(sw.archs) - set(src.archs)) + sorted(set(sw.stems) - set(src.stems)) + \
                    sorted(str(s) for s in set(sw.seeds) - set(src.seeds))
                if missing:
                    raise ValueError(f"{name} has runs its init_from sweep {definition.init_from} lacks: {missing}")
            for arch, variant in ((a, v) for a in sw.archs for v in (list(sw.variants) or [""])):
                try:
                    cfg = sweep_config(self, name, arch, variant)
                    cfg.runtime.check_batch(cfg.train.batch_size)
                    check_patch_grid(arch, cfg.input.image_size)
                except ValidationError as exc:
                    raise ValueError(f"{name} (arch {arch}): {_describe(exc)}") from None
                except ValueError as exc:
                    raise ValueError(f"{name} (arch {arch}): {exc}") from None
            if getattr(self, definition.dataset).multi_label and \
                    sweep_config(self, name, sw.archs[0]).train.loss != "sigmoid_xent":
                raise ValueError(f"{name} trains on multi-label {definition.dataset}: it needs train.loss sigmoid_xent")
        return self

    def sweeps(self) -> dict[str, SweepParams]:
        """The sweeps this profile defines, in dvc.yaml order."""
        return {name: getattr(self, name) for name in SWEEPS if getattr(self, name) is not None}


# One field per sweep of SWEEPS (table1, which every other stage builds on, required), one per concern section
Params = create_model(
    "Params", __base__=_CoreParams, __doc__="The whole of params.yaml, validated (:func:`parse_params`).",
    **{name: (SweepParams, ...) if name == "table1" else (SweepParams | None, None) for name in SWEEPS},
    **{name: (Any, None) for name in SECTIONS})


def _section(name: str, raw: dict, path: Path):
    """The validated section ``name`` of ``raw`` by its concern's schema, its defaults, or None."""
    section = SECTIONS[name]
    schema = getattr(importlib.import_module(f"dpnrepro.config.{section.module}"), section.schema)
    if raw.get(name) is None:
        return schema() if section.default else None
    try:
        return schema.model_validate(raw[name])
    except ValidationError as exc:
        raise ParamsError(f"invalid {path}: {_describe(exc, name)}") from None


def _one_line(exc: ValidationError, path: Path) -> str:
    return f"invalid {path}: {_describe(exc)}"


def parse_params(raw: dict, path: Path | str = "params.yaml") -> Params:
    """Validate every section of ``raw``: each concern's by its schema, then the core ones and the sweeps,
    then each concern's checks against the rest; ParamsError (one line) on the first bad section. Build
    :class:`Params` only through here: its concern fields (``Any``) take the validated sections."""
    path = Path(path)
    sections = {name: _section(name, raw, path) for name in SECTIONS}
    try:
        params = Params.model_validate({**raw, **sections})
    except ValidationError as exc:
        raise ParamsError(_one_line(exc, path)) from None
    for section in sections.values():
        try:
            getattr(section, "check", lambda params: None)(params)
        except ValueError as exc:
            raise ParamsError(f"invalid {path}: {exc}") from None
    return params


def _unique_key_loader() -> type:
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last; DVC refuses the
    file, so a stage must not train on it): a ``ConstructorError`` at the second occurrence."""
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class UniqueKeyLoader(base):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            problem=f"key {key!r} is given twice (first at line {seen[key] + 1}); DVC refuses such a "
                                    "file: keep one", problem_mark=key_node.start_mark)
                    seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def load_params(path: str | os.PathLike = "params.yaml") -> Params:
    """Read and validate ``params.yaml``; ParamsError (one line) on any problem."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found; run from the repository root or copy a profile from profiles/")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_unique_key_loader())
    except UnicodeDecodeError as exc:
        raise ParamsError(f"{path} is not UTF-8 text (invalid byte at offset {exc.start}); re-save it as UTF-8") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ParamsError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path} must be a mapping of sections, got {type(raw).__name__}")
    return parse_params(raw, path)