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


def targets_of(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """Float targets of a batch: class ids (B,) one-hot, or multi-hot label sets (B, K) as they are;
    smoothing mixes either with the uniform ``1/K`` in the same way."""
    if labels.dim() == 1:
        return one_hot_targets(labels, num_classes, smoothing)
    if labels.shape[-1] != num_classes:
        raise ValueError(f"multi-hot targets have {labels.shape[-1]} classes, the model {num_classes}")
    return labels.float() * (1.0 - smoothing) + smoothing / num_classes


def mixup(images: torch.Tensor, targets: torch.Tensor, alpha: float, seed: int, step: int, *,
          cutmix: float = 0.0, switch_prob: float = 0.5, shift: int = 1):
    """Mix each example with the one ``shift`` places before it (the batch rolled by ``shift``: big_vision
    rolls by one; with repeated augmentation the trainer rolls by the repeat count, see
    :class:`dpnrepro.data.loader.HaloBatchSampler`), one draw per batch.

    big_vision's mixup (``alpha`` > 0): pixels and targets blended with a ratio from Beta(alpha, alpha).
    DeiT's CutMix (``cutmix`` > 0, timm's "batch" mode): a box of area fraction 1 − λ, λ ~ Beta(cutmix,
    cutmix), is pasted from the partner and the targets are mixed by the exact pasted area. With both
    on, each batch uses CutMix with probability ``switch_prob``, as DeiT does. Every draw depends only
    on (seed, step), so a resumed run mixes exactly as an uninterrupted one.
    """
    if alpha <= 0 and cutmix <= 0:
        return images, targets
    rng = np.random.default_rng([seed, step])
    partners, partner_targets = images.roll(shift, 0), targets.roll(shift, 0)
    use_cutmix = cutmix > 0 and (alpha <= 0 or rng.random() < switch_prob)
    if not use_cutmix:
        lam = float(rng.beta(alpha, alpha))
        return lam * images + (1 - lam) * partners, lam * targets + (1 - lam) * partner_targets
    lam = float(rng.beta(cutmix, cutmix))
    h, w = images.shape[-2:]
    cut_h, cut_w = int(h * np.sqrt(1 - lam)), int(w * np.sqrt(1 - lam))
    cy, cx = int(rng.integers(h)), int(rng.integers(w))
    y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, h)
    x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, w)
    mixed = images.clone()
    mixed[..., y0:y1, x0:x1] = partners[..., y0:y1, x0:x1]
    lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)  # the area actually kept
    return mixed, lam * targets + (1 - lam) * partner_targets
