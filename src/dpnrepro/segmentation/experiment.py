"""One Table 5 run, (arch, stem, training fraction, seed), with mmengine's Runner and mmseg's IoUMetric.

:func:`run_config` turns an mmseg config file into the config of one run: the run's stem, seed
(``randomness.seed``: sampler order, augmentation, init of the decode head), seeded training subset
(``dataset.indices``, :func:`dpnrepro.data.segmentation.fraction_indices`), data root and pretraining
run; the work directory (``checkpoints/seg/<run>``) holds mmengine's checkpoints, so a killed run
resumes (:mod:`dpnrepro.segmentation.resume`). :func:`train_and_evaluate` trains with
``Runner.train()`` and evaluates once with ``Runner.val()`` (sliding windows, ``IoUMetric``), on
this process's share of the stage's job (:mod:`dpnrepro.segmentation.execution`: DDP, AMP, seeds).

The config a run saves is its recipe only, a function of the run: execution settings (resume, world
size, experiment name, log level) go into a copy that the Runner alone sees, so a fresh and a resumed
run, and a 1- and an N-process run, save the same ``config.py``.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from dpnrepro.data.segmentation import check_layout, fraction_indices, parse_fraction

RESULT_FILE = "result.json"
FINGERPRINT_FILE = "fingerprint.txt"


def run_name(arch: str, stem: str, fraction: str, seed: int) -> str:
    frac = str(parse_fraction(fraction)).replace("/", "-")
    return f"{arch.replace('/', '-')}_{stem}_f{frac}_s{seed}"


def run_config(config_file: str | Path, *, arch: str, stem: str, fraction: str, seed: int, data_root: str,
               work_dir: str | Path, pretrained: str | Path | None = None, options: dict | None = None,
               device: str = "cpu"):
    """The mmengine ``Config`` of one run (the config file's recipe; ``options`` as ``--cfg-options``) on
    ``device`` (``cpu``/``cuda``: the optimizer wrapper, fp32 or bf16 AMP)."""
    from dpnrepro.segmentation.execution import optim_wrapper_for

    from mmengine.config import Config

    from dpnrepro.errors import ParamsError

    if not Path(config_file).exists():
        raise ParamsError(f"segmentation config {config_file} does not exist")
    cfg = Config.fromfile(str(config_file))
    cfg.merge_from_dict(dict(options or {}))
    cfg.work_dir = str(work_dir)
    # per-rank augmentation streams, one data order for every world size (execution.py, "Seeds")
    cfg.randomness = dict(seed=seed, diff_rank_seed=True, deterministic=False)
    cfg.optim_wrapper = optim_wrapper_for(cfg.optim_wrapper, device)
    cfg.model.backbone.arch = arch.replace("-", "/")
    cfg.model.backbone.stem = stem
    cfg.model.backbone.pretrained = str(pretrained) if pretrained else None
    cfg.load_from = None
    for loader in ("train_dataloader", "val_dataloader", "test_dataloader"):
        cfg[loader].dataset.data_root = str(data_root)
        if cfg[loader].get("sampler") is not None:
            cfg[loader].sampler.seed = seed
    check_eval_padding(cfg)
    ds = cfg.train_dataloader.dataset
    n_train = check_layout(data_root, **_suffixes(ds))["train"]
    ds.indices = fraction_indices(n_train, fraction, seed)
    return cfg


def check_eval_padding(cfg) -> None:
    """Evaluation pads each image to a multiple of the backbone's patch (the data preprocessor's
    ``test_cfg.size_divisor``): a window whose side is not a multiple raises in the backbone, and it would
    do so in ``runner.val()``, after the whole training. A one-line :class:`ParamsError` now instead."""
    from dpnrepro.errors import ParamsError
    from dpnrepro.model_spec import parse_arch

    _, patch = parse_arch(cfg.model.backbone.arch)
    divisor = ((cfg.model.data_preprocessor.get("test_cfg") or {}).get("size_divisor")) or 0
    if divisor % patch or not divisor:
        raise ParamsError(f"model.data_preprocessor.test_cfg.size_divisor is {divisor or 'not set'}; set it to a "
                          f"multiple of the patch ({patch}) of {cfg.model.backbone.arch}, so evaluation pads every "
                          "image to whole patches")


def _suffixes(dataset_cfg) -> dict:
    out = {}
    if "img_suffix" in dataset_cfg:
        out["img_suffix"] = dataset_cfg.img_suffix
    if "seg_map_suffix" in dataset_cfg:
        out["seg_suffix"] = dataset_cfg.seg_map_suffix
    if dataset_cfg.get("type") == "ADE20KDataset":
        out = {"img_suffix": ".jpg", "seg_suffix": ".png"}
    return out


def _data_listing_digest(root: str | Path) -> str:
    """Names and sizes of every file under the data root (cheap even for ADE20K's 27k files)."""
    h = hashlib.sha256()
    for path in sorted(Path(root).rglob("*")):
        if path.is_file():
            h.update(f"{path.relative_to(root)}\t{path.stat().st_size}\n".encode())
    return h.hexdigest()


def fingerprint(cfg) -> str:
    """What decides a run's result: its resolved config (minus where it is written), the pretraining
    weights' bytes and the data files (names and sizes). A checkpoint directory of another fingerprint
    is not resumed from."""
    h = hashlib.sha256(cfg.pretty_text.replace(cfg.work_dir, "<work_dir>").encode())
    pretrained = cfg.model.backbone.get("pretrained")
    if pretrained:
        weights = Path(pretrained)
        weights = weights / "model.safetensors" if weights.is_dir() else weights
        if weights.exists():
            h.update(hashlib.sha256(weights.read_bytes()).digest())
    h.update(_data_listing_digest(cfg.train_dataloader.dataset.data_root).encode())
    return h.hexdigest()[:16]


def train_and_evaluate(cfg, *, ctx=None, log_level: str = "WARNING") -> dict:
    """Train (resuming from ``cfg.work_dir`` when it holds a checkpoint of the same config) and evaluate.

    ``ctx``: this process's :class:`~dpnrepro.training.distributed.DistContext` (None: one process; every
    rank of a job calls this). Returns ``{"mIoU", "mAcc", "aAcc"}`` (percent, IoUMetric), the trained
    segmentor's state dict under ``"state_dict"``, ``"train_images"`` and ``"iters"``."""
    from mmengine.model import is_model_wrapper
    from mmengine.runner import Runner

    from dpnrepro.segmentation.execution import execution_config
    from dpnrepro.io import write_text_atomic
    from dpnrepro.segmentation.resume import safe_mmengine_load, verify_resume_point
    from dpnrepro.training.distributed import DistContext, barrier

    ctx = ctx or DistContext()
    work = Path(cfg.work_dir)
    if ctx.is_main:
        fp = fingerprint(cfg)
        if (work / FINGERPRINT_FILE).exists() and (work / FINGERPRINT_FILE).read_text() != fp:
            shutil.rmtree(work)  # a checkpoint of another recipe: start over
        verify_resume_point(work)  # else it said so and removed the work directory
        work.mkdir(parents=True, exist_ok=True)
        write_text_atomic(work / FINGERPRINT_FILE, fp)
    barrier(ctx)
    run_cfg = execution_config(cfg, name=work.name, world_size=ctx.world_size, device_type=ctx.device.type,
                               resume=(work / "last_checkpoint").exists(), log_level=log_level)
    runner = Runner.from_cfg(run_cfg)
    try:
        with safe_mmengine_load(work):
            runner.train()
        metrics = runner.val()
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    finally:
        release_instances(runner)
    return {"mIoU": float(metrics["mIoU"]), "mAcc": float(metrics["mAcc"]), "aAcc": float(metrics["aAcc"]),
            "train_images": len(cfg.train_dataloader.dataset.indices), "iters": int(cfg.train_cfg.max_iters),
            "state_dict": state}


def release_instances(runner) -> None:
    """Forget a finished Runner's named mmengine singletons (logger, message hub, visualizer), so a later
    run of the same name in this process builds its own instead of logging into this run's."""
    import logging

    for obj in (runner.visualizer, runner.message_hub, runner.logger):
        type(obj)._instance_dict.pop(obj.instance_name, None)
    for handler in list(runner.logger.handlers):
        if isinstance(handler, logging.FileHandler):
            handler.close()
            runner.logger.removeHandler(handler)
