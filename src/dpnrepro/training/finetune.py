"""Initialise a fine-tuning model from a pre-trained run, as big_vision's transfer configs do.

big_vision fine-tuning (``configs/transfer.py``) restores every pre-trained parameter except
``head/kernel`` and ``head/bias`` (``model_load.dont_load``), which keep the fresh model's init, and
resamples the learned position embeddings when the patch grid changed (``vit.load`` ->
``resample_posemb``, high-resolution fine-tuning, paper appendix D). The same here, for our
timm-based ViT: ``pos_embed`` is resized with :func:`dpnrepro.models.posemb.resample_posemb`,
``head.weight`` / ``head.bias`` are re-initialised to the model's own head init (zero weight, bias
``head_bias_init``) and everything else, the pre-logits layer included, is copied unchanged.
Fixed sin-cos position embeddings (``posemb="sincos2d"``) are not resampled but recomputed for the
new grid (the fresh model's own), as big_vision computes them on the fly.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import torch

from dpnrepro.errors import CheckpointError
from dpnrepro.artifacts import MODEL_FILE, ModelSpec, read_spec, read_weights, state_mismatch

HEAD_KEYS = ("head.weight", "head.bias")
POSEMB_KEY = "pos_embed"

__all__ = ["HEAD_KEYS", "POSEMB_KEY", "init_from_pretrained", "finetune_model_from_run", "pretrained_init"]


def _grid_of(model: torch.nn.Module) -> tuple[int, int]:
    grid = getattr(getattr(model, "patch_embed", None), "grid_size", None)
    if grid is None:
        raise CheckpointError(f"{type(model).__name__} has no patch_embed.grid_size; cannot resize position embeddings")
    return int(grid[0]), int(grid[1])


@torch.no_grad()
def _reinit_head(model: torch.nn.Module) -> None:
    """The model's own fresh head init (VisionTransformerDPN: zero weight, ``head_bias_init`` bias)."""
    head = getattr(model, "head", None)
    if not isinstance(head, torch.nn.Linear):
        return
    if hasattr(model, "_init_head"):
        model._init_head()
    else:  # a plain module: big_vision's zero-init head
        torch.nn.init.zeros_(head.weight)
        if head.bias is not None:
            torch.nn.init.constant_(head.bias, float(getattr(model, "head_bias_init", 0.0)))


def init_from_pretrained(model: torch.nn.Module, weights_path: str | Path, *,
                         reinit_head: bool = True) -> torch.nn.Module:
    """Load a pre-trained run's safetensors weights into ``model`` for fine-tuning; returns ``model``.

    ``model`` is a freshly built model of the same architecture, stem, placement, pooling and
    pre-logits size, possibly with another ``img_size`` (its ``pos_embed`` is resampled to the new
    patch grid) and, with ``reinit_head`` (the default, as big_vision), another ``num_classes``
    (``head.weight`` / ``head.bias`` are not loaded but re-initialised to the model's own head init).
    A model with fixed ``sincos2d`` position embeddings keeps its own (computed for its grid, as
    big_vision recomputes them). With ``reinit_head=False`` the head is loaded too and must have the
    same shape. Any other missing or unexpected tensor or shape mismatch raises
    :class:`CheckpointError` (one line).
    """
    path = Path(weights_path)
    state = read_weights(path)
    own = model.state_dict()
    skip = set(HEAD_KEYS) if reinit_head else set()
    # Fixed sin-cos position embeddings (posemb="sincos2d") are a function of the grid, not learned:
    # big_vision recomputes them for the new grid, so the model's own are kept.
    fixed_posemb = getattr(model, "posemb", "learn") == "sincos2d" and POSEMB_KEY in own
    if fixed_posemb:
        skip.add(POSEMB_KEY)
    detail = state_mismatch(own, state, skip=skip, any_shape=(POSEMB_KEY,))
    if detail:
        raise CheckpointError(
            f"pretrained weights {path} do not match the fine-tuning model ({detail}); "
            "fine-tuning needs the same arch/stem/placement/pool/rep_size (only img_size and the head may change)"
        )

    new_state = {k: v for k, v in state.items() if k not in skip}
    if POSEMB_KEY in new_state and new_state[POSEMB_KEY].shape != own[POSEMB_KEY].shape:
        from dpnrepro.models.posemb import resample_posemb, square_grid

        old_pe, new_pe = new_state[POSEMB_KEY], own[POSEMB_KEY]
        if old_pe.ndim != 3 or old_pe.shape[0] != 1 or old_pe.shape[-1] != new_pe.shape[-1]:
            raise CheckpointError(
                f"pretrained weights {path}: pos_embed shape {tuple(old_pe.shape)} cannot be resampled to "
                f"{tuple(new_pe.shape)} (not a (1, tokens, width) grid of the same width); check the arch")
        try:
            old_grid = square_grid(old_pe.shape[1])
        except ValueError as exc:
            raise CheckpointError(f"pretrained weights {path}: {exc}") from exc
        new_grid = _grid_of(model)
        if new_grid[0] * new_grid[1] != new_pe.shape[1]:
            raise CheckpointError(
                f"model grid {new_grid} does not match its pos_embed of {new_pe.shape[1]} tokens; "
                "fine-tuning supports position embeddings on the patch tokens only (no_embed_class)")
        new_state[POSEMB_KEY] = resample_posemb(old_pe, new_grid, old_grid=old_grid)

    model.load_state_dict(new_state, strict=not skip)
    if reinit_head:
        _reinit_head(model)
    return model


def finetune_model_from_run(run_dir: str | Path, *, reinit_head: bool = True, **spec_overrides):
    """Build a fine-tuning model from a run directory; returns ``(model, spec)``.

    The run's ``model_spec.json`` with ``spec_overrides`` applied (e.g. ``img_size=42``,
    ``num_classes=37``, ``head_bias_init=0.0``, ``drop_path_rate=0.1``) is built, then initialised from
    the run's ``model.safetensors`` with :func:`init_from_pretrained`.
    """
    run_dir = Path(run_dir)
    spec: ModelSpec = read_spec(run_dir)
    unknown = sorted(set(spec_overrides) - set(asdict(spec)))
    if unknown:
        raise ValueError(f"unknown model spec field(s) {unknown}; expected some of {sorted(asdict(spec))}")
    spec = replace(spec, **spec_overrides)
    model = init_from_pretrained(spec.build(), run_dir / MODEL_FILE, reinit_head=reinit_head)
    return model, spec


class pretrained_init:
    """Initialise a fine-tuning model from a pretrained run directory (positions resized, head
    re-initialised): the trainer's ``init``. A class rather than a closure so that its ``repr`` (a hash
    of the pretrained weights) joins the run fingerprint."""

    def __init__(self, pretrained_run: str | Path):
        self.weights = Path(pretrained_run) / MODEL_FILE
        if not self.weights.exists():
            raise CheckpointError(f"fine-tuning needs the pretrained run {pretrained_run}; run its train stage first")

    def __call__(self, model):
        return init_from_pretrained(model, self.weights)

    def __repr__(self) -> str:
        import hashlib

        return f"pretrained:{hashlib.sha256(self.weights.read_bytes()).hexdigest()[:16]}"
