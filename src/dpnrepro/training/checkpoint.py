"""Checkpoints without pickles: tensors in safetensors, everything else in JSON, written atomically.

A training checkpoint is a directory with
  ``model.safetensors``      the weights (the only file a user needs for inference),
  ``optimizer.safetensors``  optimizer tensors, flattened as ``state.<param index>.<name>``,
  ``rng.safetensors``        torch CPU/CUDA generator states,
  ``meta.json``              step, config fingerprint, optimizer param-group scalars, scheduler,
                             Python RNG state, and what the trainer adds (``extra``: the run's logged
                             curves up to this step, :class:`dpnrepro.training.history.Curves`).
  ``SHA256SUMS``             the sha256 of each file above (``sha256sum``'s format, and a comment line
                             with the record's own sha256: a damaged record is named as such).
The directory is built under a temporary name and renamed into place, so a kill at any moment leaves
either the previous complete checkpoint or the new complete one. A checkpoint is a resume cache: one
whose files do not match their checksums (a truncated file, bytes changed on disk) is not resumed from;
the run retrains from scratch, as if there were none. The same record and the same check (:func:`verified`)
guard segmentation's mmengine checkpoints and run files (:func:`write_with_checksums`).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dpnrepro.artifacts import MODEL_FILE, load_weights, save_weights
from dpnrepro.determinism.rng import capture_rng, restore_rng, state_tensor
from dpnrepro.errors import CheckpointError
from dpnrepro.io import all_or_nothing, atomic_dir, recover_dir, write_bytes_atomic, write_json_atomic, \
    write_text_atomic

CHECKSUMS = "SHA256SUMS"
CHECKPOINT_FILES = (MODEL_FILE, "optimizer.safetensors", "rng.safetensors", "meta.json")


class DamagedCheckpoint(CheckpointError):
    """A checkpoint file that is missing or does not match the checksum written with it, or (``record``)
    a checksum record that is missing or damaged itself (then the files it covers may well be intact)."""

    def __init__(self, path: Path, reason: str, *, record: bool = False):
        self.path, self.reason, self.record = Path(path), reason, record
        if record and reason == "missing":  # e.g. files written before checksums were kept
            super().__init__(f"checksum record {path} is missing, so its files cannot be verified")
        else:
            super().__init__(f"{'checksum record' if record else 'checkpoint'} {path} is damaged ({reason})")


def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as f:
        if sys.version_info >= (3, 11):
            return hashlib.file_digest(f, "sha256").hexdigest()
        digest = hashlib.sha256()  # Python 3.10: no hashlib.file_digest
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
        return digest.hexdigest()


_SELF = "# sha256 of the lines above: "  # sha256sum -c skips lines that start with '#'


def checksums_text(digests: dict[str, str]) -> str:
    """``sha256sum``'s format: one ``<sha256>  <name>`` line per file, then a comment line with the sha256
    of those lines, so that a damaged record is told apart from a damaged file."""
    lines = "".join(f"{digest}  {name}\n" for name, digest in sorted(digests.items()))
    return f"{lines}{_SELF}{hashlib.sha256(lines.encode()).hexdigest()}\n"


def read_checksums(manifest: str | Path) -> dict[str, str]:
    """name -> sha256 recorded in ``manifest``; :class:`DamagedCheckpoint` naming ``manifest`` where it is
    missing or damaged (not text, malformed, or not matching its own sha256). A record without its own
    sha256 (written before it had one) is read as it is."""
    manifest = Path(manifest)
    try:
        text = manifest.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DamagedCheckpoint(manifest, "missing", record=True) from None
    except UnicodeDecodeError:
        raise DamagedCheckpoint(manifest, "not text", record=True) from None
    body, sep, own = text.rpartition(_SELF)
    if sep:
        if hashlib.sha256(body.encode()).hexdigest() != own.strip() or own.count("\n") != 1:
            raise DamagedCheckpoint(manifest, "it does not match its own sha256", record=True)
        text = body
    recorded = {}
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if not sep or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise DamagedCheckpoint(manifest, "not sha256sum lines", record=True)
        recorded[name] = digest
    return recorded


def write_checksums(manifest: str | Path, files: list[Path]) -> None:
    """Record the sha256 of ``files`` (in ``manifest``'s folder) in ``manifest``, atomically."""
    write_text_atomic(manifest, checksums_text({Path(f).name: file_sha256(f) for f in files}))


def write_with_checksums(folder: str | Path, files: dict[str, bytes], *, drop: tuple[str, ...] = ()) -> None:
    """Write ``files`` (name -> bytes) into ``folder`` and their sha256 into its :data:`CHECKSUMS`, as one
    :func:`~dpnrepro.io.all_or_nothing` unit: the record first, the files after it in the order given (the
    last one is the unit's completion mark). The record keeps the other files' entries, less ``drop``."""
    folder = Path(folder)
    try:
        recorded = read_checksums(folder / CHECKSUMS)
    except DamagedCheckpoint:
        recorded = {}  # the files written now get a fresh record
    for name in drop:
        recorded.pop(name, None)
    recorded.update({name: hashlib.sha256(data).hexdigest() for name, data in files.items()})
    with all_or_nothing():
        write_text_atomic(folder / CHECKSUMS, checksums_text(recorded))
        for name, data in files.items():
            write_bytes_atomic(folder / name, data)


def verify_checksums(manifest: str | Path, names: tuple[str, ...]) -> None:
    """Raise :class:`DamagedCheckpoint` naming the first of ``names`` (files beside ``manifest``) that is
    missing or does not match the sha256 that ``manifest`` records for it, or naming ``manifest`` where
    the record itself is missing, damaged or has no entry for one of ``names``."""
    manifest = Path(manifest)
    recorded = read_checksums(manifest)
    for name in names:
        path = manifest.parent / name
        if name not in recorded:
            raise DamagedCheckpoint(manifest, f"no checksum of {name}", record=True)
        if not path.is_file():
            raise DamagedCheckpoint(path, "missing")
        if file_sha256(path) != recorded[name]:
            raise DamagedCheckpoint(path, "checksum mismatch")


def note_retraining(exc: DamagedCheckpoint, run: str) -> None:
    """The one line a run that falls back from a damaged checkpoint prints (stderr)."""
    print(f"{exc}; retraining {run} from scratch", file=sys.stderr, flush=True)


def verified(manifest: str | Path, names: tuple[str, ...], *, run: str, discard: Path | None = None) -> bool:
    """The one check before anything is loaded from a checkpoint or a run's saved files: True when every
    one of ``names`` matches ``manifest``; else one line on stderr names the damaged file (or the damaged
    record) and says that ``run`` is retrained, ``discard`` (a folder) is removed, and it is False."""
    try:
        verify_checksums(manifest, names)
    except DamagedCheckpoint as exc:
        note_retraining(exc, run)
        if discard is not None:
            shutil.rmtree(discard, ignore_errors=True)
        return False
    return True


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
    if not verified(ckpt_dir / CHECKSUMS, CHECKPOINT_FILES, run=ckpt_dir.name):
        return None
    return json.loads((ckpt_dir / "meta.json").read_text())


def checkpoint_step(ckpt_dir: str | Path) -> int | None:
    """The step that the checkpoint in ``ckpt_dir`` records, read without verifying its files (another
    rank of a job checks that it sees the checkpoint rank 0 verified); None where it cannot be read."""
    try:
        return json.loads((Path(ckpt_dir) / "meta.json").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_checkpoint(ckpt_dir: str | Path, *, model, optimizer, scheduler, meta: dict | None = None) -> dict:
    """Restore model, optimizer, scheduler and RNG states; returns the checkpoint's meta. ``meta``: what
    :func:`read_checkpoint_meta` returned for ``ckpt_dir`` (its files verified then, so not hashed again);
    None: verify them here."""
    ckpt_dir = Path(ckpt_dir)
    if not (ckpt_dir / "meta.json").exists():
        raise CheckpointError(f"no checkpoint in {ckpt_dir}")
    if meta is None:
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
