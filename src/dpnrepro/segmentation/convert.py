"""A pretraining checkpoint of ours (safetensors, ``runs/<sweep>/<run>/``) -> backbone state dict.

What transfers: every encoder tensor. What does not: the classification ``head`` and the
``pre_logits`` layer (the segmentation model has a decode head instead). The learned position
embeddings are resized from the pretraining grid to the backbone's (appendix G: 512 / 16 = 32 x 32)
with :func:`dpnrepro.models.posemb.resample_posemb` (bilinear, corner-aligned, as big_vision's
``resample_posemb``); fixed sin-cos tables are the backbone's own. Keys come out in the backbone's
namespace (``vit.<timm key>``), so ``backbone.load_state_dict`` takes them strictly.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dpnrepro.artifacts import MODEL_FILE, read_spec, read_weights, state_mismatch
from dpnrepro.errors import CheckpointError

PREFIX = "vit."
CLASSIFIER_ONLY = ("head.", "pre_logits.")
POSEMB_KEY = "pos_embed"


def _weights_path(source: str | Path) -> Path:
    source = Path(source)
    return source / MODEL_FILE if source.is_dir() else source


def backbone_state_from_run(source: str | Path, backbone: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict ``backbone`` (a :class:`DPNVisionTransformer`) loads from a pretraining run.

    ``source`` is a run directory or its ``model.safetensors``. When the run directory has a
    ``model_spec.json`` its stem and placement must be the backbone's (a clear error otherwise);
    any other architectural difference shows up as a missing/unexpected key or a shape mismatch.
    """
    path = _weights_path(source)
    vit = backbone.vit
    if path.parent.joinpath("model_spec.json").exists():
        spec = read_spec(path.parent)
        for field, ours in (("stem", vit.stem), ("placement", vit.placement)):
            if getattr(spec, field) != ours:
                raise CheckpointError(f"pretrained run {path.parent} has {field} {getattr(spec, field)!r}, "
                                      f"the segmentation backbone {ours!r}")
    state = {k: v for k, v in read_weights(path).items() if not k.startswith(CLASSIFIER_ONLY)}
    own = vit.state_dict()
    fixed_posemb = vit.posemb == "sincos2d"
    skip = {POSEMB_KEY} if fixed_posemb else set()
    detail = state_mismatch(own, state, skip=skip, any_shape=(POSEMB_KEY,))
    if detail:
        raise CheckpointError(f"pretrained weights {path} do not fit the segmentation backbone {backbone.arch} "
                              f"({detail}); check arch, stem, placement, pool and in_channels")
    if fixed_posemb:
        state[POSEMB_KEY] = own[POSEMB_KEY]
    elif state[POSEMB_KEY].shape != own[POSEMB_KEY].shape:
        from dpnrepro.models.posemb import resample_posemb, square_grid

        try:
            old_grid = square_grid(state[POSEMB_KEY].shape[1])
        except ValueError as exc:
            raise CheckpointError(f"pretrained weights {path}: {exc}") from exc
        state[POSEMB_KEY] = resample_posemb(state[POSEMB_KEY], vit.patch_embed.grid_size, old_grid=old_grid)
    return {PREFIX + k: v for k, v in state.items()}
