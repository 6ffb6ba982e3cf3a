"""`dvc repro` owns the launch: a training stage spreads itself over ``runtime.devices`` processes.

Every training stage command stays ``python stages/<stage>.py ...`` (what ``dvc.yaml`` and ``dvc.lock``
record). Started outside a launcher (no ``WORLD_SIZE``) with ``runtime.devices > 1``, the stage process
becomes a torch elastic agent (:mod:`torch.distributed.run`, PyTorch's own ``torchrun``, called in
process) that starts ``devices / nodes`` workers on this node running the same command line; the
workers see ``WORLD_SIZE`` and train. So one command covers every layout:

- ``runtime.devices: 1`` (smoke, mini): one process, nothing launched.
- ``runtime.devices: 8`` (one node): ``torchrun --standalone --nnodes 1 --nproc-per-node 8`` (GPUs when
  the stage's ``train.device`` resolves to CUDA, else CPU processes on gloo).
- ``runtime.devices: 8 x M``, ``runtime.nodes: M``: one agent per node joins torchrun's c10d
  rendezvous at ``PET_RDZV_ENDPOINT`` (host:port of one of the nodes; torchrun's own variable) with id
  ``PET_RDZV_ID``. Inside a SLURM allocation (``SLURM_JOB_ID`` set) the stage started by ``dvc repro`` on
  the head node runs the same command on every node itself (``srun --nodes M --ntasks-per-node 1``,
  rendezvous on the allocation's first node unless ``PET_RDZV_ENDPOINT`` is set); elsewhere start the
  same command on each node by hand with the same ``PET_RDZV_ENDPOINT`` / ``PET_RDZV_ID``.

``runtime.*`` is execution only (no stage tracks it): the layout never changes what a run computes
beyond float rounding (training/distributed.py). When any worker fails, the agent stops the others
and the stage exits non-zero with one line naming the rank (that rank printed its own error first).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import uuid

from dpnrepro.errors import UserError

# Set on the per-node copies of a stage that srun starts: they run their node's agent, never srun again.
NODE_AGENT_ENV = "DPNREPRO_NODE_AGENT"
DEFAULT_RDZV_PORT = 29400  # torchrun's default c10d port


class LaunchFailed(UserError):
    """A worker (or the rendezvous) failed; the other workers were stopped."""


def inside_launcher(env=os.environ) -> bool:
    """True in a process torchrun started (it sets ``WORLD_SIZE`` for every worker)."""
    return "WORLD_SIZE" in env


def nproc_per_node(runtime) -> int:
    if runtime.devices % runtime.nodes:
        raise UserError(f"runtime.devices ({runtime.devices}) is not divisible by runtime.nodes ({runtime.nodes}); "
                        "set runtime.devices to nodes x processes per node")
    return runtime.devices // runtime.nodes


def torchrun_argv(runtime, env=os.environ) -> list[str] | None:
    """The torchrun options that start this node's share of the job, or None when this process is the job
    (inside a launcher, or one process in all)."""
    if inside_launcher(env) or (runtime.devices == 1 and runtime.nodes == 1):
        return None
    per_node = nproc_per_node(runtime)
    if runtime.nodes == 1:
        return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(per_node)]
    endpoint = env.get("PET_RDZV_ENDPOINT")
    if not endpoint:
        raise UserError(f"runtime.nodes is {runtime.nodes}: set PET_RDZV_ENDPOINT=<host of one node>:<port> (and "
                        "PET_RDZV_ID) on every node, or run `dvc repro` inside a SLURM allocation")
    return ["--nnodes", str(runtime.nodes), "--nproc-per-node", str(per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", env.get("PET_RDZV_ID", "dpnrepro")]


def spread(runtime, argv: list[str] | None = None) -> None:
    """Return if this process should do the stage's work itself; otherwise start the job's processes
    (torchrun on this node, or srun over the allocation's nodes), wait for them and exit this process
    (status 0, or :class:`LaunchFailed`). ``argv``: the stage's command line (default ``sys.argv``)."""
    argv = list(sys.argv if argv is None else argv)
    if not inside_launcher() and runtime.nodes > 1 and os.environ.get("SLURM_JOB_ID") \
            and not os.environ.get(NODE_AGENT_ENV):
        _srun(runtime, argv)
        sys.exit(0)
    options = torchrun_argv(runtime)
    if options is None:
        return
    _agent(options, argv)
    sys.exit(0)


def _agent(options: list[str], argv: list[str]) -> None:
    """This node's torch elastic agent (``torchrun <options> <argv>``, in this process)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import get_args_parser, run

    if "LOGLEVEL" not in os.environ:  # the agent's own log (OMP_NUM_THREADS note, SIGTERM notices) only on demand
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    args = get_args_parser().parse_args([*options, *argv])
    try:
        run(args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        how = f"was killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exited with {failure.exitcode}"
        raise LaunchFailed(f"rank {rank} of the {' '.join(argv)} job {how}; the other ranks were stopped "
                           "(its message, if any, is above); rerun `dvc repro` to resume from the last checkpoint")
    except RendezvousError as exc:
        raise LaunchFailed(f"torchrun rendezvous failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


def _srun(runtime, argv: list[str]) -> None:
    """Run this stage's command once per node of the SLURM allocation (each copy is its node's agent)."""
    if shutil.which("srun") is None:
        raise UserError("SLURM_JOB_ID is set but `srun` is not on PATH")
    nproc_per_node(runtime)
    job = os.environ["SLURM_JOB_ID"]
    env = dict(os.environ, **{NODE_AGENT_ENV: "1"})
    env.setdefault("PET_RDZV_ENDPOINT", f"{_first_node()}:{DEFAULT_RDZV_PORT + int(job) % 1000}")
    env.setdefault("PET_RDZV_ID", f"{job}-{uuid.uuid4().hex[:8]}")  # one rendezvous per stage launch
    cmd = ["srun", f"--nodes={runtime.nodes}", f"--ntasks={runtime.nodes}", "--ntasks-per-node=1",
           "--kill-on-bad-exit=1", sys.executable, *argv]
    code = subprocess.call(cmd, env=env)
    if code:
        raise LaunchFailed(f"`srun` of {' '.join(argv)} on {runtime.nodes} nodes exited with {code}; "
                           "rerun `dvc repro` to resume from the last checkpoint")


def _first_node() -> str:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if nodelist and shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    import socket

    return socket.gethostname()


@contextlib.contextmanager
def stage_session(runtime, device: str = "auto", deterministic: bool = True, argv: list[str] | None = None):
    """The one process group of a stage process, for all its runs: spreads the stage over
    ``runtime.devices`` processes first (:func:`spread`; the launching process exits there), then yields
    this process's :class:`~dpnrepro.training.distributed.DistContext` (``distributed.process_session``).
    The stage passes it down: its runs train in it (``distributed.joined``), none opens another."""
    from dpnrepro.training import distributed

    spread(runtime, argv)
    with distributed.process_session(device, deterministic) as ctx:
        yield ctx


def metrics_stage(params, section: str, table: str, train_of, run, count: str, noun: str) -> None:
    """The body of a self-spreading stage whose runs all live in one process (``vtab``,
    ``sun397_scratch``): checks ``params.<section>`` exists, enters :func:`stage_session` with the
    train settings ``train_of(params)``, runs ``run(params, ctx=..., progress=...)`` on every rank and has rank 0
    alone write ``metrics/<section>.json``, printing how many ``metrics[count]`` ``noun`` it holds."""
    from pathlib import Path

    from dpnrepro.errors import ParamsError
    from dpnrepro.io import write_json_atomic

    if getattr(params, section) is None:
        raise ParamsError(f"params.yaml has no `{section}` section ({table})")
    train = train_of(params)
    with stage_session(params.runtime, train.device, train.deterministic) as ctx:
        metrics = run(params, ctx=ctx, progress=ctx.is_main)
        if ctx.is_main:
            out = Path("metrics") / f"{section}.json"
            write_json_atomic(out, metrics)
            print(f"wrote {out} ({len(metrics[count])} {noun})")
