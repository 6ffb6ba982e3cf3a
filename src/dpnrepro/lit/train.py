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
"""

from __future__ import annotations

import math

import torch
from tqdm.auto import tqdm

from dpnrepro.lit.towers import LiT, contrastive_loss, decay_mask, l2_normalize


@torch.no_grad()
def embed_images(tower, images, transform, *, batch_size: int, device: torch.device, desc: str = "embed",
                 progress: bool = True) -> torch.Tensor:
    """(N, D) L2-normalised float32 embeddings of a sequence of PIL images by a locked tower."""
    tower.to(device)
    out = []
    for lo in tqdm(range(0, len(images), batch_size), desc=desc, unit="batch", disable=not progress, leave=False):
        x = torch.stack([transform(im) for im in images[lo:lo + batch_size]]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            z = tower(x)
        out.append(l2_normalize(z.float()).cpu())
    return torch.cat(out)


def build_optimizer(lit: LiT, cfg) -> torch.optim.Optimizer:
    """Adam with big_vision's decoupled weight decay on the kernels of the trainable parameters only."""
    named = lit.trainable_named_parameters()
    mask = decay_mask(named)
    groups = [{"params": [p for n, p in named if mask[n]], "weight_decay": cfg.weight_decay / cfg.lr},
              {"params": [p for n, p in named if not mask[n]], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, fused=True)


def train_text_tower(lit: LiT, image_emb: torch.Tensor, tokens: torch.Tensor, cfg, *, seed: int,
                     device: torch.device, progress: bool = True, desc: str = "lit") -> dict:
    """Train ``lit``'s text tower and temperature for ``cfg.steps`` steps; returns a loss summary."""
    from dpnrepro.data.loader import StepBatchSampler
    from dpnrepro.training.optim import schedule_multiplier

    lit.to(device).train()
    optimizer = build_optimizer(lit, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: schedule_multiplier(
        s, total=cfg.steps, warmup=cfg.warmup_steps, kind=cfg.schedule))
    sampler = StepBatchSampler(len(tokens), cfg.batch_size, seed=seed, start_step=0, total_steps=cfg.steps)
    params = [p for _, p in lit.trainable_named_parameters()]
    use_bf16 = device.type == "cuda"
    losses = []
    for step in tqdm(range(cfg.steps), desc=desc, unit="step", disable=not progress, leave=False):
        idx = torch.tensor([i for i, _ in sampler.batch_for_step(step)])
        zimg = image_emb[idx].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            ztxt = lit.encode_text(tokens[idx].to(device, non_blocking=True))
        loss = contrastive_loss(zimg, ztxt.float(), lit.temperature)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.detach())
    losses = torch.stack(losses).tolist()
    if not all(math.isfinite(v) for v in losses):
        from dpnrepro.errors import UserError

        raise UserError(f"LiT loss became non-finite ({desc}); lower lit.train.lr or enable lit.train.grad_clip")
    k = max(1, len(losses) // 10)
    return {"loss_first": sum(losses[:k]) / k, "loss_last": sum(losses[-k:]) / k,
            "temperature": float(lit.temperature.detach())}
