"""Train and score the runs of one study cell, in parallel worker processes.

The cell's dataset is prepared once per stage into a temporary directory (the same train[:99%] /
held-out protocol and pixel store as the paper's `prepare` stage; content-fingerprinted, so it is the
same on every machine), then every (stem, seed) run trains in a worker process pinned to
``threads_per_run`` intra-op threads: a run's bits depend on that count, not on how many workers run
side by side. Resumable state lives in ``checkpoints/study/<cell>/`` (a local cache, as for the paper's
sweeps); the stage's only output is ``metrics/study/<cell>.json``, a function of code and params alone.
"""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

from dpnrepro.study.config import Cell, StudyDataset, StudyParams

WORKERS_ENV = "DPNREPRO_STUDY_WORKERS"  # an execution setting: results do not depend on it
METRICS_DIR = Path("metrics/study")
CHECKPOINTS_DIR = Path("checkpoints/study")
EVAL_BATCH_SIZE = 500


def prepare_study_dataset(dataset: StudyDataset, out_dir: Path) -> Path:
    """Write the dataset's prepared splits (train, minival, val + pixel store) under ``out_dir``."""
    import datasets

    from dpnrepro.data.prepare import prepare_dataset

    datasets.disable_progress_bars()
    cfg = dataset.data.model_dump()
    if dataset.build is not None:
        from dpnrepro.transfer.smoke_data import BUILDERS

        raw_dir = out_dir / "raw"
        BUILDERS[dataset.build.kind](dict(dataset.build.counts), dataset.build.seed).save_to_disk(str(raw_dir))
        cfg["source"] = str(raw_dir)
    prepare_dataset(cfg, out_dir / "prepared")
    return out_dir / "prepared"


def _run_name(stem: str, seed: int) -> str:
    return f"{stem}_s{seed}"


def train_and_score(job: dict) -> dict:
    """One run (in a worker process): train on the prepared train split, top-1 on its val split."""
    from dpnrepro.determinism.cpu import require_pins, route_convolutions

    require_pins()  # a worker that cannot hold the stage's pins makes no result
    import torch

    torch.set_num_threads(job["threads"])
    route_convolutions()  # a spawned worker: the convolution path the stage's label names
    from dpnrepro.artifacts import ModelSpec
    from dpnrepro.config.core import InputParams, TrainParams
    from dpnrepro.config.runtime import RuntimeParams
    from dpnrepro.data.loader import load_split
    from dpnrepro.data.pixel_store import STORE_DIR, PixelStoreSplit
    from dpnrepro.evaluation.classification import evaluate_top1
    from dpnrepro.training.distributed import pick_device
    from dpnrepro.training.trainer import train_classifier

    data_dir = Path(job["data_dir"])
    inp, train = InputParams.model_validate(job["input"]), TrainParams.model_validate(job["train"])
    train_ds = load_split(data_dir, "train")
    if inp.backend == "fast":
        train_ds = PixelStoreSplit(train_ds, data_dir / STORE_DIR)
    t0 = time.perf_counter()
    model = train_classifier(ModelSpec(**job["spec"]), train_ds, inp, train, seed=job["seed"],
                             ckpt_dir=job["ckpt_dir"], runtime=RuntimeParams(ckpt_every=200), progress=False)
    seconds = time.perf_counter() - t0
    score = evaluate_top1(model, load_split(data_dir, "val"), inp.model_dump(), batch_size=EVAL_BATCH_SIZE,
                          device=pick_device(train.device), progress=False)
    return {"stem": job["spec"]["stem"], "seed": job["seed"], "val_top1": score["top1"],
            "val_examples": score["examples"], "train_examples": len(train_ds), "seconds": seconds}


def cell_jobs(params: StudyParams, cell: Cell, data_dir: Path) -> list[dict]:
    from dataclasses import asdict

    from dpnrepro.artifacts import ModelSpec
    from dpnrepro.config.core import arch_name

    inp, model, train = params.run_config(cell)
    n_classes = params.datasets[cell.dataset].data.num_classes
    jobs = []
    for stem in cell.stems:
        spec = ModelSpec(arch=arch_name(cell.arch), stem=stem, placement=model.placement, block_norm=model.block_norm,
                         num_classes=n_classes, img_size=inp.image_size, in_chans=inp.channels, pool=model.pool,
                         rep_size=model.rep_size, head_bias_init=model.head_bias(n_classes),
                         pos_drop_rate=model.dropout, proj_drop_rate=model.dropout, drop_path_rate=model.stoch_depth,
                         posemb=model.posemb)
        for seed in cell.seeds:
            jobs.append({"spec": asdict(spec), "seed": seed, "input": inp.model_dump(), "train": train.model_dump(),
                         "data_dir": str(data_dir), "threads": params.threads_per_run,
                         "ckpt_dir": str(CHECKPOINTS_DIR / cell.name / _run_name(stem, seed))})
    return jobs


def worker_count(workers: int | None, env=os.environ) -> int | None:
    """The number of parallel runs asked for: ``workers`` (``--workers``), else ``$DPNREPRO_STUDY_WORKERS``,
    else None (the CPU count); a UserError (one line) unless it is a positive integer."""
    from dpnrepro.errors import UserError

    if workers is not None:
        if workers < 1:
            raise UserError(f"--workers {workers}: the number of parallel runs must be a positive integer")
        return workers
    raw = env.get(WORKERS_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(f"{WORKERS_ENV}={raw!r}: the number of parallel runs must be a positive integer "
                        f"(or unset it for the CPU count)")
    return value


def run_cell(params: StudyParams, cell: Cell, *, workers: int | None = None, progress: bool = True) -> dict:
    """Train every run of ``cell``; returns the cell's metrics (no timings: they differ per machine)."""
    from tqdm.auto import tqdm

    from dpnrepro.cli import hardware_label

    workers = worker_count(workers)
    inp, model, train = params.run_config(cell)
    with tempfile.TemporaryDirectory(prefix="dpnrepro-study-") as tmp:
        data_dir = prepare_study_dataset(params.datasets[cell.dataset], Path(tmp))
        jobs = cell_jobs(params, cell, data_dir)
        n = min(workers or os.cpu_count() or 1, len(jobs))
        results, t0 = [], time.perf_counter()
        bar = tqdm(total=len(jobs), desc=f"study {cell.name}", unit="run", disable=not progress)
        if n == 1:  # in this process: no worker start-up
            for job in jobs:
                results.append(train_and_score(job))
                bar.update(1)
        else:
            with ProcessPoolExecutor(max_workers=n, mp_context=get_context("spawn")) as pool:
                for fut in as_completed([pool.submit(train_and_score, job) for job in jobs]):
                    results.append(fut.result())
                    bar.update(1)
        bar.close()
    print(f"{cell.name}: {len(jobs)} runs in {time.perf_counter() - t0:.0f} s with {n} workers "
          f"(per run: {', '.join(format(r['seconds'], '.0f') for r in results)} s)")
    import torch

    torch.set_num_threads(params.threads_per_run)  # the label names the thread count the runs used
    hardware = hardware_label()
    data = params.datasets[cell.dataset].data
    runs = {_run_name(r["stem"], r["seed"]): {k: r[k] for k in ("stem", "seed", "val_top1")}
            for r in sorted(results, key=lambda r: (cell.stems.index(r["stem"]), r["seed"]))}
    first = results[0]
    return {
        "profile": "study", "cell": cell.name, "kind": cell.kind, "dataset": cell.dataset, "arch": cell.arch,
        "schedule": cell.schedule, "steps": train.steps, "stems": list(cell.stems), "seeds": list(cell.seeds),
        "data": {"name": data.name, "train_examples": first["train_examples"], "val_examples": first["val_examples"]},
        "recipe": {"input": inp.model_dump(), "model": model.model_dump(), "train": train.model_dump()},
        "hardware": hardware, "runs": runs,
    }
