"""Classification losses as big_vision defines them."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def sigmoid_xent(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """big_vision ``sigmoid_xent``: per-class binary cross-entropy summed over classes, mean over batch."""
    return F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1).mean()


def softmax_xent(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against (possibly soft) target distributions, mean over batch."""
    return -(targets * F.log_softmax(logits, dim=-1)).sum(-1).mean()


LOSSES = {"sigmoid_xent": sigmoid_xent, "softmax_xent": softmax_xent}


def one_hot_targets(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """One-hot (optionally label-smoothed) float targets."""
    off = smoothing / num_classes
    return torch.full((labels.shape[0], num_classes), off, device=labels.device).scatter_(
        1, labels.unsqueeze(1), 1.0 - smoothing + off
    )


def mixup(images: torch.Tensor, targets: torch.Tensor, alpha: float, seed: int, step: int):
    """big_vision-style mixup: mix each example with its neighbour (batch rolled by one), with one
    ratio per batch drawn from Beta(alpha, alpha). The ratio depends only on (seed, step), so a
    resumed run draws the same ratios as an uninterrupted one."""
    if alpha <= 0:
        return images, targets
    lam = float(np.random.default_rng([seed, step]).beta(alpha, alpha))
    return lam * images + (1 - lam) * images.roll(1, 0), lam * targets + (1 - lam) * targets.roll(1, 0)
