"""Checkpoints without pickles: tensors in safetensors, everything else in JSON, written atomically.

A training checkpoint is a directory with
  ``model.safetensors``      the weights (the only file a user needs for inference),
  ``optimizer.safetensors``  optimizer tensors, flattened as ``state.<param index>.<name>``,
  ``rng.safetensors``        torch CPU/CUDA generator states,
  ``meta.json``              step, config fingerprint, optimizer param-group scalars, scheduler,
                             Python RNG state, and what the trainer adds (``extra``: the run's logged
                             curves up to this step, :class:`dpnrepro.training.history.Curves`).
  ``SHA256SUMS``             the sha256 of each file above (``sha256sum``'s format).
The directory is built under a temporary name and renamed into place, so a kill at any moment leaves
either the previous complete checkpoint or the new complete one. A checkpoint is a resume cache: one
whose files do not match their checksums (a truncated file, bytes changed on disk) is not resumed from;
the run retrains from scratch, as if there were none.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dpnrepro.artifacts import MODEL_FILE, load_weights, save_weights
from dpnrepro.determinism.rng import capture_rng, restore_rng, state_tensor
from dpnrepro.errors import CheckpointError
from dpnrepro.io import atomic_dir, recover_dir, write_json_atomic, write_text_atomic

CHECKSUMS = "SHA256SUMS"
CHECKPOINT_FILES = (MODEL_FILE, "optimizer.safetensors", "rng.safetensors", "meta.json")


class DamagedCheckpoint(CheckpointError):
    """A checkpoint file that is missing or does not match the checksum written with it."""

    def __init__(self, path: Path, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"checkpoint {path} is damaged ({reason})")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checksums_text(digests: dict[str, str]) -> str:
    """``sha256sum``'s format: one ``<sha256>  <name>`` line per file."""
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(digests.items()))


def write_checksums(manifest: str | Path, files: list[Path]) -> None:
    """Record the sha256 of ``files`` (in ``manifest``'s folder) in ``manifest``, atomically."""
    write_text_atomic(manifest, checksums_text({Path(f).name: file_sha256(f) for f in files}))


def verify_checksums(manifest: str | Path, names: tuple[str, ...]) -> None:
    """Raise :class:`DamagedCheckpoint` naming the first of ``names`` (files beside ``manifest``) that is
    missing or does not match the sha256 that ``manifest`` records for it."""
    manifest = Path(manifest)
    try:
        lines = manifest.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DamagedCheckpoint(manifest, "no checksum recorded") from None
    except UnicodeDecodeError:
        raise DamagedCheckpoint(manifest, "checksum mismatch") from None
    recorded = {}
    for line in lines:
        digest, sep, name = line.partition("  ")
        if sep:
            recorded[name] = digest
    for name in names:
        path = manifest.parent / name
        if name not in recorded:
            raise DamagedCheckpoint(manifest, "checksum mismatch")
        if not path.is_file():
            raise DamagedCheckpoint(path, "missing")
        if file_sha256(path) != recorded[name]:
            raise DamagedCheckpoint(path, "checksum mismatch")


def note_retraining(exc: DamagedCheckpoint, run: str) -> None:
    """The one line a run that falls back from a damaged checkpoint prints (stderr)."""
    print(f"checkpoint {exc.path} is damaged ({exc.reason}); retraining {run} from scratch", file=sys.stderr,
          flush=True)


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
    rng, python_rng = _rng_files(capture_rng(numpy_global=False))
    meta = {
        "step": step,
        "fingerprint": fingerprint,
        "optimizer": opt_meta,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "python_rng": python_rng,
        "extra": extra or {},
    }
    with atomic_dir(ckpt_dir) as tmp:
        save_weights(model, tmp / MODEL_FILE)
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        save_file(rng, str(tmp / "rng.safetensors"))
        write_json_atomic(tmp / "meta.json", meta)
        write_checksums(tmp / CHECKSUMS, [tmp / name for name in CHECKPOINT_FILES])


def verify_checkpoint(ckpt_dir: str | Path) -> None:
    """Raise :class:`DamagedCheckpoint` unless every file of the checkpoint matches its checksum."""
    verify_checksums(Path(ckpt_dir) / CHECKSUMS, CHECKPOINT_FILES)


def read_checkpoint_meta(ckpt_dir: str | Path) -> dict | None:
    """The meta of the checkpoint in ``ckpt_dir`` once every file matches its checksum; None where there is
    none, or where it is damaged: then one line on stderr says that the run retrains from scratch."""
    ckpt_dir = Path(ckpt_dir)
    recover_dir(ckpt_dir)  # a checkpoint left aside by a kill inside atomic_dir
    if not ckpt_dir.is_dir() or not any(ckpt_dir.iterdir()):
        return None
    try:
        verify_checkpoint(ckpt_dir)
    except DamagedCheckpoint as exc:
        note_retraining(exc, ckpt_dir.name)
        return None
    return json.loads((ckpt_dir / "meta.json").read_text())


def load_checkpoint(ckpt_dir: str | Path, *, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer, scheduler and RNG states; returns the checkpoint's meta."""
    ckpt_dir = Path(ckpt_dir)
    if not (ckpt_dir / "meta.json").exists():
        raise CheckpointError(f"no checkpoint in {ckpt_dir}")
    verify_checkpoint(ckpt_dir)
    meta = json.loads((ckpt_dir / "meta.json").read_text())
    load_weights(model, ckpt_dir / MODEL_FILE)
    opt_sd = _unflatten_optimizer(load_file(str(ckpt_dir / "optimizer.safetensors")), meta["optimizer"])
    optimizer.load_state_dict(opt_sd)
    if scheduler is not None and meta["scheduler"] is not None:
        scheduler.load_state_dict(meta["scheduler"])
    restore_rng(_rng_state(load_file(str(ckpt_dir / "rng.safetensors")), meta["python_rng"]))
    return meta


def _rng_files(state: dict) -> tuple[dict, list]:
    """A :func:`~dpnrepro.determinism.rng.capture_rng` state as a checkpoint keeps it: the torch generator
    states as ``rng.safetensors``' uint8 tensors (``torch_cpu``, ``torch_cuda_<device>``), Python's for
    ``meta.json``. numpy's global generator is not kept (as before: the CPU resume tests pass without it)."""
    tensors = {"torch_cpu": state_tensor(state["torch"])}
    tensors.update({f"torch_cuda_{i}": state_tensor(s) for i, s in enumerate(state.get("cuda", []))})
    return tensors, state["python"]


def _rng_state(tensors: dict, python_rng: list) -> dict:
    """:func:`_rng_files` undone, the CUDA devices in their numeric order (``torch_cuda_10`` after ``_9``)."""
    cuda = sorted((int(k.rsplit("_", 1)[1]), v) for k, v in tensors.items() if k.startswith("torch_cuda_"))
    return {"torch": tensors["torch_cpu"], "cuda": [v for _, v in cuda], "python": python_rng}


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
