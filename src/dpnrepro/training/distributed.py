"""Data-parallel training under ``torchrun``: process group, model wrapping (DDP / FSDP2), full state.

One command covers 1 CPU process to N GPUs on M nodes; ``torchrun`` (never a home-made launcher)
starts the processes and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and the rendezvous)::

    python stages/train.py --arch Mu-7 --stem dpn --seed 0                            # 1 process
    torchrun --nproc_per_node=8 stages/train.py --arch B-16 --stem dpn --seed 0       # 1 node x 8 GPUs
    torchrun --nnodes=4 --nproc_per_node=8 --rdzv-backend=c10d \\
             --rdzv-endpoint=HOST:29500 --rdzv-id=JOB stages/train.py ...            # 4 nodes x 8 GPUs

A training stage started outside torchrun with ``runtime.devices > 1`` launches these processes itself
(training/launch.py: ``dvc repro`` owns the launch). ``runtime.devices`` must equal the number of
processes (WORLD_SIZE); the recipe's ``train.batch_size``
and ``train.steps`` stay the global batch and the number of optimizer steps whatever the world size;
each process computes ``batch_size / (world_size * accum_steps)`` examples per micro-step.
Checkpoints hold full tensors (written by rank 0) and need a filesystem shared by all nodes.

Determinism (CPU, gloo): a given layout (world size, accum_steps, ddp/fsdp) is bit-reproducible, and
resuming it after a crash gives bit-identical weights (tested with 2 processes). Other layouts give
the same run up to float rounding (the global-batch gradient is summed in another order): same
batches, augmentations and mixup partners (each rank loads the examples its first ones mix with),
and the same dropout masks when the micro-batch size is the same. On GPUs bf16 autocast, NCCL
reductions and some kernels are not bit-reproducible. With more than 2 processes DDP's gradient
bucket layout after a resume may sum in another order than the uninterrupted run (not tested).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dpnrepro import cli
from dpnrepro.errors import CheckpointError, UserError


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def env_world() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` as torchrun sets them (``(0, 1, 0)`` without torchrun)."""
    return (int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
            int(os.environ.get("LOCAL_RANK", "0")))


def pick_device(name: str | torch.device) -> torch.device:
    """``auto``/``cpu``/``cuda`` → a device (``cuda`` is this process's ``LOCAL_RANK`` GPU under torchrun); a
    ``torch.device`` (a session's) as it is."""
    return name if isinstance(name, torch.device) else resolve_device(name, env_world()[2])


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``train.device`` (auto/cpu/cuda) → this process's device (``cuda:LOCAL_RANK`` on GPUs)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UserError("train.device is 'cuda' but no CUDA device is visible; set train.device: auto or cpu")
        if local_rank >= torch.cuda.device_count():
            raise UserError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA device(s) visible; "
                            "set torchrun --nproc_per_node to at most the number of GPUs per node")
        return torch.device("cuda", local_rank)
    return torch.device(name)


def check_layout(batch_size: int, runtime, world_size: int) -> int:
    """Check ``runtime.devices`` against WORLD_SIZE and the batch split; returns the per-process micro-batch."""
    if runtime.devices != world_size:
        raise UserError(
            f"runtime.devices is {runtime.devices} but this job has {world_size} process(es) (WORLD_SIZE); "
            f"launch with `torchrun --nproc_per_node=<GPUs per node> --nnodes=<nodes>` giving {runtime.devices} "
            f"processes in all, or set runtime.devices: {world_size}"
        )
    split = world_size * runtime.accum_steps
    if batch_size % split:
        raise UserError(
            f"train.batch_size ({batch_size}) is not divisible by world_size x accum_steps "
            f"({world_size} x {runtime.accum_steps} = {split}); change train.batch_size or runtime.accum_steps"
        )
    return batch_size // split


def current() -> DistContext | None:
    """The context of the process group this module set up, or None outside :func:`session`."""
    return _ACTIVE


_ACTIVE: DistContext | None = None


@contextlib.contextmanager
def session(device_name: str = "auto"):
    """Yield this process's :class:`DistContext`; joins torchrun's process group when WORLD_SIZE > 1.

    Backend ``nccl`` on CUDA, ``gloo`` on CPU; the CUDA device is ``LOCAL_RANK``. Entered once per process
    (:func:`process_session`, through a stage's ``launch.stage_session``); code that runs inside it
    receives its context, so a second entry is a bug: it raises instead of silently reusing the first
    (which would train on the first entry's device).
    """
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError(f"distributed.session({device_name!r}) inside the open session on {_ACTIVE.device}: "
                           "pass the open session's context down instead")
    rank, world, local_rank = env_world()
    device = resolve_device(device_name, local_rank)
    created = False
    if world > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
        created = True
    elif device.type == "cuda":
        torch.cuda.set_device(device)
    _ACTIVE = DistContext(rank=rank, world_size=world, local_rank=local_rank, device=device)
    cli.session_device = device.type  # result labels name the device that computed them (cli.hardware_label)
    try:
        yield _ACTIVE
    finally:
        _ACTIVE = None
        cli.session_device = None
        if created and dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def process_session(device: str = "auto", deterministic: bool = True):
    """The one way into this process's session: the ``train.deterministic`` switch, then the process group
    (joined under torchrun) on ``device``. Determinism first: strict mode makes torch pick deterministic
    NCCL reductions (no NVLS) when the group is created (determinism/cuda.py)."""
    from dpnrepro.determinism import cuda as determinism

    determinism.configure(deterministic)
    with session(device) as ctx:
        yield ctx


@contextlib.contextmanager
def joined(ctx, device: str, deterministic: bool):
    """``ctx``, the session a stage entered once, checked against a run's own ``train.device`` and
    ``train.deterministic`` (a run never trains on other settings than those it is fingerprinted with);
    without one (a test, a benchmark, a study worker) a session of this call's own."""
    if ctx is None:
        with process_session(device, deterministic) as ctx:
            yield ctx
        return
    if resolve_device(device, ctx.local_rank) != ctx.device:
        raise UserError(f"train.device {device!r} inside a stage that runs on {ctx.device}: one stage process "
                        "trains on one device type; set the same train.device for all its runs")
    if torch.are_deterministic_algorithms_enabled() != deterministic:
        raise UserError(f"train.deterministic {deterministic} inside a stage session set up with "
                        f"{not deterministic}: set the same train.deterministic for all its runs")
    yield ctx


def barrier(ctx: DistContext) -> None:
    if not ctx.distributed:
        return
    if ctx.device.type == "cuda":
        dist.barrier(device_ids=[ctx.device.index])
    else:
        dist.barrier()


def broadcast_object(ctx: DistContext, obj):
    """Rank 0's ``obj`` on every rank."""
    if not ctx.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def mean_over_ranks(ctx: DistContext, value: torch.Tensor) -> torch.Tensor:
    """Mean of a scalar tensor over all processes (a collective: call it on every rank)."""
    if not ctx.distributed:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)  # gloo has no AVG
    return value / ctx.world_size


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a (replicated or partial) DTensor result; other tensors unchanged."""
    full = getattr(t, "full_tensor", None)
    return full() if full is not None else t


# --- model wrapping -----------------------------------------------------------------------------------


class Parallel:
    """The model as the step loop sees it.

    ``core`` is the plain module (its state dict names the checkpoint's tensors, and under FSDP2 its
    parameters are sharded DTensors); ``forward`` is what to call (the DDP wrapper or the module);
    ``no_sync()`` skips the gradient all-reduce on non-final accumulation micro-steps.
    """

    def __init__(self, core: torch.nn.Module, ctx: DistContext, parallel: str = "ddp"):
        self.core, self.ctx = core, ctx
        self.fsdp = ctx.distributed and parallel == "fsdp"
        self.ddp = None
        wrapped = core
        if self.fsdp:
            from torch.distributed.fsdp import fully_shard

            for block in core.blocks:
                fully_shard(block)
            fully_shard(core)
        elif ctx.distributed:
            from torch.nn.parallel import DistributedDataParallel

            ids = [ctx.device.index] if ctx.device.type == "cuda" else None
            self.ddp = wrapped = DistributedDataParallel(core, device_ids=ids, output_device=ids[0] if ids else None)
        self.forward = wrapped  # torch.compile wraps forward + loss (training/step.py: LossStep)

    @contextlib.contextmanager
    def no_sync(self):
        if self.ddp is not None:
            with self.ddp.no_sync():
                yield
        elif self.fsdp:
            self.core.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                self.core.set_requires_gradient_sync(True)
        else:
            yield

    # Checkpoints hold full (unsharded) tensors in every mode, so a run can resume on another world
    # size or strategy. Under FSDP2 gathering them is a collective: every rank calls these.

    def checkpoint_objects(self, optimizer):
        """``(model, optimizer)`` for :func:`checkpoint.save_checkpoint` (to call on rank 0 only)."""
        if not self.fsdp:
            return self.core, optimizer
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, get_model_state_dict, get_optimizer_state_dict)

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd = get_model_state_dict(self.core, options=opts)
        optim_sd = get_optimizer_state_dict(self.core, optimizer, options=opts)
        if not self.ctx.is_main:  # rank 0 alone receives the tensors
            return None, None
        return _Frozen(model_sd), _Frozen(_fqn_to_index(optim_sd, self._param_names(optimizer)))

    def resume_objects(self, optimizer):
        """``(model, optimizer)`` for :func:`checkpoint.load_checkpoint` (every rank loads)."""
        if not self.fsdp:
            return self.core, optimizer
        return _FullModelLoader(self.core), _FullOptimLoader(self.core, optimizer, self._param_names(optimizer))

    def full_model(self, spec) -> torch.nn.Module | None:
        """The trained model as a plain module with full weights (under FSDP2: rank 0; None elsewhere)."""
        if not self.fsdp:
            return self.core
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.core, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.ctx.is_main:
            return None
        plain = spec.build()
        plain.load_state_dict(sd)
        return plain

    def _param_names(self, optimizer) -> list[str]:
        names = {id(p): n for n, p in self.core.named_parameters()}
        return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


class _Frozen:
    """A precomputed state dict posing as a module / optimizer for checkpoint.py."""

    def __init__(self, state: dict):
        self._state = state

    def state_dict(self) -> dict:
        return self._state


def _fqn_to_index(optim_sd: dict, order: list[str]) -> dict:
    """torch.distributed.checkpoint's optimizer state (keyed by parameter name) → torch.optim's (by index)."""
    index = {n: i for i, n in enumerate(order)}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in optim_sd["param_groups"]]
    return {"state": {index[n]: st for n, st in optim_sd["state"].items()}, "param_groups": groups}


def _index_to_fqn(optim_sd: dict, order: list[str]) -> dict:
    groups = [{**g, "params": [order[i] for i in g["params"]]} for g in optim_sd["param_groups"]]
    return {"state": {order[int(i)]: st for i, st in optim_sd["state"].items()}, "param_groups": groups}


class _FullModelLoader:
    """Loads full tensors into an FSDP2-sharded module (each rank keeps its shard)."""

    def __init__(self, core):
        self.core = core

    def state_dict(self) -> dict:
        # names and global shapes only (checkpoint.load_weights checks them): no gather needed
        return {k: torch.empty(v.shape, device="meta") for k, v in self.core.state_dict().items()}

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(self.core, state, options=StateDictOptions(full_state_dict=True))


class _FullOptimLoader:
    def __init__(self, core, optimizer, order):
        self.core, self.optimizer, self.order = core, optimizer, order

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.core, self.optimizer, _index_to_fqn(state, self.order),
                                 options=StateDictOptions(full_state_dict=True))


def missing_checkpoint(ckpt_dir, ctx: DistContext) -> CheckpointError:
    return CheckpointError(
        f"rank {ctx.rank} cannot read the checkpoint in {ckpt_dir} that rank 0 found; "
        "multi-node runs need checkpoints/ on a filesystem shared by all nodes"
    )
