"""The one trainer behind every classification stage: resumable, seeded, logged with dvclive."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import signal
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from dpnrepro.artifacts import ModelSpec
from dpnrepro.config.runtime import RuntimeParams
from dpnrepro.data.loader import HaloBatchSampler, StepBatchSampler, _mix, train_batches
from dpnrepro.errors import UserError
from dpnrepro.training import distributed
from dpnrepro.training.checkpoint import checkpoint_step, load_checkpoint, read_checkpoint_meta, save_checkpoint
from dpnrepro.training.history import Curves
from dpnrepro.training.losses import LOSSES, mixup, targets_of
from dpnrepro.training.optim import build_optimizer, build_scheduler
from dpnrepro.training.step import LossStep, reseed, unit_range


class TrainingDiverged(UserError):
    """The loss became NaN/inf; the last good checkpoint is kept."""


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (the kernels' determinism is the session's: distributed.process_session)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def grad_norms_by_layer(model: torch.nn.Module) -> dict[str, float]:
    """L2 norm of the gradient of the stem and of each transformer block (Figures 2 and 4).

    The stem is ``patch_embed`` plus ``norm_pre`` (the LayerNorm of the ``post_posemb`` stem). Under
    FSDP2 the gradients are sharded DTensors and this is a collective: call it on every rank.
    """
    groups: dict[str, list[torch.Tensor]] = {"stem": []}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if name.startswith(("patch_embed.", "norm_pre.")):
            groups["stem"].append(p.grad)
        elif name.startswith("blocks."):
            groups.setdefault(f"block_{int(name.split('.')[1]):02d}", []).append(p.grad)
    return {k: float(torch.linalg.vector_norm(torch.stack([distributed.local_tensor(g.float().norm()) for g in v])))
            for k, v in groups.items() if v}


def fingerprint(*parts) -> str:
    """A short hash of everything that determines a run (a checkpoint resumes only a matching run)."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def code_fingerprint(root: Path | None = None) -> str:
    """A hash of the code a training run executes: exactly the code deps of the train stages in dvc.yaml
    (both come from :func:`dpnrepro.codedeps.code_files`). It joins the run fingerprint, so after a code
    change `dvc repro` retrains instead of "resuming" a finished checkpoint written by the old code."""
    from dpnrepro.codedeps import ROOT, code_files

    root = root or ROOT
    digest = hashlib.sha256()
    for rel in code_files("stages/train.py", root):
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes())
    return digest.hexdigest()[:16]


# Test hook: SIGKILL rank 0 right after the checkpoint of this step is complete (a crash mid-run).
KILL_AT_STEP_ENV = "DPNREPRO_TEST_KILL_AT_STEP"


def train_classifier(spec: ModelSpec, train_ds, input_cfg, train_cfg, *, seed: int, ckpt_dir: str | Path,
                     runtime: RuntimeParams | None = None, live=None, progress: bool = True,
                     init=None, on_step=None, ctx: distributed.DistContext | None = None) -> torch.nn.Module | None:
    """Train ``spec`` on ``train_ds`` for ``train_cfg.steps`` steps, resuming from ``ckpt_dir``.

    A checkpoint is written every ``runtime.ckpt_every`` steps and at the end; if ``ckpt_dir`` holds one
    with the same fingerprint (model, data, input, train config, seed, code), training continues from it and
    ends with bit-identical weights on CPU; ``live`` first gets the curves logged up to the checkpoint
    again (:class:`Curves`), so its dvclive files are those of an uninterrupted run. ``init`` (optional) is called with the freshly built model
    before training (e.g. fine-tuning from a pretrained run); its ``repr`` joins the fingerprint.
    ``on_step`` (optional, benchmarks) is called with the step number after each optimizer step.

    Under ``torchrun`` each process trains on its slice of every global batch (``train.batch_size``),
    split into ``runtime.accum_steps`` micro-batches; gradients are the mean over the global batch, so
    the optimizer takes the recipe's ``train.steps`` steps whatever the world size. Only rank 0 logs
    (``live``, progress bar) and writes checkpoints (full, unsharded tensors); every rank resumes from
    them. Returns the trained model as a plain module with full weights (under FSDP2: None on ranks
    other than 0).

    ``ctx``: the session the stage entered once (``launch.stage_session``), checked against
    ``train_cfg.device`` and ``train_cfg.deterministic``; without one, the trainer opens a session of its
    own for this call (``distributed.process_session``: determinism, then the process group).
    """
    runtime = runtime or RuntimeParams()
    micro = distributed.check_layout(train_cfg.batch_size, runtime, distributed.env_world()[1])
    seed_everything(seed)
    with distributed.joined(ctx, train_cfg.device, train_cfg.deterministic) as ctx:
        return _train(spec, train_ds, input_cfg, train_cfg, runtime, seed=seed, ckpt_dir=ckpt_dir, live=live,
                      progress=progress, init=init, ctx=ctx, micro=micro, on_step=on_step)


def _train(spec, train_ds, input_cfg, train_cfg, runtime, *, seed, ckpt_dir, live, progress, init, ctx, micro,
           on_step):
    device = ctx.device
    model = spec.build()
    if init is not None:
        model = init(model) or model
    par = distributed.Parallel(model.to(device), ctx, runtime.parallel)
    model = par.core
    optimizer = build_optimizer(model, train_cfg)
    scheduler = build_scheduler(optimizer, train_cfg)
    fp_parts = [asdict(spec), input_cfg.model_dump(), train_cfg.model_dump(), seed,
                train_ds._fingerprint, code_fingerprint()]
    if init is not None:
        fp_parts.append(repr(init))
    fp = fingerprint(*fp_parts)
    start = 0
    curves = Curves(live)  # what `live` gets, kept in every checkpoint (a resume logs it again)
    meta = distributed.broadcast_object(ctx, read_checkpoint_meta(ckpt_dir) if ctx.is_main else None)
    if meta is not None and meta.get("fingerprint") == fp:
        if not ctx.is_main and checkpoint_step(ckpt_dir) != meta["step"]:
            raise distributed.missing_checkpoint(ckpt_dir, ctx)
        model_obj, optim_obj = par.resume_objects(optimizer)
        load_checkpoint(ckpt_dir, model=model_obj, optimizer=optim_obj, scheduler=scheduler, meta=meta)
        start = meta["step"]
        curves.replay(meta["extra"]["curves"])
        if ctx.is_main:
            print(f"resuming from {ckpt_dir} at step {start}/{train_cfg.steps}")
    elif meta is not None and ctx.is_main:
        print(f"ignoring checkpoint in {ckpt_dir}: it belongs to another configuration")
    saved = start  # the step of this configuration's last checkpoint in ckpt_dir (0: none)

    # With mixup / CutMix each rank also loads the `halo` examples before its slice (their partners), so
    # that mixing partners (and so the result) are those of one process with the whole batch
    # (HaloBatchSampler; the partner is `repeated_aug` places back, never a copy of the same image).
    mixing = input_cfg.mixup > 0 or input_cfg.cutmix > 0
    sampler = (HaloBatchSampler if mixing else StepBatchSampler)(
        len(train_ds), train_cfg.batch_size, seed=seed, start_step=start, total_steps=train_cfg.steps,
        rank=ctx.rank, world_size=ctx.world_size, repeats=input_cfg.repeated_aug)
    halo = sampler.halo if mixing else 0
    loader = train_batches(train_ds, input_cfg.model_dump(), sampler, runtime.workers, spec.num_classes)  # uint8, host
    loss_step = LossStep(par.forward, LOSSES[train_cfg.loss], device, compile=runtime.compile,
                         cudagraphs=runtime.cudagraphs)
    if loss_step.cudagraphs and par.fsdp:  # pytorch/pytorch#127225: FSDP2's hooks free and re-gather parameters
        raise UserError("runtime.cudagraphs does not work with runtime.parallel: fsdp (FSDP2 frees and re-gathers "
                        "the parameters around every block); set runtime.cudagraphs: false or runtime.parallel: ddp")
    params = [p for p in model.parameters() if p.requires_grad]
    accum = runtime.accum_steps
    kill_at = int(os.environ.get(KILL_AT_STEP_ENV, "0"))

    bar = tqdm(total=train_cfg.steps, initial=start, desc=f"train {spec.arch} {spec.stem} s{seed}",
               unit="step", disable=not (progress and ctx.is_main), dynamic_ncols=True)
    step = start
    for images, labels in loader:
        model.train()
        images = unit_range(images.to(device, non_blocking=True))
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)  # set to None, not zeroed: with CUDA graphs .grad lives in the pool
        loss_step.begin_step(params)  # one CUDA-graph step for all `accum` micro-batches (training/step.py)
        loss_sum = None
        for k in range(accum):
            lo = k * micro
            if halo:  # [halo examples before the micro-batch] + micro-batch; mixup rolls by halo, drop them
                x = images[lo : lo + micro + halo]
                t = targets_of(labels[lo : lo + micro + halo], spec.num_classes, train_cfg.label_smoothing)
                x, t = mixup(x, t, input_cfg.mixup, seed, step, cutmix=input_cfg.cutmix,
                             switch_prob=input_cfg.mix_switch_prob, shift=halo)
                x, t = x[halo:], t[halo:]
            else:
                x = images[lo : lo + micro]
                t = targets_of(labels[lo : lo + micro], spec.num_classes, train_cfg.label_smoothing)
            # Dropout / stochastic-depth masks: a function of (seed, step, global micro-batch index), so
            # resuming is exact on every rank, and layouts with the same micro-batch size agree.
            reseed(device, _mix(seed, step, ctx.rank * accum + k))
            with contextlib.nullcontext() if k == accum - 1 else par.no_sync():
                loss = loss_step(x, t)
                (loss / accum if accum > 1 else loss).backward()  # mean over the global batch
            loss = loss_step.kept(loss)
            loss_sum = loss if loss_sum is None else loss_sum + loss
        log_now = (step + 1) % runtime.log_every == 0 or step + 1 == train_cfg.steps
        layer_norms = grad_norms_by_layer(model) if log_now else None
        if train_cfg.grad_clip > 0:
            gnorm = torch.nn.utils.clip_grad_norm_(params, train_cfg.grad_clip)
        elif log_now:
            gnorm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        step += 1
        ckpt_now = step % runtime.ckpt_every == 0 or step == train_cfg.steps
        if log_now or ckpt_now:  # the only host syncs of the loop
            loss_value = distributed.mean_over_ranks(ctx, loss_sum / accum if accum > 1 else loss_sum).item()
            if not math.isfinite(loss_value):
                kept = (f"last good checkpoint (step {saved}) kept in {ckpt_dir}" if saved else
                        f"no checkpoint of this run was written before it (runtime.ckpt_every: {runtime.ckpt_every})")
                raise TrainingDiverged(f"loss is {loss_value} at step {step}; {kept}. "
                                       "Lower train.lr or enable train.grad_clip")
        if log_now:
            gnorm_value = float(distributed.local_tensor(gnorm))
            if ctx.is_main:
                bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.2e}")
                curves.log(step, {"train/loss": loss_value, "train/lr": lr, "train/grad_norm": gnorm_value,
                                  **{f"grad_norm/{name}": v for name, v in layer_norms.items()}})
        if ckpt_now:
            model_obj, optim_obj = par.checkpoint_objects(optimizer)  # a collective under FSDP2
            if ctx.is_main:
                save_checkpoint(ckpt_dir, model=model_obj, optimizer=optim_obj, scheduler=scheduler, step=step,
                                fingerprint=fp, extra={"curves": curves.history})
            saved = step
            distributed.barrier(ctx)
            if step == kill_at and ctx.is_main:
                os.kill(os.getpid(), signal.SIGKILL)
        bar.update(1)
        if on_step is not None:
            on_step(step)
    bar.close()
    return par.full_model(spec)
