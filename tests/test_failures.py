"""Failures the user must see as one line, with nothing lost: NaN loss, full disk, bad names."""

from __future__ import annotations

import errno
import json
import sys

import pytest
import torch

from dpnrepro.config.runtime import RuntimeParams
from dpnrepro.errors import UserError
from dpnrepro.training import trainer as trainer_mod
from dpnrepro.artifacts import ModelSpec
from dpnrepro.training.trainer import TrainingDiverged, train_classifier
from helpers import FMNIST, copy_project, run, tiny_params, write_params


def _spec():
    return ModelSpec(arch="Mu/7", stem="dpn", placement="pre-pre", num_classes=10, img_size=28, in_chans=1,
                     pool="tok", rep_size=True, head_bias_init=-2.2, pos_drop_rate=0.0, proj_drop_rate=0.0,
                     drop_path_rate=0.0)


@pytest.fixture()
def tiny_train(tmp_path):
    import datasets
    import numpy as np

    rng = np.random.default_rng(0)
    ds = datasets.Dataset.from_dict(
        {"image": list(rng.integers(0, 255, (64, 28, 28), dtype=np.uint8)), "label": list(rng.integers(0, 10, 64))},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)}),
    )
    from dpnrepro.config.params import load_params
    from helpers import REPO

    params = load_params(REPO / "params.yaml")
    cfg = params.train.model_copy(update={"steps": 8, "warmup_steps": 1, "batch_size": 16, "device": "cpu"})
    return ds, params.input, cfg


RUNTIME = RuntimeParams(log_every=1, ckpt_every=2)


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(tiny_train, tmp_path, monkeypatch):
    ds, input_cfg, cfg = tiny_train
    real = trainer_mod.LOSSES["sigmoid_xent"]
    calls = {"n": 0}

    def poisoned(logits, targets):
        calls["n"] += 1
        loss = real(logits, targets)
        return loss * float("nan") if calls["n"] == 5 else loss

    monkeypatch.setitem(trainer_mod.LOSSES, "sigmoid_xent", poisoned)
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 5; last good checkpoint kept"):
        train_classifier(_spec(), ds, input_cfg, cfg, seed=0, ckpt_dir=tmp_path / "ckpt", runtime=RUNTIME,
                         progress=False)
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    assert meta["step"] == 4
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in weights.values())


def test_full_disk_while_checkpointing_is_one_line_and_keeps_previous(tiny_train, tmp_path, monkeypatch):
    ds, input_cfg, cfg = tiny_train
    from dpnrepro.training import checkpoint as ckpt_mod

    real_save = ckpt_mod.save_file
    saves = {"n": 0}

    def failing_save(tensors, path, *a, **k):
        if path.endswith("optimizer.safetensors"):
            saves["n"] += 1
            if saves["n"] == 2:
                raise OSError(errno.ENOSPC, "No space left on device", path)
        return real_save(tensors, path, *a, **k)

    monkeypatch.setattr(ckpt_mod, "save_file", failing_save)

    from dpnrepro.cli import stage

    @stage
    def main():
        train_classifier(_spec(), ds, input_cfg, cfg, seed=0, ckpt_dir=tmp_path / "ckpt", runtime=RUNTIME,
                         progress=False)

    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    assert meta["step"] == 2, "the previous complete checkpoint must survive a failed write"
    assert not list(tmp_path.glob(".ckpt.*.tmp")), "no half-written checkpoint left behind"


@pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist")
@pytest.mark.parametrize("key, value, expect", [
    ("table1.stems", ["conv", "dpnn"], "unknown stem(s) ['dpnn']; choose from conv, linear, dpn"),
    ("table1.archs", ["Q-16"], "unknown arch 'Q/16'"),
    ("model.placement", "sandwich", "unknown placement 'sandwich'; choose one of pre-pre"),
    ("data.source", "/nonexistent/fmnist", "dataset directory /nonexistent/fmnist does not exist"),
])
def test_bad_names_and_paths_fail_in_one_line_before_work(tmp_path, key, value, expect):
    project = copy_project(tmp_path / "p")
    params = tiny_params()
    section, name = key.split(".")
    params[section][name] = value
    write_params(project, params)
    proc = run([sys.executable, "stages/prepare.py"], project, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], proc.stderr
    assert not (project / "data" / "prepared").exists()


def test_user_error_is_the_base_of_training_errors():
    assert issubclass(TrainingDiverged, UserError)
