"""Failures the user must see as one line, with nothing lost: NaN loss, bad names, misleading messages.
The faults of the machine (full disk, read-only folders, truncated files) are caused for real in
tests/test_faults.py."""

from __future__ import annotations

import errno
import json
import re
import sys

import pytest
import torch

from dpnrepro.config.runtime import RuntimeParams
from dpnrepro.errors import UserError
from dpnrepro.training import trainer as trainer_mod
from dpnrepro.artifacts import ModelSpec
from dpnrepro.training.trainer import TrainingDiverged, train_classifier
from helpers import FMNIST, copy_project, imported_packages, run, tiny_params, write_params


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
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 5; last good checkpoint \(step 4\) kept"):
        train_classifier(_spec(), ds, input_cfg, cfg, seed=0, ckpt_dir=tmp_path / "ckpt", runtime=RUNTIME,
                         progress=False)
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    assert meta["step"] == 4
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in weights.values())


def test_nan_before_this_run_s_first_checkpoint_claims_no_checkpoint(tiny_train, tmp_path, monkeypatch):
    """A checkpoint of another configuration in ckpt_dir is not "the last good checkpoint" of this run."""
    ds, input_cfg, cfg = tiny_train
    real = trainer_mod.LOSSES["sigmoid_xent"]
    train_classifier(_spec(), ds, input_cfg, cfg.model_copy(update={"lr": cfg.lr / 2}), seed=0,
                     ckpt_dir=tmp_path / "ckpt", runtime=RUNTIME, progress=False)  # another configuration's
    monkeypatch.setitem(trainer_mod.LOSSES, "sigmoid_xent", lambda logits, targets: real(logits, targets) * float("nan"))
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 1; no checkpoint of this run was written "
                                               r"before it \(runtime.ckpt_every: 2\)"):
        train_classifier(_spec(), ds, input_cfg, cfg, seed=0, ckpt_dir=tmp_path / "ckpt", runtime=RUNTIME,
                         progress=False)


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


def test_missing_source_split_names_the_params_key(tmp_path, hf_cache_in_tmp):
    from conftest import data_cfg, make_image_folder
    from dpnrepro.data.prepare import prepare_dataset

    root = make_image_folder(tmp_path / "folder")
    with pytest.raises(UserError, match=r"has no split\(s\) \['validation'\].*; fix data.eval_split$"):
        prepare_dataset(data_cfg(root, format="imagefolder", num_classes=2, eval_split="validation"), tmp_path / "out")


def test_skipped_files_and_empty_class_folders_are_said_once(tmp_path, hf_cache_in_tmp, capsys):
    from conftest import data_cfg, make_image_folder
    from dpnrepro.data.prepare import prepare_dataset

    root = make_image_folder(tmp_path / "folder", classes=("a", "b", "c"))
    (root / "train/a/README.txt").write_text("how these images were taken\n")
    (root / "train/a/notes.md").write_text("more\n")
    for split in ("train", "test"):
        for f in (root / split / "c").iterdir():
            f.unlink()
    prepare_dataset(data_cfg(root, format="imagefolder", num_classes=2, minival_fraction=0.25), tmp_path / "out")
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    assert notes == [f"note: image folder {root}: skipped 2 files that are not images (train/a/README.txt, ...) "
                     "and 2 empty class folders (train/c, ...)"], notes


def test_bad_recipe_value_is_reported_at_its_key_in_the_recipe():
    import copy

    import yaml

    from dpnrepro.config.params import parse_params
    from dpnrepro.errors import ParamsError
    from helpers import REPO

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    bad = copy.deepcopy(raw)
    bad["vtab"]["recipe"]["input"]["image_size"] = 49
    with pytest.raises(ParamsError, match=r"vtab\.recipe\.input: Value error, eval_resize \(28\) must be >= image_size"):
        parse_params(bad)


@pytest.mark.parametrize("cut", ["row", "value"])
def test_truncated_gradient_log_is_blamed_on_the_file_not_on_figures_last_steps(tmp_path, cut, monkeypatch):
    from dpnrepro.reports import figures

    (tmp_path / "dvc.yaml").write_text("stages:\n  train-table1:\n    cmd: x\n    outs:\n    - runs/table1\n")
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "runs/table1/Mu-7_dpn_s0" / figures.GRAD_DIR
    folder.mkdir(parents=True)
    for layer in ("stem", "block_00"):
        (folder / f"{layer}.tsv").write_text(f"timestamp\tstep\t{layer}\n" +
                                             "".join(f"0\t{s}\t0.5\n" for s in range(0, 12, 2)))
    stem = folder / "stem.tsv"
    text = stem.read_text()
    stem.write_text(text[: text.rindex("0\t8\t")] if cut == "row" else text[:-4])
    expect = "ends at step 6, the run's other layers at step 10: the file is truncated" if cut == "row" \
        else "is truncated or malformed at line 7"
    with pytest.raises(UserError, match=expect) as info:
        figures.read_grad_norms(tmp_path / "runs/table1/Mu-7_dpn_s0")
    assert "stem.tsv" in str(info.value) and "restore it with `dvc checkout --force runs/table1`" in str(info.value)


def test_restore_hint_names_dvc_checkout_for_cached_and_git_checkout_for_tracked_outputs(tmp_path):
    from dpnrepro.cli import restore_hint

    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  prepare:\n    cmd: x\n    outs:\n    - data/prepared\n"
        "  table1:\n    cmd: x\n    outs:\n    - reports/table1.md:\n        cache: false\n"
        "    metrics:\n    - metrics/headline/table1.json:\n        cache: false\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/dvc.yaml").write_text("stages:\n  bench:\n    cmd: x\n    outs:\n    - out.json:\n        persist: true\n")
    env = {"DVC_ROOT": str(tmp_path)}
    assert restore_hint(env) == ""  # not under dvc repro: nothing was removed
    assert restore_hint({**env, "DVC_STAGE": "prepare"}).endswith("; `dvc checkout --force data/prepared` restores them)")
    assert restore_hint({**env, "DVC_STAGE": "table1"}).endswith(
        "; `git checkout -- reports/table1.md metrics/headline/table1.json` restores them)")
    assert restore_hint({**env, "DVC_STAGE": "sub/dvc.yaml:bench"}) == ""  # persist: DVC keeps it


@pytest.mark.parametrize("flags, expect", [
    (["--stem", "dpnn"], "--stem 'dpnn' is not a run of segmentation in params.yaml; choose from"),
    (["--fraction", "1/16"], "--fraction '1/16' is not a run of segmentation in params.yaml; choose from"),
    (["--seed", "3"], "--seed 3 is not a run of segmentation in params.yaml; choose from"),
])
def test_segment_one_run_flags_name_the_valid_values(tmp_path, flags, expect):
    """A filter that matches no run of the params is refused in one line, not 'trained 0 run(s)', and before
    torch and mmseg load (seconds of imports for a typo)."""
    project = copy_project(tmp_path / "p")
    proc = run([sys.executable, "-X", "importtime", "stages/segment.py", *flags], project, check=False)
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and len(lines) == 1 and expect in lines[0], proc.stderr
    loaded = imported_packages(proc.stderr)
    assert loaded and not loaded & {"torch", "mmseg", "mmengine"}, sorted(loaded & {"torch", "mmseg", "mmengine"})
    assert not (project / "checkpoints").exists() and not (project / "runs").exists()


@pytest.fixture()
def saved_split(tmp_path):
    """A tiny prepared split written by ``datasets``: ``(prepared folder, split folder)``."""
    import datasets

    datasets.Dataset.from_dict({"label": [0, 1, 2]}).save_to_disk(str(tmp_path / "prepared" / "train"))
    return tmp_path / "prepared", tmp_path / "prepared" / "train"


def _fail_opening(monkeypatch, folder, exc: BaseException) -> None:
    """``open`` raises ``exc`` for the files in ``folder`` (what datasets reads a split's metadata with)."""
    import builtins

    real_open = builtins.open

    def faulty_open(file, *args, **kwargs):
        if str(file).startswith(str(folder)):
            raise exc
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", faulty_open)


@pytest.mark.parametrize("fault", [
    PermissionError(errno.EACCES, "Permission denied"),
    OSError(errno.EIO, "Input/output error"),
    MemoryError(),
], ids=["EACCES", "EIO", "MemoryError"])
def test_a_fault_of_the_machine_reading_prepared_data_keeps_its_cause(saved_split, monkeypatch, fault):
    """Not blamed on the data ("rerun dvc repro prepare"): the fault itself reaches the stage."""
    from dpnrepro.cli import fault_message
    from dpnrepro.data.loader import load_split

    prepared, split = saved_split
    if isinstance(fault, OSError):
        fault.filename = str(split / "state.json")
    _fail_opening(monkeypatch, split, fault)
    with pytest.raises(type(fault)) as caught:
        load_split(prepared, "train")
    assert caught.value is fault
    if isinstance(fault, PermissionError):
        assert fault_message(caught.value).startswith(f"permission denied: {split / 'state.json'}; ")


def test_an_unreadable_prepared_file_is_a_permission_fault(saved_split):
    """The same, caused for real: a split file the user may not read (modes do not stop root)."""
    import os

    from dpnrepro.cli import fault_message
    from dpnrepro.data.loader import load_split

    if os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    prepared, split = saved_split
    (split / "state.json").chmod(0)
    with pytest.raises(PermissionError) as caught:
        load_split(prepared, "train")
    assert fault_message(caught.value).startswith("permission denied")


def test_a_misplaced_prepared_file_is_damaged_data(saved_split):
    """A folder where the split's data file belongs is data to rebuild, said in one line."""
    from dpnrepro.data.loader import load_split
    from dpnrepro.errors import DatasetError

    prepared, split = saved_split
    arrow = next(split.glob("*.arrow"))
    arrow.unlink()
    arrow.mkdir()
    with pytest.raises(DatasetError, match=r"prepared split .*train cannot be read .*rerun `dvc repro prepare`"):
        load_split(prepared, "train")


def _run_stage(script: str, *args: str) -> int:
    """``python stages/<script> <args>`` in this process (the working folder as set); its exit code."""
    import runpy

    from helpers import REPO

    sys.argv = [script, *args]
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / "stages" / script), run_name="__main__")
    return exc.value.code


@pytest.mark.parametrize("cut", [0, 0.5])
def test_a_damaged_study_cell_is_one_line_naming_it_and_how_to_restore_it(tmp_path, monkeypatch, capsys, cut):
    import shutil

    from helpers import REPO

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delenv("DVC_STAGE", raising=False)
    shutil.copytree(REPO / "metrics/study", tmp_path / "metrics/study")
    cell = tmp_path / "metrics/study/mnist-Mu-7-short.json"
    cell.write_text(cell.read_text()[: int(len(cell.read_text()) * cut)])
    assert _run_stage("study_report.py") == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: metrics/study/mnist-Mu-7-short.json is not valid JSON (" + err.split(" (", 1)[1]) and \
        err.endswith("; restore it with `git checkout -- metrics/study/mnist-Mu-7-short.json` or rerun "
                     "`dvc repro study/dvc.yaml:study-mnist-Mu-7-short`"), err
    assert not (tmp_path / "reports").exists()


def test_a_missing_or_damaged_paper_table_names_the_file_and_how_to_restore_it(tmp_path, monkeypatch):
    from dpnrepro.reports.paper import load_paper_table

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPNREPRO_ROOT", str(tmp_path))
    table = tmp_path / "reports/paper/table1.yaml"
    table.parent.mkdir(parents=True)
    restore = "restore the transcription with `git checkout -- reports/paper/table1.yaml`"
    with pytest.raises(UserError, match=f"^{re.escape(f'{table} is missing; {restore}')}$"):
        load_paper_table(1)
    for damaged, says in [("", "holds nothing, not a mapping"), ("- a list\n", "holds list, not a mapping"),
                          ("rows:\n  - {arch: B/16, value: '7", "is not valid YAML")]:
        table.write_text(damaged)
        with pytest.raises(UserError) as exc:
            load_paper_table(1)
        assert str(exc.value).startswith(f"{table} {says}") and str(exc.value).endswith(restore), exc.value


def test_study_params_that_are_not_utf8_are_one_params_error(tmp_path):
    from dpnrepro.errors import ParamsError
    from dpnrepro.study.config import load_study_params

    path = tmp_path / "params.yaml"
    path.write_bytes(b"study:\n  threads_per_run: \xff\n")
    with pytest.raises(ParamsError, match=r"params.yaml is not UTF-8 text .*; restore it with `git checkout -- "
                                          r"study/params.yaml`"):
        load_study_params(path)
