"""What a LiT run (Table 4) costs: analytic FLOPs per example (the project's convention,
benchmarks/flops.py: a multiply-add is 2 FLOPs, matrix products only; :mod:`dpnrepro.cost.gpu_hours` turns
them into GPU-hours).

Per example and step: the locked image tower's forward (no backward: it is frozen, no gradient flows
into it) plus the text tower's forward + backward (3 x forward). Text tower per token and layer: QKV
``2·D·3D``, attention ``2·2·T·D``, output projection ``2·D²``, MLP ``2·2·D·4D``; then the EOT token's
projection ``2·D·E``. The loss (a B x B logit matrix) adds ``2·E·B`` per example and is counted.
"""

from __future__ import annotations


def text_forward_flops(*, width: int, layers: int, context_length: int, embed_dim: int) -> int:
    d, t = width, context_length
    per_token_layer = 2 * d * 3 * d + 2 * 2 * t * d + 2 * d * d + 2 * 2 * d * 4 * d
    return layers * t * per_token_layer + 2 * d * embed_dim


def lit_flops_per_example(arch: str, *, width: int, layers: int, context_length: int, batch_size: int,
                          img_size: int = 224, rep_size: int | None = None) -> dict:
    """{'image_forward', 'text_train', 'loss', 'total'} FLOPs of one example of one LiT step."""
    from dpnrepro.benchmarks.flops import TRAIN_FLOPS_MULTIPLIER, vit_forward_flops
    from dpnrepro.model_spec import parse_arch

    spec, _ = parse_arch(arch.replace("-", "/"))
    rep = spec.width if rep_size is None else rep_size  # big_vision pre_logits (rep_size=True) = width
    image = vit_forward_flops(arch.replace("-", "/"), img_size=img_size, num_classes=0, rep_size=rep).total
    text = TRAIN_FLOPS_MULTIPLIER * text_forward_flops(width=width, layers=layers, context_length=context_length,
                                                       embed_dim=rep)
    loss = TRAIN_FLOPS_MULTIPLIER * 2 * rep * batch_size
    return {"image_forward": image, "text_train": text, "loss": loss, "total": image + text + loss}
