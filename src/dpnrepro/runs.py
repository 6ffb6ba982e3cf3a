"""The runs of a sweep: one iterator (arch × variant × stem × seed), each run's settings resolved once.

Training (``training/run.py``), evaluation (``stages/evaluate.py``) and the generated plots of
``dvc.yaml`` (``pipeline.curve_plots``) walk a sweep through :func:`sweep_runs`, so they name the same
runs in the same order. :func:`resolve_runs` resolves each run's recipe (``config.sweep_config``) once;
the resolved object is what the stage's session, the trainer and the run directory all read.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from dpnrepro.artifacts import checkpoint_dir, run_dir, run_name
from dpnrepro.config.params import Params
from dpnrepro.config.sweeps import SweepConfig, get_sweep, sweep_config
from dpnrepro.errors import ParamsError


class Run(NamedTuple):
    """One run of a sweep (variant "" when the sweep defines none); ``run_dir(sweep, *run)`` is its directory."""

    arch: str
    stem: str
    seed: int
    variant: str = ""

    @property
    def name(self) -> str:
        return run_name(*self)


def sweep_runs(params: Params, sweep: str) -> list[Run]:
    """The runs of ``sweep``, in the order its stages train and evaluate them: arch, variant, stem, seed."""
    sw = get_sweep(params, sweep)
    return [Run(arch, stem, seed, variant) for arch in sw.archs for variant in (list(sw.variants) or [""])
            for stem in sw.stems for seed in sw.seeds]


class ResolvedRun(NamedTuple):
    """A run with its fully resolved settings (top level + sweep recipe + arch override + variant)."""

    sweep: str
    run: Run
    cfg: SweepConfig

    @property
    def dir(self) -> Path:
        return run_dir(self.sweep, *self.run)

    @property
    def checkpoint_dir(self) -> Path:
        return checkpoint_dir(self.sweep, *self.run)


def resolve_runs(params: Params, sweep: str, runs: list[Run] | None = None) -> list[ResolvedRun]:
    """``runs`` (default: every run of ``sweep``) with their settings: ``sweep_config`` once per
    (arch, variant), shared by that arch's stems and seeds (the recipe does not depend on them)."""
    resolved: dict[tuple[str, str], SweepConfig] = {}
    out = []
    for run in sweep_runs(params, sweep) if runs is None else runs:
        key = (run.arch, run.variant)
        if key not in resolved:
            resolved[key] = sweep_config(params, sweep, run.arch, run.variant)
        out.append(ResolvedRun(sweep, run, resolved[key]))
    if not out:
        raise ParamsError(f"sweep {sweep!r} has no runs (archs x stems x seeds is empty)")
    return out


def session_settings(resolved: list[ResolvedRun]) -> tuple:
    """``(runtime, train.device, train.deterministic)`` of the one process that runs ``resolved`` (the runs of
    one sweep, or of a report's sweeps): a stage process holds one process group of ``runtime.devices``
    processes on one device type with one determinism setting (set before the group exists), so runs that
    disagree on any of these are a one-line error."""
    names = list(dict.fromkeys(r.sweep for r in resolved))
    who = f"sweep {names[0]!r} mixes" if len(names) == 1 else f"sweeps {', '.join(map(repr, names))} mix"
    for section, key in (("train", "device"), ("train", "deterministic"), ("runtime", "devices"), ("runtime", "nodes")):
        values = {getattr(getattr(r.cfg, section), key) for r in resolved}
        if len(values) > 1:
            raise ParamsError(f"{who} {section}.{key} values {sorted(values)}: one stage process "
                              f"runs with one {section}.{key}")
    train = resolved[0].cfg.train
    return resolved[0].cfg.runtime, train.device, train.deterministic
