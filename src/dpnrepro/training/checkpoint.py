"""Checkpoints without pickles: tensors in safetensors, everything else in JSON, written atomically.

A training checkpoint is a directory with
  ``model.safetensors``      the weights (the only file a user needs for inference),
  ``optimizer.safetensors``  optimizer tensors, flattened as ``state.<param index>.<name>``,
  ``rng.safetensors``        torch CPU/CUDA generator states,
  ``meta.json``              step, config fingerprint, optimizer param-group scalars, scheduler,
                             Python RNG state.
The directory is built under a temporary name and renamed into place, so a kill at any moment leaves
either the previous complete checkpoint or the new complete one.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dpnrepro.errors import CheckpointError
from dpnrepro.io import atomic_dir, write_json_atomic

MODEL_FILE = "model.safetensors"


def save_weights(model: torch.nn.Module, path: str | Path, metadata: dict | None = None) -> None:
    """Save a model's state dict as safetensors (atomically); ``metadata`` goes in the header."""
    path = Path(path)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(state, str(tmp), metadata={k: str(v) for k, v in (metadata or {}).items()})
    tmp.replace(path)


def state_mismatch(own: dict, state: dict, skip=(), any_shape=()) -> str | None:
    """What keeps ``state`` from loading into a model whose state dict is ``own`` (None if nothing):
    missing or unexpected keys, or a shape difference. ``skip`` keys are ignored; ``any_shape`` keys may
    differ in shape (e.g. position embeddings that get resampled)."""
    missing = sorted(k for k in own if k not in state and k not in skip)
    unexpected = sorted(k for k in state if k not in own and k not in skip)
    wrong = sorted(k for k in set(own) & set(state)
                   if k not in skip and k not in any_shape and own[k].shape != state[k].shape)
    if missing:
        return f"missing {missing[:3]}"
    if unexpected:
        return f"unexpected {unexpected[:3]}"
    if wrong:
        return f"shape of {wrong[0]} is {tuple(state[wrong[0]].shape)}, model has {tuple(own[wrong[0]].shape)}"
    return None


def load_weights(model: torch.nn.Module, path: str | Path) -> torch.nn.Module:
    """Load safetensors weights, refusing a checkpoint of another architecture with a clear message."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist; train it first (`dvc repro`) or `dvc pull` it")
    if path.suffix != ".safetensors":
        raise CheckpointError(f"refusing to load {path}: only .safetensors checkpoints are accepted")
    state = load_file(str(path))
    detail = state_mismatch(model.state_dict(), state)
    if detail:
        raise CheckpointError(
            f"checkpoint {path} does not match this architecture ({detail}); "
            "check the arch/stem/placement it was trained with"
        )
    model.load_state_dict(state)
    return model


def _flatten_optimizer(opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for name, val in st.items():
            if torch.is_tensor(val):
                tensors[f"state.{idx}.{name}"] = val.detach().contiguous().cpu()
            else:
                scalars[f"{idx}.{name}"] = val
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _unflatten_optimizer(tensors: dict, meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, val in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = val
    for key, val in meta["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = val
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(ckpt_dir: str | Path, *, model, optimizer, scheduler, step: int, fingerprint: str,
                    extra: dict | None = None) -> None:
    """Write a complete training checkpoint atomically (replacing the previous one)."""
    opt_tensors, opt_meta = _flatten_optimizer(optimizer)
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"torch_cuda_{i}"] = s
    py_state = random.getstate()
    meta = {
        "step": step,
        "fingerprint": fingerprint,
        "optimizer": opt_meta,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "python_rng": [py_state[0], list(py_state[1]), py_state[2]],
        "extra": extra or {},
    }
    with atomic_dir(ckpt_dir) as tmp:
        save_weights(model, tmp / MODEL_FILE)
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        save_file(rng, str(tmp / "rng.safetensors"))
        write_json_atomic(tmp / "meta.json", meta)


def read_checkpoint_meta(ckpt_dir: str | Path) -> dict | None:
    path = Path(ckpt_dir) / "meta.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def load_checkpoint(ckpt_dir: str | Path, *, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer, scheduler and RNG states; returns the checkpoint's meta."""
    ckpt_dir = Path(ckpt_dir)
    meta = read_checkpoint_meta(ckpt_dir)
    if meta is None:
        raise CheckpointError(f"no checkpoint in {ckpt_dir}")
    load_weights(model, ckpt_dir / MODEL_FILE)
    opt_sd = _unflatten_optimizer(load_file(str(ckpt_dir / "optimizer.safetensors")), meta["optimizer"])
    optimizer.load_state_dict(opt_sd)
    if scheduler is not None and meta["scheduler"] is not None:
        scheduler.load_state_dict(meta["scheduler"])
    rng = load_file(str(ckpt_dir / "rng.safetensors"))
    torch.set_rng_state(rng["torch_cpu"])
    if torch.cuda.is_available():
        cuda = [rng[k] for k in sorted(rng) if k.startswith("torch_cuda_")]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
    v, state, gauss = meta["python_rng"]
    random.setstate((v, tuple(state), gauss))
    return meta


def safe_torch_load(path: str | Path):
    """The only way this project opens a torch pickle: ``weights_only=True`` (no arbitrary code)."""
    if not Path(path).exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"refusing to load {path}: not a plain-tensor checkpoint ({type(exc).__name__}); "
            "convert it to safetensors from a trusted environment"
        ) from exc
