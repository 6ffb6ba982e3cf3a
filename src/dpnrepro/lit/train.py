"""Training the text tower against a locked image tower (big_vision's contrastive trainer, LiT config).

Per step: a batch of (image embedding, caption tokens) pairs; the text tower embeds the captions; the
loss is the symmetric softmax cross-entropy of ``t * zimg @ ztxt.T`` (open_clip's ClipLoss); the text
tower and ``log t`` are updated with Adam + big_vision's decoupled weight decay on kernels only
(``p -= s(t) * (lr * adam + wd * p)``, as ``training/optim.py`` explains: torch AdamW with
``weight_decay = wd / lr``), global-norm clipping and linear warm-up + cosine. The image tower is never
given to the optimizer and never sees a gradient.

The image embeddings are computed once per tower (:func:`embed_images`): the tower is locked and LiT's
images here get no augmentation, so each image's embedding is a constant, and computing it once is
exactly what a forward pass per step would give (LiT's own "precompute the image embeddings"
shortcut). Batches are a function of (seed, step) (the project's ``StepBatchSampler``).

**N processes** (``runtime.devices``, launched like every training stage: training/launch.py): each
rank embeds its contiguous shard of the global batch (``lit.train.batch_size`` is the global batch) and
open_clip's ``ClipLoss(local_loss=False, gather_with_grad=True)`` contrasts over the gathered global
batch, so the loss is the one of one process with the whole batch. Every rank backpropagates that
same loss, so the gathered embeddings' gradient reaches each shard W times (the all-gather's backward
sums over ranks); the text-tower gradients are then averaged over ranks (one flat all-reduce, what
DDP does), which gives exactly the one-process gradient up to float summation order, and so does the
temperature's. Every rank applies the same update: the replicas stay bitwise equal.

**Memory plan** (``lit.runtime.chunk_size``, GradCache, Gao et al. 2021): the activations of the text
tower grow with the batch, the loss only needs its embeddings. With a chunk size smaller than the
local shard, the shard is embedded chunk by chunk without autograd, the loss and d loss / d embedding
are computed on the full (gathered) batch, then each chunk is re-embedded with autograd and
backpropagated with its slice of that cached gradient. Peak activation memory is one chunk's; the
cost is one more text-tower forward per step. Chunking changes the result only by float rounding
(parameter gradients are summed over chunks), so it is an execution setting, not tracked by DVC.
Activation memory per caption, measured (saved-tensor bytes of open_clip's TextTransformer, 16
tokens; ``python -m dpnrepro.lit.memory``): see docs/lit.md, *LiT on N devices*.
"""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dpnrepro.lit.towers import TEXT_NO_DECAY, LiT, contrastive_loss, l2_normalize
from dpnrepro.training.step import unit_range


@torch.no_grad()
def embed_images(tower, images, transform, *, batch_size: int, device: torch.device, desc: str = "embed",
                 progress: bool = True) -> torch.Tensor:
    """(N, D) L2-normalised float32 embeddings of a sequence of PIL images by a locked tower. ``transform``:
    one image to a float tensor, or to a uint8 one that is scaled here a batch at a time (:func:`unit_range`,
    the same floats; :func:`dpnrepro.lit.run.load_tower`'s)."""
    tower.to(device)
    out = []
    for lo in tqdm(range(0, len(images), batch_size), desc=desc, unit="batch", disable=not progress, leave=False):
        x = unit_range(torch.stack([transform(im) for im in images[lo:lo + batch_size]]).to(device))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            z = tower(x)
        out.append(l2_normalize(z.float()).cpu())
    return torch.cat(out)


class TextState:
    """The trainable part of a LiT model (text tower + ``log_temperature``) as checkpoint.py saves and
    restores a model: the locked image tower is not written into every checkpoint."""

    def __init__(self, lit: LiT):
        self.lit = lit

    def state_dict(self) -> dict:
        return {k: v for k, v in self.lit.state_dict().items() if not k.startswith("image.")}

    def load_state_dict(self, state: dict) -> None:
        self.lit.load_state_dict(state, strict=False)


def _sync_gradients(params: list[torch.Tensor], ctx) -> None:
    """Average the gradients over ranks in one flat all-reduce (gloo has no AVG: sum, then divide)."""
    import torch.distributed as dist

    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= ctx.world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def text_step(lit: LiT, zimg: torch.Tensor, tokens: torch.Tensor, loss_fn, *, chunk_size: int = 0,
              use_bf16: bool = False) -> torch.Tensor:
    """Forward + backward of one step on this rank's shard (``zimg``, ``tokens``); returns the loss (the
    global batch's, detached). ``chunk_size`` 0 or >= the shard: one pass; else GradCache chunks."""
    device = zimg.device

    def encode(t: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            return lit.encode_text(t.to(device, non_blocking=True))

    if not chunk_size or chunk_size >= len(tokens):
        loss = loss_fn(zimg, encode(tokens).float(), lit.temperature)
        loss.backward()
        return loss.detach()
    chunks = list(torch.split(tokens, chunk_size))
    with torch.no_grad():
        cached = torch.cat([encode(c).float() for c in chunks]).requires_grad_(True)
    loss = loss_fn(zimg, cached, lit.temperature)
    loss.backward()  # d loss / d embeddings (and the temperature's gradient) on the whole batch
    for c, g in zip(chunks, torch.split(cached.grad, chunk_size)):
        encode(c).float().backward(g)  # re-embed with autograd; parameter gradients accumulate
    return loss.detach()


def lit_loss(ctx):
    """open_clip's ClipLoss over the global batch (every rank's shard gathered, with gradients)."""
    import warnings

    from open_clip.loss import ClipLoss

    if ctx is None or not ctx.distributed:
        return contrastive_loss
    # open_clip 3.3 gathers with torch.distributed.nn.all_gather (deprecated in torch 2.9, still exact)
    warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional\.all_gather is deprecated",
                            category=FutureWarning)
    return ClipLoss(local_loss=False, gather_with_grad=True, rank=ctx.rank, world_size=ctx.world_size)


def train_text_tower(lit: LiT, image_emb: torch.Tensor, tokens: torch.Tensor, cfg, *, seed: int,
                     device: torch.device, progress: bool = True, desc: str = "lit", ctx=None,
                     chunk_size: int = 0, ckpt_dir: str | Path | None = None, fingerprint: str = "",
                     ckpt_every: int = 0, log_every: int = 0, live=None) -> dict:
    """Train ``lit``'s text tower and temperature for ``cfg.steps`` steps; returns a loss summary.

    ``ctx`` (a DistContext) with more than one process: this rank embeds its shard of every global
    batch (module docstring). ``ckpt_dir``: a checkpoint every ``ckpt_every`` steps and at the end
    (rank 0 writes); one with the same ``fingerprint`` is resumed, bit-identically on CPU. ``live``
    (rank 0): dvclive curves of loss, lr and temperature every ``log_every`` steps.
    """
    from dpnrepro.data.loader import StepBatchSampler
    from dpnrepro.training import distributed
    from dpnrepro.training.checkpoint import checkpoint_step, load_checkpoint, read_checkpoint_meta, save_checkpoint
    from dpnrepro.training.history import Curves
    from dpnrepro.training.optim import build_optimizer, schedule_multiplier
    from dpnrepro.training.trainer import KILL_AT_STEP_ENV

    ctx = ctx or distributed.DistContext(device=device)
    if cfg.batch_size % ctx.world_size:
        from dpnrepro.errors import UserError

        raise UserError(f"lit.train.batch_size ({cfg.batch_size}) is not divisible by the {ctx.world_size} "
                        "processes (runtime.devices)")
    lit.to(device).train()
    # requires_grad only, so the locked image tower is left out
    optimizer = build_optimizer(lit, cfg, no_decay=TEXT_NO_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: schedule_multiplier(
        s, total=cfg.steps, warmup=cfg.warmup_steps, kind=cfg.schedule))
    curves = Curves(live)  # the dvclive curves, kept in every checkpoint (a resume logs them again)
    history = {"loss": [], "log": curves.history}
    start = 0
    if ckpt_dir is not None:
        meta = distributed.broadcast_object(ctx, read_checkpoint_meta(ckpt_dir) if ctx.is_main else None)
        if meta is not None and meta.get("fingerprint") == fingerprint:
            if not ctx.is_main and checkpoint_step(ckpt_dir) != meta["step"]:
                raise distributed.missing_checkpoint(ckpt_dir, ctx)
            load_checkpoint(ckpt_dir, model=TextState(lit), optimizer=optimizer, scheduler=scheduler, meta=meta)
            start, history["loss"] = meta["step"], meta["extra"]["history"]["loss"]
            curves.replay(meta["extra"]["history"]["log"])  # the curves up to the resumed step
            if ctx.is_main:
                print(f"resuming {desc} from {ckpt_dir} at step {start}/{cfg.steps}")
    # this rank's contiguous shard of each global batch (the sampler reads only those positions)
    sampler = StepBatchSampler(len(tokens), cfg.batch_size, seed=seed, start_step=0, total_steps=cfg.steps,
                               rank=ctx.rank, world_size=ctx.world_size)
    params = [p for _, p in lit.trainable_named_parameters()]
    loss_fn = lit_loss(ctx)
    kill_at = int(os.environ.get(KILL_AT_STEP_ENV, "0"))
    losses = []
    for step in tqdm(range(start, cfg.steps), desc=desc, unit="step", disable=not (progress and ctx.is_main),
                     leave=False, initial=start, total=cfg.steps):
        idx = torch.tensor([i for i, _ in sampler.batch_for_step(step)])
        zimg = image_emb[idx].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = text_step(lit, zimg, tokens[idx], loss_fn, chunk_size=chunk_size, use_bf16=device.type == "cuda")
        if ctx.distributed:
            _sync_gradients(params, ctx)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        losses.append(loss)
        done = step + 1
        log_now = bool(log_every) and (done % log_every == 0 or done == cfg.steps)
        ckpt_now = ckpt_dir is not None and ((ckpt_every and done % ckpt_every == 0) or done == cfg.steps)
        if log_now or ckpt_now:  # the loop's only host syncs
            history["loss"] += torch.stack(losses).tolist()
            losses = []
        if log_now:
            curves.log(done, {"train/loss": history["loss"][-1], "train/lr": lr,
                              "train/temperature": float(lit.temperature.detach())})
        if ckpt_now:
            if ctx.is_main:
                save_checkpoint(ckpt_dir, model=TextState(lit), optimizer=optimizer, scheduler=scheduler, step=done,
                                fingerprint=fingerprint, extra={"history": history})
            distributed.barrier(ctx)
            if done == kill_at and ctx.is_main:  # test hook: a crash right after a complete checkpoint
                os.kill(os.getpid(), signal.SIGKILL)
    history["loss"] += torch.stack(losses).tolist() if losses else []
    return summarize(history["loss"], lit, desc)


def summarize(losses: list[float], lit: LiT, desc: str) -> dict:
    """Mean loss of the first and last tenth of the steps and the final temperature (non-finite: error)."""
    if not all(math.isfinite(v) for v in losses):
        from dpnrepro.errors import UserError

        raise UserError(f"LiT loss became non-finite ({desc}); lower lit.train.lr or enable lit.train.grad_clip")
    k = max(1, len(losses) // 10)
    return {"loss_first": sum(losses[:k]) / k, "loss_last": sum(losses[-k:]) / k,
            "temperature": float(lit.temperature.detach())}
