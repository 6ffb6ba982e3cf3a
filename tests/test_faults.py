"""Each row of reports/reliability.md caused for real in a scratch project: a full disk (a small tmpfs), a
file-size limit (RLIMIT_FSIZE), a read-only folder, truncated files, bad params and flags. The stage must
print one ``error: ...`` line, exit 2 and leave nothing half-written; outputs honour the umask."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import FMNIST, REPO, copy_project, git_init, run, tiny_params, write_params

# Only the fixtures that read Fashion-MNIST skip without it: the umask and mount-point tests need no data.
NEEDS_FMNIST = "needs Debian's dataset-fashion-mnist (make env)"

ONE_RUN = ["--sweep", "table1", "--arch", "Mu-7", "--stem", "dpn", "--seed", "0"]


def one_run_params() -> dict:
    """tiny_params with Table 1's first block only: the data section and one sweep (prepare in seconds)."""
    from dpnrepro.config.params import SECTIONS
    from dpnrepro.config.sweeps import SWEEPS

    params = tiny_params()
    for name in [*SWEEPS, *SECTIONS, "data_i21k", "data_jft"]:
        if name not in ("table1", "figures", "benchmark", "transfer_data"):
            params.pop(name, None)
    return params


def stage(project: Path, *args: str, limit_bytes: int | None = None) -> subprocess.CompletedProcess:
    """``python stages/<args>`` in ``project`` under umask 022 (and a file-size limit, when given)."""
    def child():
        os.umask(0o022)
        if limit_bytes is not None:  # Python ignores SIGXFSZ, so an over-long write fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return run([sys.executable, *args], project, check=False, preexec_fn=child)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The stage's one error line (exit 2, no traceback); progress bars may come before it."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr[-3000:]
    return errors[0]


def leftovers(root: Path) -> list[Path]:
    """Temporary files or folders of the atomic writers under ``root``."""
    return [p for p in root.rglob(".*") if p.name.endswith((".tmp", ".old", ".previous"))]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A project copy with one sweep's data prepared (once for the module)."""
    if not FMNIST.exists():
        pytest.skip(NEEDS_FMNIST)
    project = copy_project(tmp_path_factory.mktemp("faults") / "p")
    write_params(project, one_run_params())
    run([sys.executable, "stages/prepare.py"], project, preexec_fn=lambda: os.umask(0o022))
    return project


@pytest.fixture()
def project(prepared, tmp_path) -> Path:
    return Path(shutil.copytree(prepared, tmp_path / "p", symlinks=True))


def mount_or_skip(args: list[str], what: str) -> None:
    """``mount ARGS``, or skip the test saying what it needed and why mounting failed (``-ra`` lists it): the
    fault tests make real full disks and read-only folders, which needs root with CAP_SYS_ADMIN."""
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode:
        why = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        pytest.skip(f"NOT RUN: {what} needs `mount` (root with CAP_SYS_ADMIN); as uid {os.geteuid()}: {why[0]}")


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` read-only for this process: chmod 0555, or for root (whom modes do not stop) a read-only
    bind mount (skips where mounting is not allowed)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield "permission denied"
        finally:
            path.chmod(0o755)
        return
    mount_or_skip(["--bind", str(path), str(path)], "a read-only folder for root (whom modes do not stop)")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True, capture_output=True)
        yield "read-only file system"
    finally:
        subprocess.run(["umount", str(path)], check=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_atomic_writers_honour_the_umask(tmp_path, mask):
    import torch
    from safetensors.torch import save_file

    from dpnrepro.io import atomic_dir, write_json_atomic

    old = os.umask(mask)
    try:
        write_json_atomic(tmp_path / "a.json", {})
        with atomic_dir(tmp_path / "run") as tmp:
            save_file({"w": torch.zeros(2)}, str(tmp / "model.safetensors"))  # safetensors writes 0600
            (tmp / "sub").mkdir()
    finally:
        os.umask(old)
    for f in ("a.json", "run/model.safetensors"):
        assert mode(tmp_path / f) == 0o666 & ~mask, f
    for d in ("run", "run/sub"):
        assert mode(tmp_path / d) == 0o777 & ~mask, d


def test_a_trained_run_and_prepared_data_are_readable_by_the_team(project):
    stage(project, "stages/train.py", *ONE_RUN)
    run_dir = project / "runs/table1/Mu-7_dpn_s0"
    for folder in (project / "data/prepared", run_dir, project / "checkpoints/table1/Mu-7_dpn_s0"):
        assert mode(folder) == 0o755, folder
        files = [f for f in folder.rglob("*") if f.is_file()]
        assert files and all(mode(f) == 0o644 for f in files), [(f, oct(mode(f))) for f in files if mode(f) != 0o644]


def test_file_size_limit_while_checkpointing_is_one_line_and_writes_nothing(project):
    # the first checkpoint's optimizer state (1.7 MB for Mu/7) exceeds the limit: safetensors raises
    # SafetensorError ("os error 27"), not an OSError
    line = error_line(stage(project, "stages/train.py", *ONE_RUN, limit_bytes=1_000_000))
    assert "file too large" in line and "while writing checkpoints/table1/Mu-7_dpn_s0" in line, line
    assert not (project / "runs/table1/Mu-7_dpn_s0").exists()
    assert not (project / "checkpoints/table1/Mu-7_dpn_s0").exists()
    assert not leftovers(project / "checkpoints") and not leftovers(project / "runs")


def test_full_disk_while_checkpointing_is_one_line_and_keeps_the_previous_checkpoint(project):
    """A real ENOSPC: a 4 MB tmpfs holds one checkpoint (2.5 MB) but not the next beside it."""
    ckpt = project / "checkpoints/table1"
    ckpt.mkdir(parents=True)
    mount_or_skip(["-t", "tmpfs", "-o", "size=4m", "tmpfs", str(ckpt)], "a full disk (a 4 MB tmpfs)")
    try:
        line = error_line(stage(project, "stages/train.py", *ONE_RUN))
        assert line.startswith("error: no space left on device while writing checkpoints/table1/Mu-7_dpn_s0"), line
        meta = yaml.safe_load((ckpt / "Mu-7_dpn_s0/meta.json").read_text())
        assert meta["step"] == 4, "the previous complete checkpoint must survive a failed write"
        assert not leftovers(ckpt) and not (project / "runs/table1/Mu-7_dpn_s0").exists()
    finally:
        subprocess.run(["umount", str(ckpt)], check=True)


def test_read_only_output_folder_is_one_line_before_training(project):
    with read_only(project / "runs/table1") as says:
        line = error_line(stage(project, "stages/train.py", *ONE_RUN))
    assert line.startswith(f"error: {says} while writing runs/table1"), line
    assert not (project / "checkpoints/table1/Mu-7_dpn_s0").exists(), "it must fail before training"


def test_read_only_checkpoints_folder_is_one_line_before_training(project):
    """With ckpt_every = steps (the smoke default) the first checkpoint is the last step: a read-only
    checkpoints/ must stop the stage before it trains, not after."""
    params = one_run_params()
    params["runtime"]["ckpt_every"] = params["train"]["steps"]
    write_params(project, params)
    with read_only(project / "checkpoints/table1") as says:
        proc = stage(project, "stages/train.py", *ONE_RUN)
    line = error_line(proc)
    assert "step/s" not in proc.stderr, "it trained before failing"
    assert line.startswith(f"error: {says} while writing checkpoints/table1;"), line
    assert not (project / "runs/table1/Mu-7_dpn_s0").exists() and not leftovers(project / "runs")


@pytest.mark.parametrize("flag, value, expect", [
    ("--arch", "Mu/7", "--arch 'Mu/7' is not a run of sweep 'table1' in params.yaml; choose from Mu-7"),
    ("--stem", "dpnn", "--stem 'dpnn' is not a run of sweep 'table1' in params.yaml; choose from conv, dpn"),
    ("--seed", "7", "--seed 7 is not a run of sweep 'table1' in params.yaml; choose from 0"),
    ("--variant", "post-pre", "--variant 'post-pre' is not a run of sweep 'table1' in params.yaml; choose from none"),
])
def test_single_run_flags_name_only_runs_the_params_define(project, flag, value, expect):
    args = list(ONE_RUN)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    line = error_line(stage(project, "stages/train.py", *args))
    assert expect in line, line
    assert not (project / "runs").exists() and not (project / "checkpoints").exists()


@pytest.mark.parametrize("victim, expect", [
    ("data/prepared/train_pixels/pixels.u8", "pixel store data/prepared/train_pixels/pixels.u8 holds"),
    ("data/prepared/train/data-00000-of-00001.arrow", "prepared split data/prepared/train cannot be read"),
    ("data/prepared/manifest.json", "data/prepared/manifest.json is not valid JSON"),
])
def test_truncated_prepared_file_is_one_line(project, victim, expect):
    path = project / victim
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    line = error_line(stage(project, "stages/train.py", *ONE_RUN))
    assert expect in line and "dvc repro prepare" in line, line
    assert not (project / "runs/table1/Mu-7_dpn_s0").exists()


@pytest.mark.parametrize("section, key, value, expect", [
    ("model", "rep_size", -5, "model.rep_size: Value error, rep_size is true"),
    ("train", "lr", float("inf"), "train.lr: Input should be a finite number"),
])
def test_values_the_schema_used_to_pass_are_one_line(project, section, key, value, expect):
    params = one_run_params()
    params[section][key] = value
    write_params(project, params)
    line = error_line(stage(project, "stages/train.py", *ONE_RUN))
    assert expect in line, line
    assert not (project / "runs").exists()


def test_truncated_metrics_file_is_one_line_and_leaves_the_report(project):
    metrics = project / "metrics/table1.json"
    metrics.write_text(metrics.read_text()[:100])
    before = (project / "reports/table1.md").read_bytes()
    line = error_line(stage(project, "stages/table.py", "--table", "1"))
    assert "metrics/table1.json is not valid JSON" in line and "evaluate-table1" in line, line
    assert (project / "reports/table1.md").read_bytes() == before


def test_report_stage_writes_all_its_files_or_none(project):
    outputs = [project / p for p in ("reports/table1.md", "reports/table1.png", "metrics/table1_summary.json")]
    for path in outputs:
        path.unlink()
    with read_only(project / "metrics/headline") as says:
        line = error_line(stage(project, "stages/table.py", "--table", "1"))
    assert line.startswith(f"error: {says} while writing metrics/headline/table1.json"), line
    assert not [p for p in outputs if p.exists()], "a report's files are written all together or not at all"
    assert not leftovers(project / "reports") and not leftovers(project / "metrics")
    stage(project, "stages/table.py", "--table", "1")
    assert all(p.exists() for p in outputs)


def test_dvc_repro_failure_says_how_to_restore_the_outputs_dvc_removed(project):
    """DVC deletes a stage's outputs before running its command; the error says how to get them back."""
    git_init(project)
    metrics = project / "metrics/table1.json"
    metrics.write_text(metrics.read_text()[:100])
    proc = run(["dvc", "repro", "--single-item", "table1"], project, check=False)
    assert proc.returncode != 0
    line = next(line for line in proc.stderr.splitlines() if line.startswith("error: "))
    assert "dvc removed this stage's previous outputs before running it; `git checkout -- reports/table1.md " \
           "reports/table1.png metrics/table1_summary.json metrics/headline/table1.json` restores them" in line, line
    assert not (project / "reports/table1.md").exists(), "DVC removed it (else this test proves nothing)"
    restore = line.split("before running it; `git checkout -- ")[1].split("`")[0].split()  # not the metrics file's
    run(["git", "checkout", "--", *restore], project)
    assert (project / "reports/table1.md").read_bytes() == (REPO / "reports/table1.md").read_bytes()


def test_an_image_size_off_the_patch_grid_is_one_line_naming_the_key(project):
    """Refused by the params schema, not by timm's patch embedding after DVC emptied the outputs."""
    params = one_run_params()
    params["input"].update(image_size=27, eval_resize=27)
    write_params(project, params)
    line = error_line(stage(project, "stages/train.py", *ONE_RUN))
    assert "table1 (arch Mu-7): input.image_size 27 is not a multiple of the patch size 7 of Mu-7" in line, line
    assert not (project / "runs").exists() and not (project / "checkpoints").exists()


# --- segmentation: mmengine's checkpoints and the runs' files --------------------------------------------

SEG_CONFIG = REPO / "configs/segmentation/canvas_mu7_linear.py"
SEG_OPTIONS = {"train_cfg.max_iters": 4, "param_scheduler.0.end": 4, "default_hooks.checkpoint.interval": 2,
               "train_dataloader.batch_size": 4}


@pytest.fixture(scope="module")
def canvases(tmp_path_factory) -> Path:
    from dpnrepro.data.segmentation import export_canvases

    if not FMNIST.exists():
        pytest.skip(NEEDS_FMNIST)
    root = tmp_path_factory.mktemp("seg") / "canvases"
    export_canvases(FMNIST, root, train_images=16, val_images=3, size=84, items=(2, 4), seed=0)
    return root


def seg_config(canvases: Path, work: Path, **options):
    from dpnrepro.segmentation.experiment import run_config

    return run_config(SEG_CONFIG, arch="Mu-7", stem="dpn", fraction="1/2", seed=3, data_root=str(canvases),
                      work_dir=work, options={**SEG_OPTIONS, **options})


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of ``size`` mounted on ``path`` (skips where mounting is not allowed)."""
    path.mkdir(parents=True, exist_ok=True)
    mount_or_skip(["-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], f"a {size} tmpfs")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def scribble(path: Path) -> Path:
    """4000 random bytes over the middle of ``path`` (its length kept)."""
    import random

    data = bytearray(path.read_bytes())
    start = len(data) // 2 - 2000
    assert start > 0, path
    data[start : start + 4000] = random.Random(0).randbytes(4000)
    path.write_bytes(bytes(data))
    return path


def truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def test_full_disk_while_segmentation_checkpoints_names_it_and_leaves_no_truncated_checkpoint(canvases, tmp_path):
    """A 1 MB tmpfs on the run's work directory holds mmengine's logs but not iter_2.pth (2.6 MB)."""
    import errno

    from dpnrepro.cli import fault_message
    from dpnrepro.segmentation.experiment import train_and_evaluate

    work = tmp_path / "seg_run"
    with tmpfs(work, "1m"):
        with pytest.raises(OSError) as raised:
            train_and_evaluate(seg_config(canvases, work, **{"train_cfg.max_iters": 2, "param_scheduler.0.end": 2}))
        assert raised.value.errno == errno.ENOSPC
        line = fault_message(raised.value)
        assert line.startswith(f"no space left on device while writing {work}/iter_2.pth;"), line
        assert not list(work.glob("iter_*")) and not leftovers(work), sorted(p.name for p in work.iterdir())


def test_tmpfs_mounted_exactly_on_an_output_folder_is_one_line(tmp_path):
    """Replacing a mount point fails with EBUSY: the stage's line names the output and the fix."""
    from dpnrepro.cli import fault_message
    from dpnrepro.io import atomic_dir

    with tmpfs(tmp_path / "runs/seg", "1m") as out:
        (out / "kept.txt").write_text("old")
        with pytest.raises(OSError) as raised:
            with atomic_dir(out) as tmp:
                (tmp / "new.txt").write_text("new")
        line = fault_message(raised.value)
        assert line and line.startswith(f"device or resource busy (a mount point cannot be replaced) while writing {out};"), \
            line
        assert sorted(p.name for p in out.iterdir()) == ["kept.txt"]
    assert not leftovers(tmp_path)


class _Killed(Exception):
    pass


@pytest.mark.parametrize("damage", [truncate, scribble], ids=["truncated", "4000 random bytes"])
def test_damaged_segmentation_checkpoint_retrains_from_scratch(canvases, tmp_path, damage, capsys):
    """A run killed after its iteration-2 checkpoint, whose iter_2.pth is then damaged: the rerun says so in
    one line, trains from iteration 0 and ends with the uninterrupted run's weights."""
    import torch
    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS

    from dpnrepro.segmentation.experiment import train_and_evaluate

    probe = {"kill_at": None, "trained": []}

    @HOOKS.register_module(force=True)
    class KillAt(Hook):  # in every attempt's config: the same fingerprint
        def before_train_iter(self, runner, batch_idx, data_batch=None):
            if runner.iter == probe["kill_at"]:
                raise _Killed

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            probe["trained"].append(runner.iter)

    hooks = {"custom_hooks": [dict(type="ResumeStateHook"), dict(type="KillAt")]}
    reference = train_and_evaluate(seg_config(canvases, tmp_path / "reference", **hooks))["state_dict"]
    work = tmp_path / "killed"
    probe.update(kill_at=2)
    with pytest.raises(_Killed):
        train_and_evaluate(seg_config(canvases, work, **hooks))
    damaged = damage(work / "iter_2.pth")
    capsys.readouterr()
    probe.update(kill_at=None, trained=[])
    again = train_and_evaluate(seg_config(canvases, work, **hooks))["state_dict"]
    notes = [line for line in capsys.readouterr().err.splitlines() if "damaged" in line]
    assert notes == [f"checkpoint {damaged} is damaged (checksum mismatch); retraining killed from scratch"]
    assert probe["trained"] == [0, 1, 2, 3]
    assert all(torch.equal(again[k], reference[k]) for k in reference)


def stand_in_sweep_run(monkeypatch, root: Path, data_root: Path, options: dict):
    """One run of the segmentation sweep, in ``root``, with a stand-in for training (fixed metrics and
    weights): (a function that runs it and returns its result, the list of the trainings it did)."""
    import types

    import torch

    from dpnrepro.segmentation import sweep
    from dpnrepro.segmentation.experiment import FINGERPRINT_FILE, fingerprint
    from dpnrepro.training.distributed import DistContext

    trained = []

    def train_and_evaluate(cfg, ctx):
        trained.append(cfg.work_dir)
        Path(cfg.work_dir).mkdir(parents=True, exist_ok=True)
        (Path(cfg.work_dir) / FINGERPRINT_FILE).write_text(fingerprint(cfg))
        return {"mIoU": 1.0, "mAcc": 2.0, "aAcc": 3.0, "train_images": 8, "iters": 4,
                "state_dict": {"w": torch.arange(4000.0)}}

    monkeypatch.setattr(sweep, "train_and_evaluate", train_and_evaluate)
    monkeypatch.chdir(root)
    seg = types.SimpleNamespace(arch="Mu-7", config=str(SEG_CONFIG), data_root=str(data_root), options=options,
                                pretrained_seed=None)
    params = types.SimpleNamespace(segmentation=seg)
    return (lambda: sweep._run(params, "dpn", "1/2", 3, DistContext())), trained


def test_segmentation_run_files_honour_the_umask_and_a_damaged_one_is_retrained(canvases, tmp_path, monkeypatch,
                                                                                capsys):
    """A completed run's files in checkpoints/seg/<run> (what runs/seg copies): ordinary modes under the
    umask, and random bytes in its weights make the sweep train it again instead of reading it back."""
    run_once, trained = stand_in_sweep_run(monkeypatch, tmp_path, canvases, SEG_OPTIONS)
    mask = os.umask(0o022)
    try:
        first = run_once()
    finally:
        os.umask(mask)
    work = Path("checkpoints/seg") / first["run"]
    assert {f.name: mode(f) for f in work.iterdir()} == dict.fromkeys(os.listdir(work), 0o644)
    assert not leftovers(work)
    assert run_once() == first and len(trained) == 1  # read back
    damaged = scribble(work / "model.safetensors")
    capsys.readouterr()
    assert run_once() == first and len(trained) == 2  # trained again
    assert capsys.readouterr().err == \
        f"checkpoint {damaged} is damaged (checksum mismatch); retraining {first['run']} from scratch\n"


@pytest.mark.parametrize("victim, damage", [("meta.json", truncate), ("optimizer.safetensors", truncate),
                                            ("model.safetensors", scribble)],
                         ids=["truncated meta.json", "truncated optimizer", "4000 random bytes in the weights"])
def test_damaged_training_checkpoint_is_retrained_to_the_same_run(project, victim, damage):
    """The stage after `dvc repro` removed the run: its checkpoint is damaged, so it retrains from scratch
    (one line names the file, exit 0) and writes the run of an uninterrupted training, byte for byte."""
    stage(project, "stages/train.py", *ONE_RUN)
    run_dir = project / "runs/table1/Mu-7_dpn_s0"
    uninterrupted = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    shutil.rmtree(run_dir)
    damage(project / "checkpoints/table1/Mu-7_dpn_s0" / victim)
    proc = stage(project, "stages/train.py", *ONE_RUN)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    notes = [line for line in proc.stderr.splitlines() if "damaged" in line]
    assert notes == [f"checkpoint checkpoints/table1/Mu-7_dpn_s0/{victim} is damaged (checksum mismatch); "
                     "retraining Mu-7_dpn_s0 from scratch"], proc.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == uninterrupted
