"""How one Table 5 run executes: device, processes, mixed precision, per-rank random streams.

The recipe (:func:`dpnrepro.segmentation.experiment.run_config`) is what a run computes and what its
``config.py`` records; :func:`execution_config` derives from it, for this process only, what mmengine
needs to execute it and what no output may record (it depends on the layout or on process history):

- **Processes.** The ``segment`` stage spreads over ``runtime.devices`` processes through the project's
  launch path (training/launch.py: torchrun underneath, one process group for the whole sweep). Inside
  a job of more than one process the Runner gets ``launcher='pytorch'`` and mmengine's own DDP wrapper
  (``model_wrapper_cfg``: ``MMDistributedDataParallel``, ``device_ids=None`` on CPU/gloo). mmengine's
  ``Runner.setup_env`` calls ``init_dist`` only when no process group exists, so every run of the sweep
  joins the stage's group. The recipe's ``train_dataloader.batch_size`` is the global batch; each
  process loads ``batch / world_size`` (mmengine's batch size is per process).
- **Precision.** On CUDA the recipe trains through ``AmpOptimWrapper`` with ``dtype='bfloat16'``
  (:func:`optim_wrapper_for`); on CPU it keeps the config file's fp32 ``OptimWrapper``. The device
  (``segmentation.device``) is a tracked param: a CPU stage hides the GPUs (mmengine's documented
  ``CUDA_VISIBLE_DEVICES`` switch), so the smoke profile gives CPU bits on every machine.
- **Seeds.** ``randomness = dict(seed=<run seed>, diff_rank_seed=True)``: mmengine seeds Python, numpy
  and torch with ``seed + rank``, so under DDP every rank draws its own crops, flips and stochastic-depth
  masks (with ``False`` all ranks would draw the same ones: the i-th image of every rank cropped and
  dropped alike). ``diff_rank_seed`` would also make mmengine seed the samplers from a random number
  (``sync_random_seed``); the recipe instead gives every sampler the run's seed explicitly, so the data
  order is the same permutation for every world size (with one process all of this is bit-identical to
  ``diff_rank_seed=False``, so the committed smoke results stand). Consequence for reproducibility: a run
  is bit-reproducible, and resumes bit-identically (every rank's RNG states are in the checkpoints,
  resume.py), for a given world size; another world size starts from the same weights and sees the same
  examples in every step (``InfiniteSampler`` deals one seeded stream of indices round-robin to the
  ranks), but draws its augmentations from per-rank streams in per-rank batch shapes and normalises the
  loss per rank, so its metrics agree with one process's only within augmentation noise
  (tests/test_segmentation_distributed.py derives and tests the tolerance).
"""

from __future__ import annotations

import copy
import os

from dpnrepro.errors import UserError

AMP_DTYPE = "bfloat16"


def hide_gpus_for_cpu(device: str) -> None:
    """A CPU stage on a GPU machine: mmengine picks its device at import (``get_device``), so hide the
    GPUs from this process and the processes it launches before anything initialises CUDA."""
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def optim_wrapper_for(optim_wrapper: dict, device_type: str) -> dict:
    """The recipe's optimizer wrapper on ``device_type``: bf16 ``AmpOptimWrapper`` on CUDA, as is on CPU."""
    out = copy.deepcopy(dict(optim_wrapper))
    if device_type == "cuda":
        out.update(type="AmpOptimWrapper", dtype=AMP_DTYPE)
    return out


def per_process_batch(global_batch: int, world_size: int) -> int:
    if global_batch % world_size:
        raise UserError(f"the segmentation config's train_dataloader.batch_size ({global_batch}, the global batch) "
                        f"is not divisible by runtime.devices ({world_size}); set runtime.devices to a divisor")
    return global_batch // world_size


def execution_config(cfg, *, name: str, world_size: int, device_type: str, resume: bool,
                     log_level: str = "WARNING"):
    """A copy of the run's recipe ``cfg`` with what this process needs to execute it (not saved)."""
    from mmengine.config import Config

    from dpnrepro.segmentation.resume import CHECKPOINT_BACKEND  # registers it with mmengine

    # mmengine formats the Runner's config with yapf for its log, its dumped copy, the message hub and
    # every checkpoint's meta: 9 times a run, ~0.3 s each on a slow CPU. This copy is never a result (the
    # run saves the recipe's formatted config.py, experiment.py), so it is left unformatted.
    run = Config(copy.deepcopy(cfg.to_dict()), cfg_text=cfg.text, filename=cfg.filename,
                 env_variables=cfg.env_variables, format_python_code=False)
    run.resume = resume
    run.default_hooks.checkpoint.backend_args = dict(backend=CHECKPOINT_BACKEND)  # iter_<n>.pth written whole
    run.log_level = log_level
    # mmengine singletons (logger, message hub, visualizer) are per name; the Runner appends its start
    # time to ``experiment_name`` for the logger and hub, and the visualizer gets the run's name
    # (mmseg's default_runtime fixes it to 'visualizer'): experiment.release_instances frees it after a run.
    run.experiment_name = name
    if run.get("visualizer") is not None:
        run.visualizer.name = name
    run.train_dataloader.batch_size = per_process_batch(cfg.train_dataloader.batch_size, world_size)
    if world_size > 1:
        run.launcher = "pytorch"
        # find_unused_parameters: the encoder's final norm takes no part when the recipe leaves it out
        # (appendix G: out_with_norm False), as mmseg's own configs set it for such backbones
        wrapper = dict(type="MMDistributedDataParallel", broadcast_buffers=False, find_unused_parameters=True)
        if device_type != "cuda":
            wrapper["device_ids"] = None  # a CPU module: DDP takes no device ids
        run.model_wrapper_cfg = wrapper
        run.env_cfg = dict(run.get("env_cfg") or {}, dist_cfg=dict(backend="nccl" if device_type == "cuda" else "gloo"))
    else:
        run.launcher = "none"
    return run
