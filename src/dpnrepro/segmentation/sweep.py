"""The Table 5 sweep: every (stem, fraction, seed) run, resumable, then ``runs/seg`` and ``metrics/seg.json``.

Every rank of the stage's job (training/launch.py) trains every run together; rank 0 alone writes run
files, ``runs/seg`` and the metrics (with the validation set's constant-prediction mIoU, ``chance``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dpnrepro.artifacts import run_dir as pretraining_run_dir
from dpnrepro.config.params import Params
from dpnrepro.config.segmentation import SegmentationParams
from dpnrepro.segmentation.experiment import FINGERPRINT_FILE, RESULT_FILE, fingerprint, run_config, run_name, \
    train_and_evaluate

CKPT_ROOT, RUNS_ROOT, METRICS = Path("checkpoints/seg"), Path("runs/seg"), Path("metrics/seg.json")
WEIGHTS = "model.safetensors"
RUN_FILES = (WEIGHTS, "config.py", RESULT_FILE)  # a completed run's files, copied to runs/seg


def _completed(work: Path, fp: str) -> dict | None:
    """The result of the run completed in ``work`` under fingerprint ``fp``, once its files match their
    checksums; None where there is none, or where it is damaged or has no checksum record (a run saved
    before records were kept: then a line says that it cannot be verified and is retrained)."""
    from dpnrepro.training.checkpoint import CHECKSUMS, verified

    fingerprint_file = work / FINGERPRINT_FILE
    if not (work / RESULT_FILE).exists() or not fingerprint_file.exists() or fingerprint_file.read_text() != fp:
        return None
    if not verified(work / CHECKSUMS, RUN_FILES, run=work.name, discard=work):
        return None
    return json.loads((work / RESULT_FILE).read_text())


def _save_run(work: Path, cfg, state: dict, result: dict) -> None:
    """The run's files (:data:`RUN_FILES`) and their checksums, written as one unit (the result last: a
    kill inside the unit leaves no result, so the run resumes from its last checkpoint instead)."""
    from safetensors.torch import save

    from dpnrepro.io import json_text
    from dpnrepro.training.checkpoint import write_with_checksums

    write_with_checksums(work, {WEIGHTS: save(state),
                                "config.py": cfg.pretty_text.encode(),  # the recipe: no execution setting
                                RESULT_FILE: json_text(result).encode()})


def _run(params: Params, stem: str, fraction: str, seed: int, ctx) -> dict:
    """One run's result (from its completed checkpoint directory, or trained now; written by rank 0)."""
    from dpnrepro.training.distributed import barrier, broadcast_object

    seg: SegmentationParams = params.segmentation
    name = run_name(seg.arch, stem, fraction, seed)
    work = CKPT_ROOT / name
    pretrained = None
    if seg.pretrained_seed is not None:
        pretrained = pretraining_run_dir("table1", seg.arch, stem, seg.pretrained_seed)
    cfg = run_config(seg.config, arch=seg.arch, stem=stem, fraction=fraction, seed=seed, data_root=seg.data_root,
                     work_dir=work, pretrained=pretrained, options=seg.options, device=ctx.device.type)
    fp = fingerprint(cfg)
    done = broadcast_object(ctx, _completed(work, fp) if ctx.is_main else None)
    if done is not None:
        return done
    out = train_and_evaluate(cfg, ctx=ctx)
    state = out.pop("state_dict")
    result = {"run": name, "stem": stem, "fraction": fraction, "seed": seed,
              "pretrained": str(pretrained) if pretrained else None, "fingerprint": fp, **out}
    if ctx.is_main:
        _save_run(work, cfg, state, result)
    barrier(ctx)  # no rank starts the next run (or reads this one back) before rank 0 has written it
    return result


def sweep_chance(params: Params) -> dict:
    """The validation set's constant-prediction mIoU (chance.py), under the sweep's config and data."""
    from dpnrepro.segmentation.chance import constant_prediction_miou

    seg = params.segmentation
    cfg = run_config(seg.config, arch=seg.arch, stem=seg.stems[0], fraction=seg.fractions[0], seed=seg.seeds[0],
                     data_root=seg.data_root, work_dir=CKPT_ROOT, options=seg.options)
    return constant_prediction_miou(cfg)


def run_sweep(params: Params, runs: list[tuple[str, str, int]], *, write_outputs: bool = True, ctx=None) -> list[Path]:
    """Train / read back ``runs`` on this process's share of the job (``ctx``; None: one process); with
    ``write_outputs`` rank 0 also writes ``runs/seg`` and ``metrics/seg.json`` (every run of the params
    must then be among ``runs``)."""
    from tqdm import tqdm

    from dpnrepro.cli import hardware_label
    from dpnrepro.io import atomic_dir, write_json_atomic

    from dpnrepro.training.distributed import DistContext

    ctx = ctx or DistContext()
    results = [_run(params, *r, ctx) for r in tqdm(runs, desc="segmentation runs", unit="run", disable=not ctx.is_main)]
    if not write_outputs or not ctx.is_main:
        return []
    with atomic_dir(RUNS_ROOT) as tmp:
        for r in results:
            (tmp / r["run"]).mkdir()
            for f in RUN_FILES:
                shutil.copy2(CKPT_ROOT / r["run"] / f, tmp / r["run"] / f)
    seg: SegmentationParams = params.segmentation
    metrics = {
        "profile": params.profile, "hardware": hardware_label(), "arch": seg.arch, "config": seg.config,
        "data_root": seg.data_root, "options": seg.options,
        "pretrained": f"runs/table1/{seg.arch}_<stem>_s{seg.pretrained_seed}" if seg.pretrained_seed is not None
        else None,
        "chance": sweep_chance(params),
        "runs": {r["run"]: {k: r[k] for k in ("stem", "fraction", "seed", "mIoU", "mAcc", "aAcc", "train_images",
                                              "iters")} for r in results},
    }
    write_json_atomic(METRICS, metrics)
    return [RUNS_ROOT, METRICS]
