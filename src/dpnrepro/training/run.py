"""One training run of a sweep, from validated params to a complete, atomically written run directory."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from dpnrepro.config import Params, arch_name, resolve_run
from dpnrepro.data.loader import load_split
from dpnrepro.data.prepare import load_manifest
from dpnrepro.errors import DatasetError
from dpnrepro.io import atomic_dir, write_json_atomic
from dpnrepro.training.checkpoint import MODEL_FILE, save_weights
from dpnrepro.training.trainer import ModelSpec, train_classifier

PREPARED = Path("data/prepared")
SPEC_FILE = "model_spec.json"
SUMMARY_FILE = "run.json"


def run_name(arch: str, stem: str, seed: int) -> str:
    return f"{arch}_{stem}_s{seed}"


def run_dir(sweep: str, arch: str, stem: str, seed: int) -> Path:
    return Path("runs") / sweep / run_name(arch, stem, seed)


def checkpoint_dir(sweep: str, arch: str, stem: str, seed: int) -> Path:
    return Path("checkpoints") / sweep / run_name(arch, stem, seed)


def model_spec(params: Params, arch: str, stem: str, sweep: str = "table1") -> ModelSpec:
    m, inp = resolve_run(params, sweep, arch)
    return ModelSpec(
        arch=arch_name(arch), stem=stem, placement=m.placement, num_classes=params.data.num_classes,
        img_size=inp.image_size, in_chans=inp.channels, pool=m.pool, rep_size=m.rep_size,
        head_bias_init=m.head_bias_init, drop_rate=m.dropout, drop_path_rate=m.stoch_depth,
    )


def train_run(params: Params, *, sweep: str, arch: str, stem: str, seed: int, progress: bool = True) -> Path:
    """Train one (arch, stem, seed) of ``sweep`` and write its run directory; returns its path."""
    from dvclive import Live

    from dpnrepro.cli import hardware_label

    manifest = load_manifest(PREPARED)
    n_classes = len(manifest["splits"]["train"]["class_counts"])
    if n_classes < params.data.num_classes:
        raise DatasetError(f"prepared data has {n_classes} classes, params say {params.data.num_classes}; "
                           "rerun `dvc repro prepare`")
    spec = model_spec(params, arch, stem, sweep)
    _, input_cfg = resolve_run(params, sweep, arch)
    train_ds = load_split(PREPARED, "train")
    out = run_dir(sweep, arch, stem, seed)
    with atomic_dir(out) as tmp:
        t0 = time.perf_counter()
        with Live(dir=str(tmp / "dvclive"), save_dvc_exp=False, dvcyaml=None, report=None) as live:
            live.log_params({"arch": spec.arch, "stem": stem, "seed": seed, "sweep": sweep})
            model = train_classifier(spec, train_ds, input_cfg, params.train, seed=seed,
                                     ckpt_dir=checkpoint_dir(sweep, arch, stem, seed), live=live,
                                     progress=progress)
        seconds = time.perf_counter() - t0
        # No header metadata: safetensors writes it in hash order, which would make the bytes (and
        # so the DVC hash) of identical weights differ between runs. The spec is in SPEC_FILE.
        save_weights(model, tmp / MODEL_FILE)
        (tmp / SPEC_FILE).write_text(json.dumps(asdict(spec), indent=2, sort_keys=True) + "\n")
        write_json_atomic(tmp / SUMMARY_FILE, {
            "arch": spec.arch, "stem": stem, "seed": seed, "profile": params.profile,
            "dataset": params.data.name, "train_examples": len(train_ds), "steps": params.train.steps,
            "batch_size": params.train.batch_size, "hardware": hardware_label(),
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        })
    print(f"trained {run_name(arch, stem, seed)} in {seconds:.0f} s -> {out}")
    return out
