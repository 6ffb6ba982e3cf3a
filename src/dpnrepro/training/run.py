"""One training run of a sweep, from validated params to a complete, atomically written run directory."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from dpnrepro.config import Params, arch_name, get_sweep, sweep_config
from dpnrepro.data.loader import load_split
from dpnrepro.data.pixel_store import STORE_DIR, PixelStoreSplit
from dpnrepro.data.prepare import load_manifest, prepared_dir
from dpnrepro.errors import DatasetError
from dpnrepro.io import atomic_dir, write_json_atomic
from dpnrepro.training import determinism, distributed
from dpnrepro.training.checkpoint import MODEL_FILE, save_weights
from dpnrepro.training.trainer import ModelSpec, train_classifier

SPEC_FILE = "model_spec.json"
SUMMARY_FILE = "run.json"


def run_name(arch: str, stem: str, seed: int) -> str:
    return f"{arch}_{stem}_s{seed}"


def run_dir(sweep: str, arch: str, stem: str, seed: int) -> Path:
    return Path("runs") / sweep / run_name(arch, stem, seed)


def checkpoint_dir(sweep: str, arch: str, stem: str, seed: int) -> Path:
    return Path("checkpoints") / sweep / run_name(arch, stem, seed)


def model_spec(params: Params, arch: str, stem: str, sweep: str = "table1") -> ModelSpec:
    cfg = sweep_config(params, sweep, arch)
    m, inp = cfg.model, cfg.input
    return ModelSpec(
        arch=arch_name(arch), stem=stem, placement=m.placement, num_classes=cfg.data.num_classes,
        img_size=inp.image_size, in_chans=inp.channels, pool=m.pool, rep_size=m.rep_size,
        head_bias_init=m.head_bias_init, drop_rate=m.dropout, drop_path_rate=m.stoch_depth, posemb=m.posemb,
    )


class pretrained_init:
    """Initialise a fine-tuning model from a pretrained run's weights (positions resized, head re-initialised).

    A class rather than a closure so the trainer can put it in the run fingerprint (by its path).
    """

    def __init__(self, weights: Path):
        if not weights.exists():
            raise DatasetError(f"fine-tuning needs the pretrained run {weights.parent}; run its train stage first")
        self.weights = weights

    def __call__(self, model):
        from dpnrepro.training.finetune import init_from_pretrained

        return init_from_pretrained(model, self.weights)

    def __repr__(self) -> str:
        import hashlib

        return f"pretrained:{hashlib.sha256(self.weights.read_bytes()).hexdigest()[:16]}"


def train_run(params: Params, *, sweep: str, arch: str, stem: str, seed: int, progress: bool = True) -> Path:
    """Train one (arch, stem, seed) of ``sweep`` and write its run directory; returns its path.

    Under ``torchrun`` every process trains; rank 0 alone writes the run directory (and logs), the
    others wait for it at a barrier.
    """
    # Before the process group exists: strict determinism also makes torch pick deterministic NCCL
    # reductions (no NVLS) when the group is created (training/determinism.py).
    determinism.configure(sweep_config(params, sweep, arch).train.deterministic)
    with distributed.session(params.train.device) as ctx:
        out = _train_run(params, sweep=sweep, arch=arch, stem=stem, seed=seed, progress=progress, ctx=ctx)
        distributed.barrier(ctx)  # the other ranks exit once rank 0 has written the run directory
    return out


def _train_run(params: Params, *, sweep: str, arch: str, stem: str, seed: int, progress: bool, ctx) -> Path:
    from dvclive import Live

    from dpnrepro.cli import hardware_label

    cfg = sweep_config(params, sweep, arch)
    recipe = get_sweep(params, sweep).recipe
    data_dir = prepared_dir(recipe.dataset)
    manifest = load_manifest(data_dir)
    n_classes = len(manifest["splits"]["train"]["class_counts"])
    if n_classes < cfg.data.num_classes:
        raise DatasetError(f"prepared data {data_dir} has {n_classes} classes, params say {cfg.data.num_classes}; "
                           "rerun `dvc repro prepare`")
    spec = model_spec(params, arch, stem, sweep)
    input_cfg, train_cfg = cfg.input, cfg.train
    train_ds = load_split(data_dir, "train")
    if input_cfg.backend == "fast" and "pixel_store" in manifest:  # decoded at prepare time: no decode per step
        train_ds = PixelStoreSplit(train_ds, data_dir / STORE_DIR)
    out = run_dir(sweep, arch, stem, seed)
    init = None
    if recipe.init_from is not None:
        init = pretrained_init(run_dir(recipe.init_from, arch, stem, seed) / MODEL_FILE)

    def fit(live):
        return train_classifier(spec, train_ds, input_cfg, train_cfg, seed=seed, init=init,
                                ckpt_dir=checkpoint_dir(sweep, arch, stem, seed), live=live, progress=progress)

    if not ctx.is_main:  # trains its share; rank 0 alone logs and writes the run directory
        fit(None)
        return out
    with atomic_dir(out) as tmp:
        t0 = time.perf_counter()
        with Live(dir=str(tmp / "dvclive"), save_dvc_exp=False, dvcyaml=None, report=None) as live:
            live.log_params({"arch": spec.arch, "stem": stem, "seed": seed, "sweep": sweep,
                             "init_from": recipe.init_from or ""})
            model = fit(live)
        seconds = time.perf_counter() - t0
        # No header metadata: safetensors writes it in hash order, which would make the bytes (and
        # so the DVC hash) of identical weights differ between runs. The spec is in SPEC_FILE.
        save_weights(model, tmp / MODEL_FILE)
        (tmp / SPEC_FILE).write_text(json.dumps(asdict(spec), indent=2, sort_keys=True) + "\n")
        write_json_atomic(tmp / SUMMARY_FILE, {
            "arch": spec.arch, "stem": stem, "seed": seed, "profile": params.profile,
            "dataset": cfg.data.name, "train_examples": len(train_ds), "steps": train_cfg.steps,
            "batch_size": train_cfg.batch_size, "hardware": hardware_label(), "sweep": sweep,
            "init_from": recipe.init_from,
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        })
    print(f"trained {run_name(arch, stem, seed)} in {seconds:.0f} s -> {out}")
    return out
