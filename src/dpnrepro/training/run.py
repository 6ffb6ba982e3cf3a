"""Training runs of a sweep, from validated params to complete, atomically written run directories."""

from __future__ import annotations

import time
from pathlib import Path

from dpnrepro.artifacts import ModelSpec, checkpoint_dir, run_dir, run_name, write_run
from dpnrepro.config import SWEEPS, Params, arch_name, get_sweep, sweep_config
from dpnrepro.data.loader import load_split
from dpnrepro.data.pixel_store import STORE_DIR, PixelStoreSplit
from dpnrepro.data.prepare import load_manifest, prepared_dir
from dpnrepro.errors import DatasetError, ParamsError
from dpnrepro.io import atomic_dir
from dpnrepro.training import determinism, distributed, launch
from dpnrepro.training.finetune import pretrained_init
from dpnrepro.training.trainer import train_classifier


def model_spec(params: Params, arch: str, stem: str, sweep: str = "table1", variant: str = "") -> ModelSpec:
    cfg = sweep_config(params, sweep, arch, variant)
    m, inp = cfg.model, cfg.input
    return ModelSpec(
        arch=arch_name(arch), stem=stem, placement=m.placement, block_norm=m.block_norm,
        num_classes=cfg.data.num_classes,
        img_size=inp.image_size, in_chans=inp.channels, pool=m.pool, rep_size=m.rep_size,
        head_bias_init=m.head_bias(cfg.data.num_classes), pos_drop_rate=m.dropout, proj_drop_rate=m.dropout,
        drop_path_rate=m.stoch_depth, posemb=m.posemb,
    )


def sweep_runs(params: Params, sweep: str) -> list[tuple[str, str, int, str]]:
    """The (arch, stem, seed, variant) runs of a sweep, in the order the stage trains them (variant ""
    when the sweep defines none)."""
    sw = get_sweep(params, sweep)
    return [(arch, stem, seed, variant) for arch in sw.archs for variant in (list(sw.variants) or [""])
            for stem in sw.stems for seed in sw.seeds]


def sweep_session(params: Params, sweep: str):
    """The launch and the one process group of a ``train-<sweep>`` stage process (launch.stage_session):
    started outside torchrun with ``runtime.devices > 1`` it starts the job's processes and exits;
    in each of them (or in the only process) it yields the context every run of the sweep shares."""
    cfgs = [sweep_config(params, sweep, a, v) for a, _, _, v in sweep_runs(params, sweep)]
    if not cfgs:
        raise ParamsError(f"sweep {sweep!r} has no runs (archs x stems x seeds is empty)")
    devices = {c.train.device for c in cfgs}
    if len(devices) > 1:
        raise ParamsError(f"sweep {sweep!r} mixes train.device values {sorted(devices)}: one stage process trains on "
                          "one device type")
    return launch.stage_session(cfgs[0].runtime, devices.pop(), any(c.train.deterministic for c in cfgs))


def train_sweep(params: Params, sweep: str, *, progress: bool = True) -> list[Path]:
    """Train every run of ``sweep`` in this process (the DVC stage ``train@<sweep>``).

    One process for the whole sweep instead of one per run: the stage pays Python's start-up once
    (and, under torchrun, sets up the process group once: :func:`sweep_session`).
    A run whose checkpoint is complete for the same fingerprint is restored, not retrained, so adding
    a seed to a sweep trains only the new run.
    """
    return [train_run(params, sweep=sweep, arch=a, stem=st, seed=se, variant=v, progress=progress)
            for a, st, se, v in sweep_runs(params, sweep)]


def train_run(params: Params, *, sweep: str, arch: str, stem: str, seed: int, variant: str = "",
              progress: bool = True) -> Path:
    """Train one (arch, stem, seed[, variant]) of ``sweep`` and write its run directory; returns its path.

    Under ``torchrun`` every process trains; rank 0 alone writes the run directory (and logs), the
    others wait for it at a barrier. Inside :func:`sweep_session` it uses that process group.
    """
    # Before the process group exists: strict determinism also makes torch pick deterministic NCCL
    # reductions (no NVLS) when the group is created (training/determinism.py).
    train_cfg = sweep_config(params, sweep, arch, variant).train
    determinism.configure(train_cfg.deterministic)
    with distributed.session(train_cfg.device) as ctx:  # the run's own device (a recipe may override it)
        out = _train_run(params, sweep=sweep, arch=arch, stem=stem, seed=seed, variant=variant, progress=progress,
                         ctx=ctx)
        distributed.barrier(ctx)  # the other ranks exit once rank 0 has written the run directory
    return out


def _train_run(params: Params, *, sweep: str, arch: str, stem: str, seed: int, variant: str, progress: bool,
               ctx) -> Path:
    from dvclive import Live

    from dpnrepro.cli import hardware_label

    cfg = sweep_config(params, sweep, arch, variant)
    definition = SWEEPS[sweep]
    data_dir = prepared_dir(definition.dataset)
    manifest = load_manifest(data_dir)
    n_classes = len(manifest["splits"]["train"]["class_counts"])
    if n_classes < cfg.data.num_classes:
        raise DatasetError(f"prepared data {data_dir} has {n_classes} classes, params say {cfg.data.num_classes}; "
                           "rerun `dvc repro prepare`")
    spec = model_spec(params, arch, stem, sweep, variant)
    train_ds = load_split(data_dir, "train")
    if cfg.input.backend == "fast" and "pixel_store" in manifest:  # decoded at prepare time: no decode per step
        train_ds = PixelStoreSplit(train_ds, data_dir / STORE_DIR)
    out = run_dir(sweep, arch, stem, seed, variant)
    init = None
    if definition.init_from is not None:
        init = pretrained_init(run_dir(definition.init_from, arch, stem, seed))

    def fit(live):
        return train_classifier(spec, train_ds, cfg.input, cfg.train, seed=seed, runtime=cfg.runtime, init=init,
                                ckpt_dir=checkpoint_dir(sweep, arch, stem, seed, variant), live=live, progress=progress)

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
    print(f"trained {sweep}/{run_name(arch, stem, seed, variant)} in {seconds:.1f} s -> {out}")
    return out
