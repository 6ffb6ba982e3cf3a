"""The one trainer behind every classification stage: resumable, seeded, logged with dvclive."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from dpnrepro.data.loader import StepBatchSampler, build_transform, train_loader
from dpnrepro.errors import UserError
from dpnrepro.training.checkpoint import load_checkpoint, read_checkpoint_meta, save_checkpoint
from dpnrepro.training.losses import LOSSES, mixup, one_hot_targets
from dpnrepro.training.optim import build_optimizer, build_scheduler


class TrainingDiverged(UserError):
    """The loss became NaN/inf; the last good checkpoint is kept."""


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a model with :func:`dpnrepro.models.build_vit`."""

    arch: str
    stem: str
    placement: str
    num_classes: int
    img_size: int
    in_chans: int
    pool: str
    rep_size: int | bool
    head_bias_init: float
    drop_rate: float
    drop_path_rate: float

    def build(self) -> torch.nn.Module:
        from dpnrepro.models import build_vit

        kw = asdict(self)
        arch = kw.pop("arch")
        return build_vit(arch, **kw)

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelSpec":
        return cls(**json.loads(Path(path).read_text()))


def seed_everything(seed: int, deterministic: bool = True) -> None:
    """Seed Python, NumPy and torch; request deterministic kernels (see README, Determinism)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device is 'cuda' but no CUDA device is visible; set train.device: auto or cpu")
    return torch.device(name)


def grad_norms_by_layer(model: torch.nn.Module) -> dict[str, float]:
    """L2 norm of the gradient of the stem and of each transformer block (Figures 2 and 4)."""
    groups: dict[str, list[torch.Tensor]] = {"stem": []}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if name.startswith("patch_embed."):
            groups["stem"].append(p.grad)
        elif name.startswith("blocks."):
            groups.setdefault(f"block_{int(name.split('.')[1]):02d}", []).append(p.grad)
    return {k: float(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in v]))) for k, v in groups.items() if v}


def fingerprint(*parts) -> str:
    """A short hash of everything that determines a run (a checkpoint resumes only a matching run)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def train_classifier(spec: ModelSpec, train_ds, input_cfg, train_cfg, *, seed: int, ckpt_dir: str | Path,
                     live=None, progress: bool = True) -> torch.nn.Module:
    """Train ``spec`` on ``train_ds`` for ``train_cfg.steps`` steps, resuming from ``ckpt_dir``.

    A checkpoint is written every ``ckpt_every`` steps and at the end; if ``ckpt_dir`` holds one with
    the same fingerprint (model, data, input, train config, seed), training continues from it and
    ends with bit-identical weights on CPU.
    """
    seed_everything(seed, train_cfg.deterministic)
    device = pick_device(train_cfg.device)
    model = spec.build().to(device)
    optimizer = build_optimizer(model, train_cfg)
    scheduler = build_scheduler(optimizer, train_cfg)
    fp = fingerprint(asdict(spec), input_cfg.model_dump(), train_cfg.model_dump(exclude={"log_every", "ckpt_every"}),
                     seed, train_ds._fingerprint)
    start = 0
    meta = read_checkpoint_meta(ckpt_dir)
    if meta is not None and meta.get("fingerprint") == fp:
        load_checkpoint(ckpt_dir, model=model, optimizer=optimizer, scheduler=scheduler)
        start = meta["step"]
        print(f"resuming from {ckpt_dir} at step {start}/{train_cfg.steps}")
    elif meta is not None:
        print(f"ignoring checkpoint in {ckpt_dir}: it belongs to another configuration")

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    sampler = StepBatchSampler(len(train_ds), train_cfg.batch_size, seed=seed, start_step=start,
                               total_steps=train_cfg.steps, rank=rank, world_size=world)
    loader = train_loader(train_ds, build_transform(input_cfg.model_dump(), train=True), sampler, input_cfg.workers)
    loss_fn = LOSSES[train_cfg.loss]
    use_bf16 = device.type == "cuda"
    params = [p for p in model.parameters() if p.requires_grad]

    bar = tqdm(total=train_cfg.steps, initial=start, desc=f"train {spec.arch} {spec.stem} s{seed}",
               unit="step", disable=not progress, dynamic_ncols=True)
    step = start
    for images, labels in loader:
        model.train()
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        targets = one_hot_targets(labels, spec.num_classes, train_cfg.label_smoothing)
        images, targets = mixup(images, targets, input_cfg.mixup, seed, step)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(images)
        loss = loss_fn(logits.float(), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        log_now = (step + 1) % train_cfg.log_every == 0 or step + 1 == train_cfg.steps
        layer_norms = grad_norms_by_layer(model) if log_now else None
        if train_cfg.grad_clip > 0:
            gnorm = torch.nn.utils.clip_grad_norm_(params, train_cfg.grad_clip)
        else:
            gnorm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        step += 1
        ckpt_now = step % train_cfg.ckpt_every == 0 or step == train_cfg.steps
        if log_now or ckpt_now:
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise TrainingDiverged(
                    f"loss is {loss_value} at step {step}; last good checkpoint kept in {ckpt_dir}. "
                    "Lower train.lr or enable train.grad_clip"
                )
        if log_now:
            bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.2e}")
            if live is not None:
                live.step = step
                live.log_metric("train/loss", loss_value)
                live.log_metric("train/lr", lr)
                live.log_metric("train/grad_norm", float(gnorm))
                for k, v in layer_norms.items():
                    live.log_metric(f"grad_norm/{k}", v)
        if ckpt_now:
            save_checkpoint(ckpt_dir, model=model, optimizer=optimizer, scheduler=scheduler, step=step,
                            fingerprint=fp)
        bar.update(1)
    bar.close()
    return model
