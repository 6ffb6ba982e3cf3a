"""The write and resume paths' integrity: one checksum record (``SHA256SUMS``, training/checkpoint.py) for
training checkpoints, segmentation checkpoints and segmentation run files; a damaged record is named as
such, not the intact file it covers; kills inside ``io.all_or_nothing`` and inside a run's save leave
nothing that a rerun mistakes for damage; segmentation keeps its previous checkpoint through a failed write;
the committed kernel fingerprint is written only under the pins; the tools write through dpnrepro.io."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import FMNIST, REPO, clean_env

from dpnrepro.training.checkpoint import CHECKSUMS, read_checkpoint_meta, save_checkpoint


def _checkpoint(folder: Path) -> Path:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    save_checkpoint(folder, model=model, optimizer=opt, scheduler=None, step=3, fingerprint="a")
    return folder


def _flip_digest(record: Path, name: str) -> None:
    """One hex digit of ``name``'s recorded sha256 changed (the file itself untouched)."""
    lines = record.read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.rstrip("\n").endswith(f"  {name}"))
    lines[i] = ("0" if lines[i][0] != "0" else "1") + lines[i][1:]
    record.write_text("".join(lines))


RECORD_DAMAGES = {
    "a digest changed": lambda r: _flip_digest(r, "model.safetensors"),
    "truncated": lambda r: r.write_bytes(r.read_bytes()[: r.stat().st_size // 2]),
    "random bytes": lambda r: r.write_bytes(bytes(range(256)) * 2),
    "emptied": lambda r: r.write_bytes(b""),
}


# --- one record, and the record itself named when it is the damaged file -------------------------------------

@pytest.mark.parametrize("damage", list(RECORD_DAMAGES))
def test_a_damaged_checksum_record_is_named_not_the_intact_file(tmp_path, damage, capsys):
    ckpt = _checkpoint(tmp_path / "run")
    RECORD_DAMAGES[damage](ckpt / CHECKSUMS)
    assert read_checkpoint_meta(ckpt) is None
    err = capsys.readouterr().err
    assert err.startswith(f"checksum record {ckpt / CHECKSUMS} is damaged (") and \
        err.endswith("); retraining run from scratch\n") and err.count("\n") == 1, err


def test_a_missing_checksum_record_is_named_and_says_why_it_retrains(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "run")
    (ckpt / CHECKSUMS).unlink()
    assert read_checkpoint_meta(ckpt) is None
    assert capsys.readouterr().err == (f"checksum record {ckpt / CHECKSUMS} is missing, so its files cannot be "
                                       "verified; retraining run from scratch\n")


def test_a_damaged_file_is_still_named_beside_an_intact_record(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "run")
    (ckpt / "meta.json").write_text("{}")
    assert read_checkpoint_meta(ckpt) is None
    assert capsys.readouterr().err == \
        f"checkpoint {ckpt / 'meta.json'} is damaged (checksum mismatch); retraining run from scratch\n"


def test_a_record_written_before_it_had_its_own_sha256_is_still_read(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "run")
    record = ckpt / CHECKSUMS
    record.write_text("".join(line for line in record.read_text().splitlines(keepends=True)
                              if not line.startswith("#")))
    assert read_checkpoint_meta(ckpt)["step"] == 3 and capsys.readouterr().err == ""


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="needs coreutils' sha256sum")
def test_segmentation_checkpoints_share_the_one_record_that_sha256sum_checks(tmp_path):
    """mmengine's checkpoints go through the same record as a training checkpoint's (no ``<file>.sha256``),
    in ``sha256sum``'s format; a removed checkpoint leaves the record."""
    from dpnrepro.segmentation.resume import AtomicCheckpointBackend

    backend = AtomicCheckpointBackend()
    backend.put(b"two" * 1000, tmp_path / "iter_2.pth")
    backend.put(b"four" * 1000, tmp_path / "iter_4.pth")
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKSUMS, "iter_2.pth", "iter_4.pth"]
    backend.remove(tmp_path / "iter_2.pth")
    check = subprocess.run(["sha256sum", "-c", "--strict", CHECKSUMS], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout == "iter_4.pth: OK\n", check.stdout + check.stderr


def _resume_point(work: Path) -> Path:
    from dpnrepro.segmentation.resume import LAST_CHECKPOINT, AtomicCheckpointBackend

    AtomicCheckpointBackend().put(b"weights" * 1000, work / "iter_2.pth")
    (work / LAST_CHECKPOINT).write_text(str(work / "iter_2.pth"))
    return work


def test_segmentation_resume_point_names_a_damaged_record_or_checkpoint(tmp_path, capsys):
    from dpnrepro.segmentation.resume import verify_resume_point

    assert verify_resume_point(_resume_point(tmp_path / "intact")) and capsys.readouterr().err == ""
    work = _resume_point(tmp_path / "record")
    _flip_digest(work / CHECKSUMS, "iter_2.pth")
    assert not verify_resume_point(work) and not work.exists()
    assert capsys.readouterr().err.startswith(f"checksum record {work / CHECKSUMS} is damaged (")
    work = _resume_point(tmp_path / "checkpoint")
    (work / "iter_2.pth").write_bytes(b"other")
    assert not verify_resume_point(work) and not work.exists()
    assert capsys.readouterr().err == \
        f"checkpoint {work / 'iter_2.pth'} is damaged (checksum mismatch); retraining checkpoint from scratch\n"


# --- io.all_or_nothing: a kill between any two renames --------------------------------------------------------

def _killed_at_rename(n: int, fn) -> int:
    """Run ``fn`` in a forked child that SIGKILLs itself at its ``n``-th ``os.replace``; its wait status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            seen, real = [0], os.replace

            def replace(src, dst):
                seen[0] += 1
                if seen[0] == n:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(src, dst)

            os.replace = replace
            fn()
        finally:
            os._exit(0)
    return os.waitpid(pid, 0)[1]


def _write_both(root: Path) -> None:
    from dpnrepro.io import all_or_nothing, write_text_atomic

    with all_or_nothing():
        write_text_atomic(root / "a.md", "a new")
        write_text_atomic(root / "b.json", "b new")


@pytest.mark.parametrize("kill_at", [1, 2, 3, 4])
def test_a_kill_between_all_or_nothings_renames_leaves_every_target_and_the_next_write_cleans_up(tmp_path, kill_at):
    """SIGKILL at the n-th ``os.replace`` of a block replacing two files: every target is still there,
    whole (old or new contents), and the next block leaves the new contents and nothing beside them."""
    (tmp_path / "a.md").write_text("a old")
    (tmp_path / "b.json").write_text("b old")
    status = _killed_at_rename(kill_at, lambda: _write_both(tmp_path))
    assert os.WIFSIGNALED(status) or os.WEXITSTATUS(status) == 0
    assert (tmp_path / "a.md").read_text() in ("a old", "a new")
    assert (tmp_path / "b.json").read_text() in ("b old", "b new")
    _write_both(tmp_path)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a.md": "a new", "b.json": "b new"}


def test_a_target_left_aside_by_a_kill_is_put_back_when_read(tmp_path):
    """What the earlier scheme left after a kill between its two renames (the target at ``.<name>.previous``,
    none at its path) is put back by the next read."""
    from dpnrepro.io import read_json

    (tmp_path / ".table1.json.previous").write_text('{"a": 1}')
    assert read_json(tmp_path / "table1.json", fix="rerun") == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["table1.json"]


# --- segmentation: a run's files and their record in one unit; runs saved without a record ------------------

@pytest.fixture(scope="module")
def seg_canvases(tmp_path_factory) -> Path:
    """Real smoke canvases (the sweep checks its dataset before it trains), as test_faults makes them."""
    from dpnrepro.data.segmentation import export_canvases

    if not FMNIST.exists():
        pytest.skip("needs Debian's dataset-fashion-mnist")
    root = tmp_path_factory.mktemp("seg") / "canvases"
    export_canvases(FMNIST, root, train_images=16, val_images=3, size=84, items=(2, 4), seed=0)
    return root


@pytest.fixture()
def seg_run(seg_canvases, tmp_path, monkeypatch):
    from test_faults import SEG_OPTIONS, stand_in_sweep_run

    return stand_in_sweep_run(monkeypatch, tmp_path, seg_canvases, SEG_OPTIONS)


@pytest.mark.parametrize("kill_at", [1, 2, 3, 4])
def test_a_kill_while_a_segmentation_run_is_saved_is_never_taken_for_damage(seg_run, kill_at, capsys):
    """SIGKILL at each rename of a finished run's save: the rerun trains it again or reads it back, and never
    says that a file is damaged (the record is written inside the unit, before the result)."""
    run_once, trained = seg_run
    status = _killed_at_rename(kill_at, run_once)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    capsys.readouterr()
    assert run_once()["mIoU"] == 1.0
    err = capsys.readouterr().err
    assert "damaged" not in err and "cannot be verified" not in err, err
    trained.clear()
    assert run_once()["mIoU"] == 1.0 and trained == []  # read back


def test_a_segmentation_run_saved_without_a_record_is_retrained_and_says_why(seg_run, capsys):
    """A run saved before records were kept cannot be verified: one line says so, and it is trained again
    (the same bits, since a run is deterministic) instead of read back unchecked."""
    run_once, trained = seg_run
    first = run_once()
    work = Path("checkpoints/seg") / first["run"]
    (work / CHECKSUMS).unlink()
    capsys.readouterr()
    assert run_once() == first and len(trained) == 2
    assert capsys.readouterr().err == (f"checksum record {work / CHECKSUMS} is missing, so its files cannot be "
                                       f"verified; retraining {first['run']} from scratch\n")


# --- segmentation keeps the previous checkpoint through a failed write -----------------------------------------

@pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist")
def test_a_failed_segmentation_checkpoint_write_keeps_the_previous_one_to_resume_from(tmp_path, monkeypatch):
    """A full disk while iter_4.pth is written: iter_2.pth and last_checkpoint survive, and the rerun resumes
    at iteration 2 (not 0) and ends with the uninterrupted run's weights."""
    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS
    from test_faults import seg_config

    from dpnrepro.data.segmentation import export_canvases
    from dpnrepro.segmentation.experiment import train_and_evaluate
    from dpnrepro.segmentation.resume import AtomicCheckpointBackend

    canvases = tmp_path / "canvases"
    export_canvases(FMNIST, canvases, train_images=16, val_images=3, size=84, items=(2, 4), seed=0)
    trained = []

    @HOOKS.register_module(force=True)
    class Trained(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            trained.append(runner.iter)

    hooks = {"custom_hooks": [dict(type="ResumeStateHook"), dict(type="Trained")]}
    reference = train_and_evaluate(seg_config(canvases, tmp_path / "reference", **hooks))["state_dict"]
    real_put = AtomicCheckpointBackend.put

    def full_disk_at_iter_4(self, obj, filepath):
        if Path(filepath).name == "iter_4.pth":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(filepath))
        return real_put(self, obj, filepath)

    work = tmp_path / "work"
    monkeypatch.setattr(AtomicCheckpointBackend, "put", full_disk_at_iter_4)
    with pytest.raises(OSError):
        train_and_evaluate(seg_config(canvases, work, **hooks))
    monkeypatch.setattr(AtomicCheckpointBackend, "put", real_put)
    assert (work / "iter_2.pth").exists() and (work / "last_checkpoint").read_text().endswith("iter_2.pth")
    trained.clear()
    again = train_and_evaluate(seg_config(canvases, work, **hooks))["state_dict"]
    assert trained == [2, 3]
    assert all(torch.equal(again[k], reference[k]) for k in reference)


# --- the committed kernel fingerprint; the tools' writes ------------------------------------------------------

def test_writing_the_kernel_fingerprint_under_the_native_opt_out_is_refused(tmp_path, monkeypatch, capsys):
    from dpnrepro.determinism import fingerprint
    from dpnrepro.determinism.cpu import KERNELS_ENV

    committed = tmp_path / "kernel_fingerprint.json"
    committed.write_bytes(fingerprint.COMMITTED.read_bytes())
    monkeypatch.setattr(fingerprint, "COMMITTED", committed)
    monkeypatch.setattr(fingerprint, "report", lambda: dict.fromkeys(("machine", "versions", "in_force", "hashes"), "x"))
    for value in ("native", "environment"):
        monkeypatch.setenv(KERNELS_ENV, value)
        assert fingerprint.main(["--write"]) == 2
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1 and out.err.startswith(f"error: {KERNELS_ENV}='{value}'")
    assert committed.read_bytes() == fingerprint.COMMITTED.read_bytes() == (REPO / "tests/fixtures/"
                                                                           "kernel_fingerprint.json").read_bytes()


def test_writing_the_kernel_fingerprint_under_the_pins_replaces_the_reference_whole(tmp_path, monkeypatch, capsys):
    from dpnrepro.determinism import cpu, fingerprint

    committed = tmp_path / "kernel_fingerprint.json"
    committed.write_text("old")
    monkeypatch.setattr(fingerprint, "COMMITTED", committed)
    monkeypatch.setattr(fingerprint, "report", lambda: dict.fromkeys(("machine", "versions", "in_force", "hashes"), "x"))
    monkeypatch.delenv(cpu.KERNELS_ENV, raising=False)
    monkeypatch.setattr(cpu, "_not_in_force", None)
    assert fingerprint.main(["--write", "--json", str(tmp_path / "all.json")]) == 0
    assert json.loads(committed.read_text()) == dict.fromkeys(("machine", "versions", "in_force", "hashes"), "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.json", "kernel_fingerprint.json"]


def test_set_params_under_a_file_size_limit_is_one_line_and_leaves_params_as_they_were(tmp_path):
    params = tmp_path / "params.yaml"
    shutil.copy(REPO / "params.yaml", params)
    before = params.read_bytes()
    limit = len(before) // 2

    def child():  # Python ignores SIGXFSZ, so the over-long write fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([sys.executable, str(REPO / "tools/set_params.py"), "--file", str(params),
                           "runtime.workers=3"], env=clean_env(PYTHONDONTWRITEBYTECODE="1"),  # no truncated .pyc
                          capture_output=True, text=True, preexec_fn=child)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(f"set_params: cannot write {params}"), proc.stderr
    assert params.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_a_pack_cut_into_parts_replaces_an_earlier_single_file_pack(tmp_path, monkeypatch):
    """Packing again into parts removes the earlier one-file pack (which unpack would read first)."""
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import dvc_pack
    finally:
        sys.path.remove(str(REPO / "tools"))
    from test_dvc_pack import _dvc_project

    root = _dvc_project(tmp_path / "p", {"make": {"cmd": "head -c 5000 /dev/urandom > out.bin", "outs": ["out.bin"]}})
    subprocess.run(["dvc", "repro", "-q"], cwd=root, check=True, capture_output=True)
    out = tmp_path / "packs" / "pack.tar.gz"
    assert dvc_pack.pack(out, ["make"], [], root=root) == [out]
    monkeypatch.setattr(dvc_pack, "PART_BYTES", 1000)
    parts = dvc_pack.pack(out, ["make"], [], root=root)
    assert len(parts) > 1 and sorted(p.name for p in out.parent.iterdir()) == [p.name for p in parts]
    assert dvc_pack._read_pack(out) == b"".join(p.read_bytes() for p in parts)
