"""Bad inputs and faults of the machine: one line, advice that works as printed, no work thrown away.
In-process where the fault allows; the restore commands are run for real in scratch DVC projects."""

from __future__ import annotations

import gzip
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import FMNIST, REPO, copy_project, git_init, run


def _dvc_project(root: Path) -> Path:
    """A git + DVC project: stage ``make`` writes the cached folder ``out`` and the git-tracked ``m.json``,
    reproduced and committed."""
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"make": {
        "cmd": "mkdir -p out && echo a > out/a && echo b > out/b && echo '{}' > m.json",
        "outs": ["out", {"m.json": {"cache": False}}]}}}))
    git_init(root)
    run(["dvc", "init", "-q"], root)
    run(["dvc", "repro", "make"], root)
    run(["git", "add", "-A"], root)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "repro"], root)
    return root


def _command(text: str, start: str) -> list[str]:
    """The backquoted command in ``text`` that begins with ``start``."""
    return shlex.split(start + text.split(f"`{start}", 1)[1].split("`", 1)[0])


def test_printed_restore_commands_work_where_plain_dvc_checkout_does_not(tmp_path):
    """A stage that rewrote part of its cached output (lit_train after a params change), and a git-tracked
    output: `dvc checkout <stage>` refuses the first (rc 255) and restores nothing of the second; the printed
    commands restore both."""
    from dpnrepro.restore import restore_command, stage_restore_commands

    root = _dvc_project(tmp_path / "p")
    (root / "out/a").write_text("half-rewritten\n")
    (root / "m.json").write_text("{trunc")
    plain = run(["dvc", "checkout", "make"], root, check=False)
    assert plain.returncode != 0 and (root / "out/a").read_text() != "a\n", "else the test proves nothing"
    ways = stage_restore_commands("make", root)
    assert ways == ["`dvc checkout --force out`", "`git checkout -- m.json`"], ways
    assert restore_command(root / "out/a", "make", root) == "`dvc checkout --force out`"
    for way in ways:
        run(shlex.split(way.strip("`")), root)
    assert (root / "out/a").read_text() == "a\n" and (root / "m.json").read_text() == "{}\n"


@pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist")
@pytest.mark.slow  # prepares data and runs the train stage three times: minutes on 2 shared cores
def test_damaged_prepared_and_metrics_files_print_a_restore_command_that_restores_them(tmp_path):
    """The reliability rows for pixels.u8, the .arrow split, manifest.json (cached, `prepare`) and a
    git-tracked metrics file: the command in the error line, run as printed, puts the committed bytes back."""
    from test_faults import ONE_RUN, error_line, one_run_params, stage

    project = copy_project(tmp_path / "p")
    params = {**one_run_params(), "data_i21k": None, "data_jft": None}  # prepare's params deps, all present
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run([sys.executable, "stages/prepare.py"], project)
    (project / "data/raw/imagefolder").mkdir(parents=True)  # prepare's dvc.yaml dep (this params reads the idx)
    (project / "data/raw/imagefolder/.keep").touch()
    git_init(project)
    run(["dvc", "commit", "--force", "prepare"], project)  # what `dvc repro prepare` leaves: the cache holds it
    for victim in ("data/prepared/train_pixels/pixels.u8", "data/prepared/train/data-00000-of-00001.arrow",
                   "data/prepared/manifest.json"):
        path = project / victim
        good = path.read_bytes()
        path.write_bytes(good[: len(good) // 2])
        line = error_line(stage(project, "stages/train.py", *ONE_RUN))
        command = _command(line, "dvc checkout")
        assert command == ["dvc", "checkout", "--force", "data/prepared"], line
        run(command, project)
        assert path.read_bytes() == good, f"{' '.join(command)} did not restore {victim}"
    metrics = project / "metrics/table1.json"
    good = metrics.read_bytes()
    metrics.write_bytes(good[:100])
    line = error_line(stage(project, "stages/table.py", "--table", "1"))
    command = _command(line, "git checkout")
    assert command == ["git", "checkout", "--", "metrics/table1.json"], line
    run(command, project)
    assert metrics.read_bytes() == good


def test_dvc_repro_refuses_a_stage_with_an_unwritable_output_folder_before_dvc_removes_anything(tmp_path):
    """DVC deletes outputs one by one; with one folder read-only it used to lose the others, then fail on
    that one with its own error. The project's repro entry point checks every folder first."""
    from test_faults import read_only

    from dpnrepro import dvc_graph
    from dpnrepro.errors import UserError

    root = tmp_path / "p"
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"report": {
        "cmd": "mkdir -p reports headline && echo r > reports/r.md && echo h > headline/h.json",
        "outs": [{"reports/r.md": {"cache": False}}, {"headline/h.json": {"cache": False}}]}}}))
    git_init(root)
    run(["dvc", "init", "-q"], root)
    run(["dvc", "repro", "report"], root)
    with read_only(root / "headline") as says:
        with pytest.raises(UserError, match=rf"stage report not run, its outputs untouched: {says}: headline; "):
            dvc_graph.reproduce(["report"], root, force=True, single_item=True)
        assert (root / "reports/r.md").read_text() == "r\n", "DVC must not have removed the other output"
        assert dvc_graph.reproduce(["report"], root) == {}, "an up-to-date stage is not refused"
    assert list(dvc_graph.reproduce(["report"], root, force=True, single_item=True)) == ["report"]


def test_a_key_given_twice_in_params_yaml_is_one_line(tmp_path):
    from dpnrepro.config.params import load_params
    from dpnrepro.errors import ParamsError

    text = (REPO / "params.yaml").read_text()
    assert "\n  lr: " in text
    path = tmp_path / "params.yaml"
    path.write_text(text.replace("\n  lr: ", "\n  lr: 0.5\n  lr: ", 1))
    with pytest.raises(ParamsError, match=r"params.yaml is not valid YAML at line \d+: key 'lr' is given twice "
                                          r"\(first at line \d+\); DVC refuses such a file: keep one"):
        load_params(path)


def test_a_truncated_gz_dataset_file_is_one_line(tmp_path):
    from dpnrepro.data.sources import read_idx
    from dpnrepro.errors import DatasetError

    raw = gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 200]) + bytes(200))
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DatasetError, match=r"truncated or corrupt gzip file .*train-labels-idx1-ubyte.gz .*"
                                           r"reinstall the dataset"):
        read_idx(tmp_path / "train-labels-idx1-ubyte")


@pytest.mark.parametrize("workers, env, expect", [
    (-3, {}, r"--workers -3: the number of parallel runs must be a positive integer"),
    (None, {"DPNREPRO_STUDY_WORKERS": "abc"}, r"DPNREPRO_STUDY_WORKERS='abc': the number of parallel runs must be"),
    (None, {"DPNREPRO_STUDY_WORKERS": "-1"}, r"DPNREPRO_STUDY_WORKERS='-1'"),
])
def test_bad_study_worker_counts_are_one_line_before_any_work(workers, env, expect, monkeypatch):
    from dpnrepro.errors import UserError
    from dpnrepro.study import run as study_run
    from dpnrepro.study.config import load_study_params

    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def no_work(*args, **kwargs):
        raise AssertionError("the study prepared data before checking its worker count")

    monkeypatch.setattr(study_run, "prepare_study_dataset", no_work)
    params = load_study_params(REPO / "study/params.yaml")
    cell = params.cells()[0]
    with pytest.raises(UserError, match=expect):
        study_run.run_cell(params, cell, workers=workers, progress=False)


def test_a_missing_export_source_names_its_own_key(tmp_path):
    from dpnrepro.data.sources import export_idx_as_imagefolder
    from dpnrepro.errors import DatasetError

    with pytest.raises(DatasetError) as info:
        export_idx_as_imagefolder(tmp_path / "nowhere", tmp_path / "out", per_class={"train": 1})
    assert "set export_imagefolder.source in params.yaml" in str(info.value), info.value
    assert "make data" not in str(info.value) and "data.source" not in str(info.value).replace("_imagefolder.", "")


def test_a_missing_pixel_store_index_does_not_ask_to_set_the_side_already_set(tmp_path):
    from dpnrepro.data.pixel_store import PixelStore
    from dpnrepro.errors import DatasetError

    (tmp_path / "train_pixels").mkdir()
    with pytest.raises(DatasetError) as info:
        PixelStore(tmp_path / "train_pixels")
    assert "has no index.npy" in str(info.value) and "pixel_store_side" not in str(info.value), info.value
    assert "dvc repro prepare" in str(info.value)


def test_train_stage_as_a_library_without_the_pins_writes_nothing(tmp_path, monkeypatch):
    """A late import leaves the pins out of force: train_stage refuses, as the stages do, instead of
    rewriting runs/ labelled "pins not in force"."""
    from dpnrepro.config.params import load_params
    from dpnrepro.determinism import cpu
    from dpnrepro.training.run import train_stage

    params = load_params(REPO / "params.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPNREPRO_CPU_KERNELS", raising=False)
    monkeypatch.setattr(cpu, "_not_in_force", "torch was imported before dpnrepro")
    with pytest.raises(cpu.PinConflict):
        train_stage(params, "table1", progress=False)
    assert not list(tmp_path.iterdir())


def test_atomic_writers_temporaries_are_ignored_by_git(tmp_path):
    """A report stage killed before its renames leaves `.<name>.<random>.tmp` in the git-tracked reports/:
    git must not show it (it is removed when the file is next written)."""
    root = tmp_path / "p"
    (root / "reports").mkdir(parents=True)
    (root / ".gitignore").write_bytes((REPO / ".gitignore").read_bytes())
    (root / "reports/t.md").write_text("old\n")
    git_init(root)
    killed = ("import os; from dpnrepro import io; os.replace = lambda *a: os._exit(9); "
              "io.write_text_atomic('reports/t.md', 'new')")
    assert subprocess.run([sys.executable, "-c", killed], cwd=root).returncode == 9
    assert [p.name for p in (root / "reports").iterdir() if p.name.endswith(".tmp")], "no temporary left"
    status = run(["git", "status", "--porcelain"], root).stdout
    assert status == "", status


def test_a_crafted_pickle_as_segmentation_resume_point_is_one_line(tmp_path):
    pytest.importorskip("mmcv", reason="mmsegmentation needs mmcv")
    import torch

    from dpnrepro.errors import CheckpointError
    from dpnrepro.segmentation.resume import safe_mmengine_load

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch PWNED",))

    torch.save({"meta": Evil()}, tmp_path / "iter_2.pth")
    with pytest.raises(CheckpointError) as info:
        with safe_mmengine_load(tmp_path):
            torch.load(tmp_path / "iter_2.pth")
    assert "weights_only=False" not in str(info.value) and "\n" not in str(info.value), info.value
    assert f"delete {tmp_path}" in str(info.value) and not (tmp_path / "PWNED").exists()


def test_dvc_s_own_disk_errors_are_one_line_at_the_repro_entry_point_and_in_the_stage_s_hint(monkeypatch):
    """Under `ulimit -f 20` DVC's state database (sqlite) fails with "disk I/O error" when a Repo is opened:
    `python -m dpnrepro.dvc_graph repro` (make repro) says so in one line, and a stage's error line, whose
    restore hint opens the Repo, still comes out (without the hint) instead of a traceback."""
    import sqlite3

    from dpnrepro import cli, dvc_graph
    from dpnrepro.errors import UserError

    def broken(*args, **kwargs):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(dvc_graph, "open_repo", broken)
    with pytest.raises(UserError, match=r"dvc repro study_report: DVC's OperationalError: disk I/O error \(a full "
                                        r"disk or a file-size limit\?\)"):
        dvc_graph.reproduce(["study_report"])
    assert cli.restore_hint({"DVC_STAGE": "study_report", "DVC_ROOT": str(REPO)}) == ""
