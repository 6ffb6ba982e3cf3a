"""Resuming a killed mmengine run under torch >= 2.6, with pickle safety left on.

torch >= 2.6 loads with ``weights_only=True`` by default, and mmengine 0.10's checkpoints hold its
``MessageHub`` state: ``HistoryBuffer`` objects with numpy arrays and their bound statistics methods
(pickled through ``builtins.getattr``), so ``runner.resume`` fails with ``Unsupported global:
mmengine.logging.history_buffer.HistoryBuffer``. Allow-listing ``getattr`` would open the unpickler far
wider than a checkpoint needs, so :class:`ResumeStateHook` writes the message hub as plain data instead
(lists and numbers) and rebuilds the buffers when a checkpoint is loaded. What is left for the
unpickler is tensors, builtins and numpy's array reconstruction, which :func:`safe_mmengine_load`
allow-lists for the duration of a ``with`` block (no process-wide ``add_safe_globals``, no
``weights_only=False``); anything else, e.g. a crafted ``__reduce__``, is still refused.

Bit-identical resume also needs the random state: mmseg's transforms draw from numpy's global RNG,
stochastic depth from torch's (on the CPU or the GPU). :class:`ResumeStateHook` also stores the torch (CPU and
CUDA) / numpy / Python RNG states in every checkpoint, as plain values (determinism/rng.py: no tensor that
mmengine's loader could map to the training device, no new globals) and :class:`ResumableIterBasedTrainLoop`
restores them right after mmengine has advanced the data loader past the iterations already trained
(advancing replays the loader, which draws from the same RNGs), so iteration ``k + 1`` sees the random
state an uninterrupted run had. Under DDP every rank has its own streams (``diff_rank_seed``, see
execution.py) while rank 0 alone writes checkpoints, so when a checkpoint is due the hook gathers every
rank's states first (one ``all_gather_object``) and each rank restores its own on resume.

mmengine's ``CheckpointHook`` writes ``iter_<n>.pth`` in place. The runs' hook writes through
:class:`AtomicCheckpointBackend` instead (a file backend in mmengine's registry, named by the hook's
``backend_args``, execution.py): each checkpoint is renamed into place whole, with the umask's mode, and
its sha256 in the work directory's ``SHA256SUMS`` (training/checkpoint.py's record, written in the same
unit); :func:`verify_resume_point` checks the checkpoint that ``last_checkpoint`` names before a run
resumes from it. The recipes keep two checkpoints (``max_keep_ckpts=2``): mmengine deletes the oldest
one before it writes the next, so the previous complete one survives a failed or killed write.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import numpy as np
import torch
from mmengine.fileio import LocalBackend, register_backend
from mmengine.hooks import Hook
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.registry import HOOKS, LOOPS
from mmengine.runner import IterBasedTrainLoop

from dpnrepro.determinism import rng

CHECKPOINT_BACKEND = "dpnrepro_atomic"
LAST_CHECKPOINT = "last_checkpoint"  # mmengine's CheckpointHook: the path of the latest checkpoint
RNG_KEY = "dpnrepro_rng"
RANKS_RNG_KEY = "dpnrepro_rng_ranks"  # every rank's states, rank order (jobs of > 1 process)


@register_backend(CHECKPOINT_BACKEND)
class AtomicCheckpointBackend(LocalBackend):
    """mmengine's local file backend, but a file is written whole or not at all (io.write_bytes_atomic:
    a full disk leaves no truncated ``iter_<n>.pth`` and names the path), with its sha256 in the folder's
    checksum record (checkpoint.write_with_checksums), which drops it when mmengine removes the file."""

    def put(self, obj: bytes, filepath) -> None:
        from dpnrepro.training.checkpoint import write_with_checksums

        path = Path(filepath)
        write_with_checksums(path.parent, {path.name: obj})

    def remove(self, filepath) -> None:
        from dpnrepro.training.checkpoint import write_with_checksums

        super().remove(filepath)
        write_with_checksums(Path(filepath).parent, {}, drop=(Path(filepath).name,))


def verify_resume_point(work: Path) -> bool:
    """Whether the checkpoint that ``work/last_checkpoint`` names (if any) matches its sha256; where it
    does not, one line says so and ``work`` is removed (the run retrains from scratch)."""
    from dpnrepro.training.checkpoint import CHECKSUMS, DamagedCheckpoint, note_retraining, verified

    last = work / LAST_CHECKPOINT
    if not last.exists():
        return True
    name = Path(last.read_text(encoding="utf-8", errors="replace").strip()).name
    if not name:
        note_retraining(DamagedCheckpoint(last, "names no checkpoint"), work.name)
        shutil.rmtree(work, ignore_errors=True)
        return False
    return verified(work / CHECKSUMS, (name,), run=work.name, discard=work)


def _numpy_globals() -> list:
    """numpy's array-pickling globals (module paths differ between numpy 1.x and 2.x)."""
    multiarray = getattr(np, "_core", np.core).multiarray
    dtypes = [type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "uint8", "bool")]
    return [multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype, *dtypes]


def mmengine_safe_globals() -> list:
    """What an mmengine 0.10 checkpoint written with :class:`ResumeStateHook` holds besides tensors and
    builtins: numpy arrays (e.g. in the runtime info), nothing that calls code."""
    return _numpy_globals()


@contextlib.contextmanager
def safe_mmengine_load(work: Path | None = None):
    """Within the block, ``torch.load(weights_only=True)`` (torch's default) accepts mmengine checkpoints; a
    pickle that holds anything else (code, other types) is refused in one line (CheckpointError) naming the
    run folder ``work``, without torch's advice to load it with ``weights_only=False``."""
    import pickle
    import re

    from dpnrepro.errors import CheckpointError

    try:
        with torch.serialization.safe_globals(mmengine_safe_globals()):
            yield
    except pickle.UnpicklingError as exc:
        found = re.search(r"unsupported (?:global: )?GLOBAL (\S+)", str(exc), re.IGNORECASE)
        what = f"it names {found.group(1).rstrip('.')}" if found else f"{type(exc).__name__}"
        where = f" in {work}" if work is not None else ""
        raise CheckpointError(f"refusing to load the segmentation resume point{where}: it is not a checkpoint this "
                              f"project writes ({what}; none of its code ran); delete "
                              f"{work if work is not None else 'the run folder'} to train from scratch") from None


def capture_rng() -> dict:
    """This process's RNG states as plain values, numpy's global generator included (mmseg draws from it)."""
    return rng.capture_rng(numpy_global=True)


def restore_rng(state: dict) -> None:
    rng.restore_rng(_plain_rng(state))


def _plain_rng(state: dict) -> dict:
    """A state in :func:`capture_rng`'s form; one of an older checkpoint (tensors, numpy's keys apart) is
    converted, on whatever device its tensors were mapped to."""
    if "numpy_keys" not in state:
        return state
    kind, pos, has_gauss, cached = state["numpy"]
    keys = state["numpy_keys"].detach().cpu().tolist()
    return {"torch": state["torch"], "numpy": [kind, keys, pos, has_gauss, cached], "python": state["python"]}


def _plain_buffers(log_scalars: dict) -> dict:
    return {k: {"log": [float(v) for v in b._log_history], "count": [int(c) for c in b._count_history],
                "max_length": int(b.max_length)} if isinstance(b, HistoryBuffer) else b
            for k, b in log_scalars.items()}


def _history_buffers(log_scalars: dict) -> dict:
    return {k: HistoryBuffer(np.asarray(b["log"], np.float64), np.asarray(b["count"], np.int64), b["max_length"])
            if isinstance(b, dict) and set(b) == {"log", "count", "max_length"} else b
            for k, b in log_scalars.items()}


@HOOKS.register_module()
class ResumeStateHook(Hook):
    """Checkpoints that load under ``weights_only`` and resume bit-identically: the message hub as
    plain data, plus the RNG states (handed to the train loop when a run is resumed)."""

    # before the CheckpointHook (VERY_LOW): every rank's RNG states are gathered before rank 0 saves
    priority = "LOW"
    _ranks_rng: list | None = None

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if runner.world_size > 1 and _checkpoint_due(runner):
            from mmengine.dist import all_gather_object

            self._ranks_rng = all_gather_object(capture_rng())

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        hub = checkpoint.get("message_hub")
        if hub is not None:
            hub["log_scalars"] = _plain_buffers(hub.get("log_scalars", {}))
        checkpoint[RNG_KEY] = capture_rng()
        if runner.world_size > 1 and self._ranks_rng is not None:
            checkpoint[RANKS_RNG_KEY] = self._ranks_rng

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        hub = checkpoint.get("message_hub")
        if hub is not None:
            hub["log_scalars"] = _history_buffers(hub.get("log_scalars", {}))
        if not isinstance(runner.train_loop, ResumableIterBasedTrainLoop):
            return
        ranks = checkpoint.get(RANKS_RNG_KEY) or []
        if len(ranks) == runner.world_size > 1:
            runner.train_loop.rng_after_skip = ranks[runner.rank]
        elif runner.world_size == 1 and RNG_KEY in checkpoint:
            runner.train_loop.rng_after_skip = checkpoint[RNG_KEY]
        # another world size than the checkpoint's: ranks keep their seeded streams (not bit-identical)


def _checkpoint_due(runner) -> bool:
    """Whether mmengine's iteration-based CheckpointHook saves after this iteration (its own rule)."""
    from mmengine.hooks import CheckpointHook

    for hook in runner.hooks:
        if isinstance(hook, CheckpointHook) and not hook.by_epoch:
            return bool(hook.every_n_train_iters(runner, hook.interval, hook.save_begin)
                        or (hook.save_last and hook.is_last_train_iter(runner)))
    return False


class _RestoreAfter:
    """Iterator proxy: after ``n`` items, restore the RNG states (then behave as the wrapped iterator)."""

    def __init__(self, iterator, n: int, state: dict):
        self.iterator, self.left, self.state = iterator, n, state

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self.iterator)
        self.left -= 1
        if self.left == 0:
            restore_rng(self.state)
        return item


@LOOPS.register_module()
class ResumableIterBasedTrainLoop(IterBasedTrainLoop):
    """mmengine's ``IterBasedTrainLoop``, plus the RNG restore of :class:`ResumeStateHook` on resume."""

    rng_after_skip: dict | None = None

    def run(self):
        if self._iter > 0 and self.rng_after_skip is not None:
            self.dataloader_iterator = _RestoreAfter(self.dataloader_iterator, self._iter, self.rng_after_skip)
        return super().run()
