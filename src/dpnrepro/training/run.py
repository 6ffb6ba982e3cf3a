"""Training runs of a sweep, from validated params to complete, atomically written run directories."""

from __future__ import annotations

import time
from pathlib import Path

from dpnrepro.artifacts import ModelSpec, run_dir, write_run
from dpnrepro.config.core import arch_name
from dpnrepro.config.params import Params
from dpnrepro.config.sweeps import SWEEPS, SweepConfig
from dpnrepro.data.loader import load_split
from dpnrepro.data.pixel_store import STORE_DIR, PixelStoreSplit
from dpnrepro.data.prepare import load_manifest, prepared_dir
from dpnrepro.errors import DatasetError
from dpnrepro.io import atomic_dir, check_writable
from dpnrepro.runs import ResolvedRun, Run, resolve_runs, session_settings
from dpnrepro.training import distributed, launch
from dpnrepro.training.finetune import pretrained_init
from dpnrepro.training.trainer import train_classifier


def model_spec(cfg: SweepConfig, arch: str, stem: str) -> ModelSpec:
    """The model of a run: ``cfg`` is its resolved recipe (:func:`dpnrepro.runs.resolve_runs`)."""
    m, inp = cfg.model, cfg.input
    return ModelSpec(
        arch=arch_name(arch), stem=stem, placement=m.placement, block_norm=m.block_norm,
        num_classes=cfg.data.num_classes,
        img_size=inp.image_size, in_chans=inp.channels, pool=m.pool, rep_size=m.rep_size,
        head_bias_init=m.head_bias(cfg.data.num_classes), pos_drop_rate=m.dropout, proj_drop_rate=m.dropout,
        drop_path_rate=m.stoch_depth, posemb=m.posemb,
    )


def train_stage(params: Params, sweep: str, run: Run | None = None, *, progress: bool = True) -> list[Path]:
    """The ``train-<sweep>`` stage: every run of ``sweep`` (or the one ``run``) in this process.

    Each run's settings are resolved once (:func:`dpnrepro.runs.resolve_runs`) and passed down; the stage
    enters its one session with the runs' own ``train.device`` and ``train.deterministic``
    (:func:`launch.stage_session`: with ``runtime.devices > 1`` outside torchrun it starts the job's
    processes and exits; under torchrun the process group is set up once for the whole sweep). One
    process for the whole sweep: the stage pays Python's start-up once. A run whose checkpoint is complete
    for the same fingerprint is restored, not retrained, so adding a seed to a sweep trains only the new run.
    """
    from dpnrepro.determinism.cpu import require_pins

    require_pins()  # the run directories are results: never labelled "pins not in force"
    resolved = resolve_runs(params, sweep, None if run is None else [run])
    for folder in sorted({p.parent for r in resolved for p in (r.dir, r.checkpoint_dir)}):
        check_writable(folder)  # before training, not at its first checkpoint
    with launch.stage_session(*session_settings(resolved)) as ctx:
        return [train_run(params, r, ctx, progress=progress) for r in resolved]


def train_run(params: Params, resolved: ResolvedRun, ctx, *, progress: bool = True) -> Path:
    """Train one run in the stage's session ``ctx`` and write its run directory; returns its path.

    Under ``torchrun`` every process trains; rank 0 alone writes the run directory (and logs), the
    others wait for it at a barrier.
    """
    out = _train_run(params, resolved, ctx, progress=progress)
    distributed.barrier(ctx)  # the other ranks exit once rank 0 has written the run directory
    return out


def _train_run(params: Params, resolved: ResolvedRun, ctx, *, progress: bool) -> Path:
    from dvclive import Live

    from dpnrepro.cli import hardware_label

    sweep, cfg, (arch, stem, seed, variant) = resolved.sweep, resolved.cfg, resolved.run
    definition = SWEEPS[sweep]
    data_dir = prepared_dir(definition.dataset)
    manifest = load_manifest(data_dir)
    n_classes = len(manifest["splits"]["train"]["class_counts"])
    if n_classes < cfg.data.num_classes:
        raise DatasetError(f"prepared data {data_dir} has {n_classes} classes, params say {cfg.data.num_classes}; "
                           "rerun `dvc repro prepare`")
    spec = model_spec(cfg, arch, stem)
    train_ds = load_split(data_dir, "train")
    if cfg.input.backend == "fast" and "pixel_store" in manifest:  # decoded at prepare time: no decode per step
        train_ds = PixelStoreSplit(train_ds, data_dir / STORE_DIR)
    out = resolved.dir
    init = None
    if definition.init_from is not None:
        init = pretrained_init(run_dir(definition.init_from, arch, stem, seed))

    def fit(live):
        return train_classifier(spec, train_ds, cfg.input, cfg.train, seed=seed, runtime=cfg.runtime, init=init,
                                ckpt_dir=resolved.checkpoint_dir, live=live, progress=progress, ctx=ctx)

    if not ctx.is_main:  # trains its share; rank 0 alone logs and writes the run directory
        fit(None)
        return out
    # What the run computes, fully resolved (as big_vision's config.json): the run directory says
    # exactly how it was made. Runtime settings are left out: they do not change the result.
    config = {"sweep": sweep, "arch": arch, "stem": stem, "seed": seed, **({"variant": variant} if variant else {}),
              "profile": params.profile,
              "init_from": definition.init_from, "dataset": definition.dataset, **cfg.recipe()}
    with atomic_dir(out) as tmp:
        t0 = time.perf_counter()
        with Live(dir=str(tmp / "dvclive"), save_dvc_exp=False, dvcyaml=None, report=None) as live:
            live.log_params(config)
            model = fit(live)
        seconds = time.perf_counter() - t0
        write_run(tmp, model, spec, config, {
            "arch": spec.arch, "stem": stem, "seed": seed, **({"variant": variant} if variant else {}),
            "profile": params.profile,
            "dataset": cfg.data.name, "train_examples": len(train_ds), "steps": cfg.train.steps,
            "batch_size": cfg.train.batch_size, "hardware": hardware_label(), "sweep": sweep,
            "init_from": definition.init_from,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        })
    print(f"trained {sweep}/{resolved.run.name} in {seconds:.1f} s -> {out}")
    return out
