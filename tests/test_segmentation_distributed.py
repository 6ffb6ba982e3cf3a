"""Table 5 on N processes (segmentation/execution.py): saved configs free of process history, the
resolved execution config (DDP, AMP), one data stream dealt to the ranks, and the `segment` stage with
``runtime.devices: 2`` on CPU/gloo: the same examples in every step as one process, metrics within the
noise of the augmentation draws, and a kill -> resume bit-identical to the uninterrupted 2-process run.

Why a tolerance and not equality between 1 and 2 processes: the initial weights and the examples of
every step are the same, but each rank draws crops, flips and stochastic-depth masks from its own stream
(``diff_rank_seed``) in its own batch shapes, so every augmentation draw differs from one process's; and
mmseg's loss averages over each rank's labelled pixels before DDP averages the ranks. A 2-process run
is therefore the run with other augmentation draws. The test measures that noise: ``K`` 1-process runs
with the same initial weights and data order whose streams are reseeded when training starts; the
2-process run must fall inside their two-sided 99 % prediction interval (Student t, ``K + 1`` runs with
the 1-process run) for each metric and for the distance of its weights from the 1-process run's.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from safetensors.torch import load_file

from helpers import FMNIST, REPO, copy_project, run, stage_env, write_params

CONFIG = REPO / "configs" / "segmentation" / "canvas_mu7_linear.py"
needs_fmnist = pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist (make env)")


def _tiny_options(**extra) -> dict:
    return {"train_cfg.max_iters": 4, "param_scheduler.0.end": 4, "default_hooks.checkpoint.interval": 2,
            "train_dataloader.batch_size": 4, **extra}


@pytest.fixture(scope="module")
def canvases(tmp_path_factory):
    from dpnrepro.data.segmentation import export_canvases

    root = tmp_path_factory.mktemp("segdist") / "canvases"
    export_canvases(FMNIST, root, train_images=12, val_images=3, size=84, items=(2, 4), seed=0)
    return root


def _cfg(canvases, work, device="cpu", **options):
    from dpnrepro.segmentation.experiment import run_config

    return run_config(CONFIG, arch="Mu-7", stem="dpn", fraction="1", seed=3, data_root=canvases, work_dir=work,
                      options=_tiny_options(**options), device=device)


# --- item 1: what a run saves is a function of the run ----------------------------------------------


@needs_fmnist
def test_two_runs_of_one_config_in_one_process_save_the_same_files(canvases, tmp_path):
    """The sweep saves ``cfg.dump()`` next to the weights: no counter, resume flag, log level or world
    size may leak into it (fresh vs resumed: tests/test_segmentation.py's kill test compares them too)."""
    import shutil

    from dpnrepro.segmentation.experiment import train_and_evaluate

    saved = []
    old_mask = os.umask(0o002)  # mmengine writes the checkpoints and logs itself: they honour the umask too
    try:
        for _ in range(2):
            shutil.rmtree(tmp_path / "w", ignore_errors=True)
            cfg = _cfg(canvases, tmp_path / "w")
            out = train_and_evaluate(cfg)
            saved.append((cfg.pretty_text, out.pop("state_dict"), out))
    finally:
        os.umask(old_mask)
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "w").rglob("*")}
    assert modes and all(m == (0o775 if (tmp_path / p).is_dir() else 0o664) for p, m in modes.items()), \
        {p: oct(m) for p, m in modes.items()}
    (text_a, state_a, out_a), (text_b, state_b, out_b) = saved
    assert text_a == text_b
    assert "experiment_name" not in text_a and "launcher" not in text_a and "model_wrapper_cfg" not in text_a
    assert out_a == out_b and all(torch.equal(state_a[k], state_b[k]) for k in state_a)


# --- items 2-4: the resolved execution config, without a GPU or a second process ---------------------


def test_execution_config_for_one_process_two_processes_and_cuda(canvases, tmp_path):
    from dpnrepro.errors import UserError
    from dpnrepro.segmentation.execution import execution_config

    cpu = _cfg(canvases, tmp_path / "w")
    recipe = cpu.pretty_text
    assert cpu.optim_wrapper.type == "OptimWrapper" and "dtype" not in cpu.optim_wrapper  # fp32 on CPU
    assert cpu.randomness == dict(seed=3, diff_rank_seed=True, deterministic=False)
    assert cpu.train_dataloader.sampler.seed == 3 and cpu.val_dataloader.sampler.seed == 3  # no sync_random_seed
    one = execution_config(cpu, name="r", world_size=1, device_type="cpu", resume=False)
    assert one.launcher == "none" and "model_wrapper_cfg" not in one and one.train_dataloader.batch_size == 4
    two = execution_config(cpu, name="r", world_size=2, device_type="cpu", resume=True)
    assert two.launcher == "pytorch" and two.resume is True
    assert two.model_wrapper_cfg == dict(type="MMDistributedDataParallel", broadcast_buffers=False,
                                         find_unused_parameters=True, device_ids=None)
    assert two.env_cfg.dist_cfg.backend == "gloo" and two.train_dataloader.batch_size == 2  # global batch 4
    assert cpu.train_dataloader.batch_size == 4 and "launcher" not in cpu  # the recipe is left alone
    assert cpu.pretty_text == recipe  # nested too (the checkpoint hook's backend, the visualizer's name)
    cuda = _cfg(canvases, tmp_path / "w", device="cuda")
    assert cuda.optim_wrapper.type == "AmpOptimWrapper" and cuda.optim_wrapper.dtype == "bfloat16"
    assert cuda.optim_wrapper.optimizer == cpu.optim_wrapper.optimizer
    assert cuda.optim_wrapper.paramwise_cfg == cpu.optim_wrapper.paramwise_cfg
    on_gpus = execution_config(cuda, name="r", world_size=4, device_type="cuda", resume=False)
    assert "device_ids" not in on_gpus.model_wrapper_cfg and on_gpus.env_cfg.dist_cfg.backend == "nccl"
    with pytest.raises(UserError, match="not divisible by runtime.devices"):
        execution_config(cpu, name="r", world_size=3, device_type="cpu", resume=False)


def test_infinite_sampler_deals_one_seeded_stream_to_the_ranks(monkeypatch):
    """mmengine's InfiniteSampler (mmseg's train sampler) with the run's seed: the global batch of every
    step is the same examples whatever the world size (per-process batch = global / world size)."""
    import itertools

    import mmengine.dataset.sampler as sampler_mod

    def steps(world: int, n_steps: int, global_batch: int = 8) -> list[set[int]]:
        per_rank = []
        for rank in range(world):
            monkeypatch.setattr(sampler_mod, "get_dist_info", lambda r=rank: (r, world))
            it = iter(sampler_mod.InfiniteSampler(list(range(11)), shuffle=True, seed=3))
            per_rank.append(list(itertools.islice(it, n_steps * global_batch // world)))
        b = global_batch // world
        return [set().union(*(r[s * b:(s + 1) * b] for r in per_rank)) for s in range(n_steps)]

    one = steps(1, 5)
    assert steps(2, 5) == one and steps(4, 5) == one
    assert len(set().union(*one)) == 11  # crosses the epoch boundary (11 examples, 40 draws)


# --- item 5: the stage under 2 processes -----------------------------------------------------------

# Imported at start-up by every stage process (sitecustomize, first on PYTHONPATH): logs the examples of
# every step per rank and, when asked,
# SIGKILLs rank 0 before an iteration (the same hook config in every attempt: one fingerprint).
PROBE = """import json, os, signal
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module(force=True)
class StepProbe(Hook):
    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if os.environ.get("SEG_KILL_AT") == str(runner.iter) and runner.rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        if os.environ.get("SEG_LOG"):
            names = sorted(os.path.basename(s.img_path) for s in data_batch["data_samples"])
            with open(os.environ["SEG_LOG"], "a") as f:
                f.write(json.dumps([runner.iter, runner.rank, names]) + "\\n")
"""
RUN = "Mu-7_dpn_f1_s3"
NOISE_RUNS = 5


@HOOKS.register_module(force=True)
class ReseedAtTrainStart(Hook):
    """Another augmentation stream (crops, flips, stochastic depth) for the same initial weights and data
    order: reseeds Python / numpy / torch once the weights are initialised, before the first batch."""

    def __init__(self, seed: int):
        self.seed = seed

    def before_train(self, runner) -> None:
        from mmengine.runner import set_random_seed

        set_random_seed(self.seed)


def _prediction_interval(sample: list[float], level: float = 0.99) -> tuple[float, float]:
    """Two-sided ``level`` prediction interval for one more draw (Student t, n - 1 degrees of freedom)."""
    from scipy import stats

    n, mean, sd = len(sample), float(np.mean(sample)), float(np.std(sample, ddof=1))
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd * (1 + 1 / n) ** 0.5
    return mean - half, mean + half


def _stage_params(devices: int) -> dict:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["export_seg_canvases"].update(train_images=12, val_images=3)
    params["segmentation"].update(
        stems=["dpn"], fractions=["1"], seeds=[3], pretrained_seed=None, device="cpu",
        options=_tiny_options(custom_hooks=[{"type": "ResumeStateHook"}, {"type": "StepProbe"}]))
    params["runtime"]["devices"] = devices
    return params


class SegProject:
    def __init__(self, root: Path):
        self.root = root

    def segment(self, devices: int, check: bool = True, **env) -> subprocess.CompletedProcess:
        write_params(self.root, _stage_params(devices))
        path = os.pathsep.join([str(self.root / "probe"), os.environ.get("PYTHONPATH", "")])
        full = {**stage_env(), "PYTHONPATH": path, **env}
        proc = subprocess.run([sys.executable, "stages/segment.py"], cwd=self.root, env=full, capture_output=True,
                              text=True)
        if check and proc.returncode:
            raise AssertionError(f"segment failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        return proc

    def keep(self, name: str) -> Path:
        """Move this attempt's outputs aside (and clear the resume cache)."""
        import shutil

        dst = self.root.parent / name
        shutil.move(self.root / "runs" / "seg", dst)
        shutil.move(self.root / "metrics" / "seg.json", dst / "seg.json")
        shutil.rmtree(self.root / "checkpoints" / "seg")
        return dst


@pytest.fixture(scope="module")
def seg_project(tmp_path_factory):
    root = copy_project(tmp_path_factory.mktemp("segstage") / "proj")
    (root / "probe").mkdir()
    (root / "probe" / "seg_probe.py").write_text(PROBE)
    # dpnrepro first, as every entry point does: the probe loads mmengine (numpy, torch) before the stage runs
    (root / "probe" / "sitecustomize.py").write_text("import dpnrepro  # noqa: F401\nimport seg_probe  # noqa: F401\n")
    write_params(root, _stage_params(1))
    run([sys.executable, "stages/export_seg_canvases.py"], root)
    return SegProject(root)


def _steps(log: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in log.read_text().splitlines():
        it, _, names = json.loads(line)
        out[it] = sorted(out.get(it, []) + names)
    return out


def _weights(d: Path) -> torch.Tensor:
    w = load_file(str(d / RUN / "model.safetensors"))
    return torch.cat([w[k].flatten().double() for k in sorted(w)])


@needs_fmnist
def test_segment_on_two_processes_matches_one_within_augmentation_noise_and_resumes_bit_identical(
        seg_project, tmp_path, monkeypatch):
    from dpnrepro.segmentation.experiment import run_config, train_and_evaluate

    seg_project.segment(1, SEG_LOG=str(tmp_path / "one.log"))
    one = seg_project.keep("one")
    out = seg_project.segment(2, SEG_LOG=str(tmp_path / "two.log"))
    assert out.stdout.count("wrote runs/seg") == 1  # rank 0 alone writes
    two = seg_project.keep("two")
    # the same examples in every step: the 2 ranks' batches of 2 = the 1 process's batch of 4
    steps_one, steps_two = _steps(tmp_path / "one.log"), _steps(tmp_path / "two.log")
    assert sorted(steps_one) == [0, 1, 2, 3] and steps_two == steps_one
    # the saved run files: the same config; the result differs only in the metrics
    assert (one / RUN / "config.py").read_text() == (two / RUN / "config.py").read_text()
    m1, m2 = (json.loads((d / "seg.json").read_text())["runs"][RUN] for d in (one, two))
    assert {k: v for k, v in m1.items() if k not in ("mIoU", "mAcc", "aAcc")} == \
        {k: v for k, v in m2.items() if k not in ("mIoU", "mAcc", "aAcc")}

    # the tolerance: 1-process runs whose augmentation streams are reseeded after the weights' init
    monkeypatch.syspath_prepend(str(seg_project.root / "probe"))
    import seg_probe  # noqa: F401  (registers StepProbe here too)

    seg = _stage_params(1)["segmentation"]
    runs = [{**m1, "dist": 0.0}]
    for aug_seed in range(100, 100 + NOISE_RUNS):
        cfg = run_config(seg_project.root / seg["config"], arch="Mu-7", stem="dpn", fraction="1", seed=3,
                         data_root=seg_project.root / seg["data_root"], work_dir=tmp_path / f"aug{aug_seed}",
                         options=seg["options"])
        cfg.custom_hooks.append(dict(type="ReseedAtTrainStart", seed=aug_seed))
        alt = train_and_evaluate(cfg)
        w = torch.cat([alt["state_dict"][k].flatten().double() for k in sorted(alt["state_dict"])])
        runs.append({**alt, "dist": float((w - _weights(one)).norm())})
    two_dist = float((_weights(two) - _weights(one)).norm())
    assert min(r["dist"] for r in runs[1:]) > 0, "reseeding must change the run, or the interval says nothing"
    for key, value in [("mIoU", m2["mIoU"]), ("mAcc", m2["mAcc"]), ("aAcc", m2["aAcc"]), ("dist", two_dist)]:
        sample = [r[key] for r in runs] if key != "dist" else [r["dist"] for r in runs[1:]]
        lo, hi = _prediction_interval(sample)
        print(f"2 processes: {key} {value:.4g}, 99 % prediction interval [{lo:.4g}, {hi:.4g}] of {sample}")
        assert lo <= value <= hi, f"2 processes: {key} {value} outside [{lo}, {hi}] of {sample}"

    # kill rank 0 before iteration 3 (checkpoint after 2), rerun: bit-identical to the uninterrupted run
    killed = seg_project.segment(2, check=False, SEG_KILL_AT="3")
    assert killed.returncode == 2, killed.stderr[-3000:]
    assert "Traceback" not in killed.stderr, killed.stderr[-3000:]
    assert "error: rank 0 of the stages/segment.py job was killed by SIGKILL" in killed.stderr
    assert not (seg_project.root / "runs" / "seg").exists()
    ckpt = seg_project.root / "checkpoints" / "seg" / RUN
    assert (ckpt / "iter_2.pth").exists() and not (ckpt / "iter_4.pth").exists()
    seg_project.segment(2)
    assert (seg_project.root / "runs" / "seg" / RUN / "model.safetensors").read_bytes() == \
        (two / RUN / "model.safetensors").read_bytes()
    assert (seg_project.root / "metrics" / "seg.json").read_bytes() == (two / "seg.json").read_bytes()
