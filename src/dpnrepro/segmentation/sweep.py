"""The Table 5 sweep: every (stem, fraction, seed) run, resumable, then ``runs/seg`` and ``metrics/seg.json``."""

from __future__ import annotations

import json
from pathlib import Path

from dpnrepro.artifacts import run_dir as pretraining_run_dir
from dpnrepro.config import Params
from dpnrepro.segmentation.experiment import FINGERPRINT_FILE, RESULT_FILE, fingerprint, run_config, run_name, \
    train_and_evaluate

CKPT_ROOT, RUNS_ROOT, METRICS = Path("checkpoints/seg"), Path("runs/seg"), Path("metrics/seg.json")
WEIGHTS = "model.safetensors"


def _run(params: Params, stem: str, fraction: str, seed: int) -> dict:
    """One run's result (from its completed checkpoint directory, or trained now)."""
    from safetensors.torch import save_file

    from dpnrepro.io import write_json_atomic

    seg = params.segmentation
    name = run_name(seg.arch, stem, fraction, seed)
    work = CKPT_ROOT / name
    pretrained = None
    if seg.pretrained_seed is not None:
        pretrained = pretraining_run_dir("table1", seg.arch, stem, seg.pretrained_seed)
    cfg = run_config(seg.config, arch=seg.arch, stem=stem, fraction=fraction, seed=seed, data_root=seg.data_root,
                     work_dir=work, pretrained=pretrained, options=seg.options)
    fp = fingerprint(cfg)
    done = work / RESULT_FILE
    if done.exists() and (work / FINGERPRINT_FILE).read_text() == fp:
        return json.loads(done.read_text())
    out = train_and_evaluate(cfg)
    save_file(out.pop("state_dict"), str(work / f".{WEIGHTS}.tmp"))
    (work / f".{WEIGHTS}.tmp").replace(work / WEIGHTS)
    result = {"run": name, "stem": stem, "fraction": fraction, "seed": seed,
              "pretrained": str(pretrained) if pretrained else None, "fingerprint": fp, **out}
    cfg.dump(str(work / "config.py"))
    write_json_atomic(done, result)
    return result


def run_sweep(params: Params, runs: list[tuple[str, str, int]], *, write_outputs: bool = True) -> list[Path]:
    """Train / read back ``runs``; with ``write_outputs`` also write ``runs/seg`` and ``metrics/seg.json``
    (every run of the params must then be among ``runs``)."""
    import shutil

    from tqdm import tqdm

    from dpnrepro.cli import hardware_label
    from dpnrepro.io import atomic_dir, write_json_atomic

    results = [_run(params, *r) for r in tqdm(runs, desc="segmentation runs", unit="run")]
    if not write_outputs:
        return []
    with atomic_dir(RUNS_ROOT) as tmp:
        for r in results:
            (tmp / r["run"]).mkdir()
            for f in (WEIGHTS, "config.py", RESULT_FILE):
                shutil.copy2(CKPT_ROOT / r["run"] / f, tmp / r["run"] / f)
    seg = params.segmentation
    metrics = {
        "profile": params.profile, "hardware": hardware_label(), "arch": seg.arch, "config": seg.config,
        "data_root": seg.data_root, "options": seg.options,
        "pretrained": f"runs/table1/{seg.arch}_<stem>_s{seg.pretrained_seed}" if seg.pretrained_seed is not None
        else None,
        "runs": {r["run"]: {k: r[k] for k in ("stem", "fraction", "seed", "mIoU", "mAcc", "aAcc", "train_images",
                                              "iters")} for r in results},
    }
    write_json_atomic(METRICS, metrics)
    return [RUNS_ROOT, METRICS]
