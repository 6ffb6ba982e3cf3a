"""Shared entry-point plumbing for ``stages/*.py``: offline defaults and one-line user errors."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path

from dpnrepro.errors import fault_errno, fault_message  # noqa: F401 - the stage entry points' names for them

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DVC_NO_ANALYTICS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def offline_defaults() -> None:
    """Nothing reaches the network at run time unless the user opts in (set the variables to 0)."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


def stage(main):
    """Decorator for stage entry points: offline, refused unless the CPU pins are in force, fixed CPU threads
    from the moment torch loads (determinism.cpu; a stage that never uses torch never loads it); a :class:`UserError` or a fault of the machine the user can fix (full disk, file-size
    limit, read-only or unwritable output folder: :func:`fault_message`) becomes ``error: <one line>`` and exit 2, followed under ``dvc repro`` by
    how to restore the outputs DVC removed before running the stage (:func:`restore_hint`); in a worker of a
    multi-process job, a collective broken by another process's death becomes one line and exit 1
    (training/launch.py)."""
    return _entry_point(main, pin_threads=True)


def measurement(main):
    """Decorator for the tools that write a measurement (``tools/*.py``): as :func:`stage` (offline, refused
    unless the CPU pins are in force, one-line errors) but the tool keeps the thread count it sets itself."""
    return _entry_point(main, pin_threads=False)


def _entry_point(main, *, pin_threads: bool):
    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        offline_defaults()
        from dpnrepro.determinism import cpu
        from dpnrepro.errors import UserError

        try:
            cpu.require_pins()
            if pin_threads:
                cpu.pin_threads_when_loaded()  # torch's threads, when (if ever) this stage loads torch
            return main(*args, **kwargs)
        except UserError as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            print("interrupted; rerun `dvc repro` to resume from the last checkpoint", file=sys.stderr)
            sys.exit(130)
        except Exception as exc:
            message = fault_message(exc)
            if message is not None:
                _fail(message)
            if not (isinstance(exc, RuntimeError) and peer_failure(exc)):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"error: rank {os.environ.get('RANK')} stopped: another process of the job failed ({first})",
                  file=sys.stderr)
            sys.exit(1)

    return wrapper


def _fail(message: str) -> None:
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):  # the error starts its own line
        bar.close()
    print(f"error: {message}{restore_hint()}", file=sys.stderr)
    sys.exit(2)


def restore_hint(env=os.environ) -> str:
    """Under ``dvc repro`` (``DVC_STAGE`` set): DVC removed the stage's outputs before running it; the commands
    that get the previous ones back (restore.stage_restore_commands: ``dvc checkout --force`` for cached
    outputs, ``git checkout --`` for git-tracked ones)."""
    name = env.get("DVC_STAGE")
    if not name:
        return ""
    from dpnrepro.restore import stage_restore_commands

    ways = stage_restore_commands(name, env.get("DVC_ROOT", "."))
    if not ways:
        return ""
    return f" (dvc removed this stage's previous outputs before running it; {' and '.join(ways)} restores them)"


# How gloo / NCCL report a peer that went away mid-collective (the peer printed its own error).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "communicator was aborted",
              "NCCL communicator", "Socket Timeout")


def peer_failure(exc: BaseException, env=os.environ) -> bool:
    """True when ``exc`` in a worker of a multi-process job (training/launch.py) is a collective failing
    because another process of the job died (that process's own error says why; this one just stops)."""
    if int(env.get("WORLD_SIZE", "1")) < 2:
        return False
    import torch.distributed as dist

    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError)
                                               and any(s in str(exc) for s in _PEER_GONE))


# The device type of the active training session (training/distributed.py sets it), so that result
# labels name the device that computed them, not merely one that is present.
session_device: str | None = None


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's word for it."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def hardware_label(*, measured_on: bool = False) -> str:
    """The hardware a result is labelled with.

    Results (``measured_on=False``): on CPU the class of machines that give the same bits (architecture,
    pinned kernels, threads; determinism.cpu), not the CPU model, so that committed metrics stay
    byte-identical across machines; on GPU the device model (GPU bits are per model). Timings
    (``measured_on=True``): the actual CPU model as well. Inside a training session
    (training/distributed.py) the session's device decides, so a CPU run on a GPU machine says CPU.
    """
    import platform

    import torch

    from dpnrepro.determinism.cpu import describe

    if torch.cuda.is_available() and session_device in (None, "cuda"):
        dev = f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    elif measured_on:
        dev = f"CPU {cpu_model()}, {torch.get_num_threads()} threads"
    else:
        dev = f"CPU {platform.machine()}, {describe()}"
    return f"{dev}; torch {torch.__version__}"


class _StageArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are the project's one line (``error: ...``, exit 2); an argument the
    stage does not define is named even when a required one is missing too."""

    def parse_args(self, args=None, namespace=None):
        required = [*self._actions, *self._mutually_exclusive_groups]
        flags = [item.required for item in required]
        for item in required:
            item.required = False
        try:
            _, unknown = self.parse_known_args(args, argparse.Namespace())
        finally:
            for item, flag in zip(required, flags):
                item.required = flag
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return super().parse_args(args, namespace)

    def error(self, message: str):
        print(f"error: {self.prog}: {message} (`{self.prog} --help` lists its arguments)", file=sys.stderr)
        sys.exit(2)


def stage_parser(doc: str | None) -> argparse.ArgumentParser:
    """The command line of a stage, to add its own arguments to: ``--help`` prints ``doc`` (the stage's
    docstring) and exits 0; an argument it does not define is one ``error:`` line and exit 2, before the
    stage has done anything."""
    return _StageArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def stage_arguments(doc: str | None) -> argparse.Namespace:
    """The command line of a stage that defines no arguments: ``--help`` or a refusal (:func:`stage_parser`)."""
    return stage_parser(doc).parse_args()
