"""Optimizers and learning-rate schedules, with big_vision's semantics translated to PyTorch."""

from __future__ import annotations

import math

import torch
from torch import nn

NO_DECAY_NAMES = ("pos_embed", "cls_token", "reg_token")


def decay_mask(model, no_decay: tuple[str, ...] = NO_DECAY_NAMES) -> dict[str, bool]:
    """True for weights that big_vision decays: its default ``wd_mults`` is ``.*/kernel$``.

    In PyTorch terms: the weight matrices of Linear/Conv layers (ndim >= 2), not biases, norm scales,
    or the embedding tables named in ``no_decay`` (position embeddings, class token). ``model``: a module
    or its ``(name, parameter)`` pairs.
    """
    named = model.named_parameters() if isinstance(model, nn.Module) else model
    return {name: p.ndim >= 2 and not any(k in name for k in no_decay) for name, p in named}


def build_optimizer(model: nn.Module, cfg, *, fused: bool = True,
                    no_decay: tuple[str, ...] = NO_DECAY_NAMES) -> torch.optim.Optimizer:
    """Adam / AdamW / momentum SGD for the TrainParams ``cfg``.

    ``adam`` is big_vision's ``scale_by_adam`` + ``wd`` (appendix C). big_vision chains
    ``adam → scale(lr) → add_decayed_weights(wd) → scale_by_schedule → scale(-1)``, so one step is
    ``p -= s(t) * (lr * adam_dir + wd * p)``: decay is decoupled and follows the schedule multiplier
    s(t) but is NOT multiplied by the base lr. torch.optim.AdamW applies ``p -= lr_t * λ * p`` with
    ``lr_t = lr * s(t)``, so λ = wd / lr reproduces it exactly.

    ``adamw`` is DeiT's (λ multiplies the lr, PyTorch convention). ``sgd_momentum`` is big_vision's
    ``momentum_hp`` (momentum 0.9, decay off unless weight_decay > 0) used for fine-tuning (appendix D).

    Adam/AdamW run torch's fused kernel on every device (one kernel per parameter group). On the CPU its
    arithmetic is ATen's vectorized code (IEEE multiply, add, divide, square root), the same on every x86
    CPU under the AVX2 pin; torch's single-tensor and for-each CPU paths take the square root of the
    second moment from MKL's vector math (VML), which is not correctly rounded and follows MKL's
    CPU-dependent code branch, so their bits differ between Intel and AMD (docs/determinism.md). SGD
    (multiply-adds only) is fused where the parameters are on CUDA. ``fused=False``: torch's default path
    instead (the benchmarks' compiled-optimizer contender).

    Only parameters with ``requires_grad`` are optimized (LiT's locked image tower is not);
    ``no_decay``: see :func:`decay_mask` (LiT's text tower names its own embedding tables).
    """
    mask = decay_mask(model, no_decay)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and mask[n]]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and not mask[n]]
    if cfg.optimizer == "adam":
        wd = cfg.weight_decay / cfg.lr
    else:
        wd = cfg.weight_decay
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optimizer in ("adam", "adamw"):
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, fused=fused or None)
    on_cuda = all(p.is_cuda for g in groups for p in g["params"])
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=0.9, fused=(fused and on_cuda) or None)


def schedule_multiplier(step: int, *, total: int, warmup: int, kind: str) -> float:
    """big_vision's ``create_learning_rate_schedule``: linear warm-up from 0, then cosine/linear to 0."""
    if warmup and step < warmup:
        return step / warmup
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: schedule_multiplier(step, total=cfg.steps, warmup=cfg.warmup_steps, kind=cfg.schedule),
    )
