"""The ``benchmark`` section (benchmarks/dvc.yaml): training throughput on synthetic input."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dpnrepro.config.core import _Section


class BenchmarkParams(_Section):
    """Training-throughput benchmark (stages/benchmark.py): synthetic input, no data needed."""

    archs: list[str] = Field(default_factory=lambda: ["Ti-16", "S-16", "B-16", "L-16"], min_length=1)
    stems: list[str] = Field(default_factory=lambda: ["conv", "linear", "dpn"], min_length=1)
    timm_reference: bool = True
    batch_size: int = Field(8, gt=0)
    img_size: int = Field(224, gt=0)
    warmup_steps: int = Field(2, ge=1)
    rounds: int = Field(10, ge=6)  # interleaved rounds; a 95 % CI for the median needs >= 6
    steps_per_round: int = Field(2, gt=0)  # timed steps per model per round
    seed: int = 0  # weights, synthetic batch and the per-round model order
    compile: bool = False
    cudagraphs: bool = Field(False, description="with compile, on CUDA: CUDA graphs (runtime.cudagraphs)")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # step levers (contenders.StepLevers): the defaults are the trainer's step
    sdpa_backend: Literal["auto", "flash", "cudnn", "efficient", "math"] = Field(
        "auto", description="attention kernel (torch.nn.attention.sdpa_kernel)")
    compile_mode: Literal["default", "max-autotune", "max-autotune-no-cudagraphs"] = Field(
        "default", description="torch.compile mode of forward + loss (with compile)")
    compiled_optimizer: bool = Field(False, description="clipping + optimizer step compiled (with compile)")
    channels_last: bool = Field(False, description="images and 4-D weights NHWC (patch-embedding layout)")
    profile_ops: bool = Field(False, description="kernel time per step by op group (torch.profiler)")
