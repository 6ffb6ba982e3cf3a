"""Determinism: the `train.deterministic` switch (determinism/cuda.py) and the CPU instruction-set
and thread pins (determinism/cpu.py). That the whole smoke pipeline reproduces the committed results
bit for bit is tests/test_pipeline.py's job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import REPO, tiny_mu7_training

from dpnrepro.determinism import cuda as determinism


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


def test_the_session_applies_train_deterministic(restore_torch_flags):
    from dpnrepro.training import distributed

    with distributed.process_session("cpu", deterministic=True):
        _assert_deterministic_settings()
    with distributed.process_session("cpu", deterministic=False):
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
    from dpnrepro.config.core import InputParams, TrainParams
    from dpnrepro.training.trainer import train_classifier

    ds, spec = tiny_mu7_training(stem, dropout=0.1)
    inp = InputParams(image_size=28, channels=1, eval_resize=28, inception_crop=False, flip=True, mixup=0.5)
    cfg = TrainParams(lr=1e-3, batch_size=16, steps=6, warmup_steps=1, grad_clip=1.0, device="cuda",
                      deterministic=True)
    first, second = (train_classifier(spec, ds, inp, cfg, seed=0, ckpt_dir=tmp_path / name, progress=False).state_dict()
                     for name in ("a", "b"))
    assert first.keys() == second.keys()
    differ = [k for k in first if not torch.equal(first[k], second[k])]
    assert not differ, f"deterministic CUDA trainings differ in {differ}"


def test_switch_is_set_before_the_process_group_is_created(monkeypatch, restore_torch_flags, tmp_path):
    """torch keeps NCCL off its non-deterministic NVLS reductions only if strict mode is already on when the
    process group is created, so the trainer must configure determinism before `distributed.session`."""
    from dpnrepro.config.core import TrainParams
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


def test_cpu_kernels_are_pinned_in_every_process_that_imports_dpnrepro():
    """ATen, MKL, oneDNN, NumPy, OpenBLAS and OpenCV dispatch by CPU unless pinned; a stage pins them, its
    threads and its convolution path (what each library then reports: tests/test_kernel_fingerprint.py)."""
    from dpnrepro.determinism.cpu import INSTRUCTION_SET_ENV

    probe = ("import dpnrepro, torch, os, json\n"
             "from dpnrepro.determinism.cpu import INSTRUCTION_SET_ENV, pin_threads\n"
             "pin_threads()\n"
             "print(json.dumps([torch.backends.cpu.get_cpu_capability(), {k: os.environ[k] for k in INSTRUCTION_SET_ENV},"
             " torch.get_num_threads(), torch.backends.mkldnn.enabled]))")
    from helpers import clean_env

    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=clean_env(), capture_output=True, text=True, check=True)
    capability, pinned, threads, onednn = json.loads(out.stdout.strip().splitlines()[-1])
    assert (capability, threads, onednn) == ("AVX2", 2, False)
    assert pinned == INSTRUCTION_SET_ENV and pinned["MKL_CBWR"] == "COMPATIBLE,STRICT"


def test_hardware_label_of_results_names_the_reproducibility_class_not_the_cpu_model():
    from dpnrepro.cli import cpu_model, hardware_label

    label = hardware_label()
    if not torch.cuda.is_available():
        assert cpu_model() not in label and "aten avx2, mkl compatible,strict" in label.lower() and "threads" in label
        assert cpu_model() in hardware_label(measured_on=True)
