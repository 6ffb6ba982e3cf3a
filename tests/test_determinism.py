"""Determinism: the `train.deterministic` switch (training/determinism.py) and the whole smoke pipeline
reproduced twice from empty DVC caches."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch

from helpers import FMNIST, copy_project, git_init, stage_env, tiny_params, write_params

from dpnrepro.training import determinism


@pytest.fixture
def restore_torch_flags(monkeypatch):
    """configure() changes process-wide torch flags and the environment: put them back afterwards."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded, so that teardown also removes a value set here
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    det, warn_only, benchmark, cudnn_det, matmul_tf32, cudnn_tf32 = saved
    torch.use_deterministic_algorithms(det, warn_only=warn_only)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, cudnn_det
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul_tf32, cudnn_tf32


def _assert_deterministic_settings():
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled(), "strict mode: non-deterministic ops must raise"
    assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.deterministic is True
    assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.allow_tf32 is False


def _assert_fast_settings():
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.benchmark is True and torch.backends.cudnn.deterministic is False
    assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True


def test_deterministic_switch_sets_strict_mode_cudnn_tf32_and_cublas_workspace(restore_torch_flags):
    determinism.configure(True)
    _assert_deterministic_settings()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_fast_switch_undoes_the_deterministic_one(restore_torch_flags):
    determinism.configure(True)
    determinism.configure(False)
    _assert_fast_settings()


def test_a_cublas_workspace_config_already_set_is_kept(restore_torch_flags, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    determinism.configure(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_seed_everything_applies_train_deterministic(restore_torch_flags):
    from dpnrepro.training.trainer import seed_everything

    seed_everything(0, deterministic=True)
    _assert_deterministic_settings()
    seed_everything(0, deterministic=False)
    _assert_fast_settings()


def test_every_documented_cuda_kernel_says_how_it_is_handled_and_where_that_is_documented():
    assert determinism.NONDETERMINISTIC_CUDA_KERNELS
    for entry in determinism.NONDETERMINISTIC_CUDA_KERNELS:
        assert all(field.strip() for field in entry), entry


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("stem", ["conv", "dpn"])
def test_deterministic_cuda_trainings_are_bit_identical(stem, tmp_path, restore_torch_flags):
    """Two short bf16 trainings on the GPU with train.deterministic: the same weights, bit for bit
    (attention backward, conv stem, dropout and stochastic depth, mixup, Adam, clipping all exercised)."""
    import datasets
    import numpy as np

    from dpnrepro.config import InputParams, TrainParams
    from dpnrepro.training.trainer import ModelSpec, train_classifier

    rng = np.random.default_rng(0)
    ds = datasets.Dataset.from_dict(
        {"image": list(rng.integers(0, 255, (64, 28, 28), dtype=np.uint8)), "label": list(rng.integers(0, 10, 64))},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)}),
    )
    spec = ModelSpec(arch="Mu/7", stem=stem, placement="pre-pre", num_classes=10, img_size=28, in_chans=1,
                     pool="tok", rep_size=True, head_bias_init=-2.2, drop_rate=0.1, drop_path_rate=0.1)
    inp = InputParams(image_size=28, channels=1, eval_resize=28, inception_crop=False, flip=True, mixup=0.5)
    cfg = TrainParams(lr=1e-3, batch_size=16, steps=6, warmup_steps=1, grad_clip=1.0, log_every=1,
                      ckpt_every=100, device="cuda", deterministic=True)
    first, second = (train_classifier(spec, ds, inp, cfg, seed=0, ckpt_dir=tmp_path / name, progress=False).state_dict()
                     for name in ("a", "b"))
    assert first.keys() == second.keys()
    differ = [k for k in first if not torch.equal(first[k], second[k])]
    assert not differ, f"deterministic CUDA trainings differ in {differ}"


# --- the smoke pipeline twice from empty DVC caches ---------------------------------------------------------

# `dvc repro table1 table2` runs prepare, every training sweep and every evaluation (all upstream of the
# two tables), but not the `benchmark` / `bench_input` stages: those measure wall-clock time, so their
# outputs legitimately differ between runs.
TARGETS = ("table1", "table2")
GENERATED = ("dvc.lock", "metrics", "reports/table1.md", "reports/table1.png", "reports/table2.md",
             "reports/table2.png")


def _fresh_copy(root, params):
    """A scratch copy of the project with none of the committed outputs, an empty DVC cache, its own git."""
    copy_project(root)
    write_params(root, params)
    for generated in GENERATED:
        path = root / generated
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    assert not (root / ".dvc/cache").exists() and not (root / "runs").exists()
    git_init(root)
    return root


def _compared_outputs(root) -> dict[str, bytes]:
    """Every metrics file, every table report and the trained weights of every run."""
    paths = [*root.glob("metrics/*.json"), *root.glob("reports/table*.md"), *root.glob("reports/table*.png"),
             *root.glob("runs/*/*/model.safetensors")]
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in paths}


@pytest.fixture(scope="module")
def two_repros(tmp_path_factory):
    """The tiny smoke params (every sweep Mu/7, seed 0, a few steps) reproduced in two independent copies.

    512 training images: the 25-shot evaluations need 25 of each class in the train pool. The two
    `dvc repro` run side by side (one core each: stage_env sets OMP_NUM_THREADS=1).
    """
    params = tiny_params(**{"data.train_examples": 512})
    roots = [_fresh_copy(tmp_path_factory.mktemp(name), params) for name in ("first", "second")]
    procs = [subprocess.Popen(["dvc", "repro", *TARGETS], cwd=root, env=stage_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for root in roots]
    logs = [proc.communicate()[0] for proc in procs]
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, f"dvc repro failed ({proc.returncode}):\n{log[-4000:]}"
    return params, roots, logs


@pytest.mark.slow
@pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist (make env)")
def test_smoke_pipeline_twice_from_empty_cache_gives_identical_metrics_reports_and_weights(two_repros):
    params, (first, second), logs = two_repros
    for log in logs:
        assert "Running stage 'prepare'" in log and "Running stage 'table2'" in log, log[-2000:]
    a, b = _compared_outputs(first), _compared_outputs(second)
    n_runs = sum(len(body["archs"]) * len(body["stems"]) * len(body["seeds"])
                 for body in params.values() if isinstance(body, dict) and "recipe" in body)
    assert sum(name.startswith("runs/") for name in a) == n_runs
    assert {"metrics/table1.json", "metrics/table1_summary.json", "metrics/table2_summary.json",
            "reports/table1.md", "reports/table1.png", "reports/table2.md", "reports/table2.png"} <= a.keys()
    assert a.keys() == b.keys()
    differ = sorted(name for name in a if a[name] != b[name])
    assert not differ, f"differ between the two reproductions: {differ}"


def test_switch_is_set_before_the_process_group_is_created(monkeypatch, restore_torch_flags, tmp_path):
    """torch keeps NCCL off its non-deterministic NVLS reductions only if strict mode is already on when the
    process group is created, so the trainer must configure determinism before `distributed.session`."""
    from dpnrepro.config import TrainParams
    from dpnrepro.training import distributed, trainer

    class GroupCreated(Exception):
        pass

    seen = []

    def session(device_name="auto"):
        seen.append(torch.are_deterministic_algorithms_enabled())
        raise GroupCreated

    monkeypatch.setattr(distributed, "session", session)
    torch.use_deterministic_algorithms(False)
    cfg = TrainParams(lr=1e-3, batch_size=4, steps=1, deterministic=True)
    with pytest.raises(GroupCreated):
        trainer.train_classifier(None, None, None, cfg, seed=0, ckpt_dir=tmp_path)
    assert seen == [True]
