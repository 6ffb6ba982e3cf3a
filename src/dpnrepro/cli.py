"""Shared entry-point plumbing for ``stages/*.py``: offline defaults and one-line user errors."""

from __future__ import annotations

import functools
import os
import sys

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
    """Decorator for stage entry points: offline, fixed CPU threads (cpu_determinism); a :class:`UserError`
    becomes ``error: <one line>`` and exit 2; in a worker of a multi-process job, a collective broken by
    another process's death becomes one line and exit 1 (training/launch.py)."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        offline_defaults()
        from dpnrepro.cpu_determinism import pin_threads

        pin_threads()
        from dpnrepro.errors import UserError

        try:
            return main(*args, **kwargs)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("interrupted; rerun `dvc repro` to resume from the last checkpoint", file=sys.stderr)
            sys.exit(130)
        except OSError as exc:
            if exc.errno == 28:  # ENOSPC
                print(f"error: no space left on device while writing {exc.filename or 'output'}; "
                      "free disk space and rerun `dvc repro` (completed checkpoints are kept)", file=sys.stderr)
                sys.exit(2)
            raise
        except RuntimeError as exc:
            if not peer_failure(exc):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"error: rank {os.environ.get('RANK')} stopped: another process of the job failed ({first})",
                  file=sys.stderr)
            sys.exit(1)

    return wrapper


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
    pinned kernels, threads; cpu_determinism), not the CPU model, so that committed metrics stay
    byte-identical across machines; on GPU the device model (GPU bits are per model). Timings
    (``measured_on=True``): the actual CPU model as well. Inside a training session
    (training/distributed.py) the session's device decides, so a CPU run on a GPU machine says CPU.
    """
    import platform

    import torch

    from dpnrepro.cpu_determinism import describe

    if torch.cuda.is_available() and session_device in (None, "cuda"):
        dev = f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    elif measured_on:
        dev = f"CPU {cpu_model()}, {torch.get_num_threads()} threads"
    else:
        dev = f"CPU {platform.machine()}, {describe()}"
    return f"{dev}; torch {torch.__version__}"
