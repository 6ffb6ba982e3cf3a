"""The ``runtime`` section: how the work is executed, tracked by no stage."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpnrepro.config.core import _Section


class RuntimeParams(_Section):
    """How the work is executed, not what is computed: no train stage tracks this section, and a
    checkpoint resumes across any change of it (a run started on 8 GPUs can finish on 4).

    Changing ``devices``, ``accum_steps`` or ``parallel`` regroups the sums of a step, so a run is
    equal to rounding (1e-5 relative), not bit-identical, across layouts (tests/test_distributed.py).
    """

    workers: int = Field(0, ge=0, description="data-loader worker processes")
    prepare_workers: int = Field(0, ge=0, description=(
        "processes that check and index a `data.storage: source` dataset in `prepare` (0 = one per CPU)"))
    eval_batch_size: int = Field(256, gt=0)
    log_every: int = Field(10, gt=0, description="dvclive logging cadence (steps)")
    ckpt_every: int = Field(100, gt=0, description="resumable-checkpoint cadence (steps)")
    devices: int = Field(1, gt=0, description=(
        "training processes in all (torchrun's WORLD_SIZE = nodes x nproc_per_node): a training stage "
        "started outside torchrun launches them itself (training/launch.py); checked when training starts. "
        "train.batch_size and train.steps stay the global batch and the optimizer steps"))
    nodes: int = Field(1, gt=0, description=(
        "nodes the devices are spread over (devices / nodes processes per node; rendezvous through torchrun's "
        "c10d at PET_RDZV_ENDPOINT, or srun inside a SLURM allocation)"))
    accum_steps: int = Field(1, gt=0, description=(
        "gradient-accumulation micro-steps per optimizer step; each process computes "
        "batch_size / (devices x accum_steps) examples per micro-step"))
    parallel: Literal["ddp", "fsdp"] = Field("ddp", description=(
        "with more than one process: ddp (DistributedDataParallel) or fsdp (FSDP2 fully_shard per "
        "transformer block + root, for L/16 and up)"))
    compile: bool = Field(False, description=(
        "torch.compile forward + loss as one graph (and so its backward); checkpoints keep the plain state dict"))
    cudagraphs: bool = Field(False, description=(
        "with compile, on CUDA: replay forward and backward as CUDA graphs (mode reduce-overhead), for "
        "models whose step is bound by kernel launches (Ti/16, S/16)"))

    def check_batch(self, batch_size: int) -> None:
        if batch_size % (self.devices * self.accum_steps):
            raise ValueError(f"batch_size ({batch_size}) is not divisible by devices x accum_steps "
                             f"({self.devices} x {self.accum_steps} = {self.devices * self.accum_steps})")
