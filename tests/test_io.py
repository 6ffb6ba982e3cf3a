"""The atomic writers (dpnrepro.io): what a failed rename, a kill between two renames, a path written twice
and a killed earlier write leave behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpnrepro import io
from dpnrepro.io import all_or_nothing, atomic_dir, write_text_atomic


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def _fail_renames_of(monkeypatch, predicate) -> list:
    """``os.replace`` fails with EIO once for the first rename whose ``(src, dst)`` satisfies ``predicate``."""
    real, failed = os.replace, []

    def replace(src, dst):
        if not failed and predicate(Path(src), Path(dst)):
            failed.append((src, dst))
            raise OSError(5, "Input/output error", str(dst))
        return real(src, dst)

    monkeypatch.setattr(io.os, "replace", replace)
    return failed


# --- atomic_dir ----------------------------------------------------------------------------------------


def test_atomic_dir_restores_the_previous_output_when_the_second_rename_fails(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("old")
    failed = _fail_renames_of(monkeypatch, lambda src, dst: dst == out and src.name.endswith(".tmp"))
    with pytest.raises(OSError, match="Input/output error"):
        with atomic_dir(out) as tmp:
            (tmp / "a.txt").write_text("new")
    assert failed
    assert _tree(out) == {"a.txt": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no .out.old, no .out.*.tmp


_KILLED_BETWEEN_RENAMES = """
    import os, signal, sys
    from pathlib import Path
    from dpnrepro.io import atomic_dir

    out = Path(sys.argv[1])
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("old")
    real = os.replace

    def replace(src, dst):
        if Path(dst) == out:  # the previous output is aside, the new one not yet in place
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst)

    os.replace = replace
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("new")
"""


@pytest.fixture()
def killed_between_renames(tmp_path) -> Path:
    """An output whose writer was SIGKILLed between atomic_dir's two renames (a real kill, in a child)."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_KILLED_BETWEEN_RENAMES), str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert not out.exists() and _tree(tmp_path / ".out.old") == {"a.txt": "old"}
    return out


def test_a_kill_between_the_renames_loses_nothing_the_next_write_recovers_it(killed_between_renames):
    out = killed_between_renames
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_dir(out):
            raise RuntimeError("boom")
    assert _tree(out) == {"a.txt": "old"}
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]


def test_a_kill_between_the_renames_then_a_successful_write(killed_between_renames):
    out = killed_between_renames
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("newer")
    assert _tree(out) == {"a.txt": "newer"}
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]


def test_atomic_dir_removes_only_its_own_stale_temporaries(tmp_path):
    own = tmp_path / ".out.k2x9_ab7.tmp"  # a killed earlier attempt at `out`
    other_target = tmp_path / ".out.json.k2x9_ab7.tmp"  # a write of out.json in progress
    users = tmp_path / ".out.notes.tmp"
    for p in (own, other_target, users):
        p.mkdir()
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "a.txt").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", other_target.name, users.name])


# --- all_or_nothing ------------------------------------------------------------------------------------


@pytest.fixture()
def originals(tmp_path) -> dict[str, Path]:
    paths = {"a": tmp_path / "a.md", "b": tmp_path / "b.json"}
    for name, path in paths.items():
        path.write_text(f"{name} original")
    return paths


def test_all_or_nothing_commits_every_file_and_leaves_no_temporary(tmp_path, originals):
    with all_or_nothing():
        write_text_atomic(originals["a"], "a new")
        write_text_atomic(originals["b"], "b new")
        write_text_atomic(tmp_path / "c.png", "c new")
        assert originals["a"].read_text() == "a original"  # nothing replaced before the block ends
        assert not (tmp_path / "c.png").exists()
    assert _tree(tmp_path) == {"a.md": "a new", "b.json": "b new", "c.png": "c new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md", "b.json", "c.png"]


def test_all_or_nothing_failing_block_replaces_nothing(tmp_path, originals):
    with pytest.raises(RuntimeError, match="boom"):
        with all_or_nothing():
            write_text_atomic(originals["a"], "a new")
            write_text_atomic(tmp_path / "c.png", "c new")
            raise RuntimeError("boom")
    assert _tree(tmp_path) == {"a.md": "a original", "b.json": "b original"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md", "b.json"]


def test_all_or_nothing_failing_rename_rolls_every_file_back(tmp_path, originals, monkeypatch):
    failed = _fail_renames_of(monkeypatch, lambda src, dst: dst == originals["b"] and src.name.endswith(".tmp"))
    with pytest.raises(OSError) as raised:
        with all_or_nothing():
            write_text_atomic(tmp_path / "c.png", "c new")
            write_text_atomic(originals["a"], "a new")
            write_text_atomic(originals["b"], "b new")
    assert failed and raised.value.dpnrepro_target == str(originals["b"])
    assert _tree(tmp_path) == {"a.md": "a original", "b.json": "b original"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md", "b.json"]


def test_all_or_nothing_path_written_twice_keeps_its_original_for_rollback(tmp_path, originals, monkeypatch):
    failed = _fail_renames_of(monkeypatch, lambda src, dst: dst == originals["b"] and src.name.endswith(".tmp"))
    with pytest.raises(OSError):
        with all_or_nothing():
            write_text_atomic(originals["a"], "a first")
            write_text_atomic(originals["a"], "a second")
            write_text_atomic(originals["b"], "b new")
    assert failed
    assert _tree(tmp_path) == {"a.md": "a original", "b.json": "b original"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md", "b.json"]


def test_all_or_nothing_path_written_twice_gets_its_last_contents(tmp_path, originals):
    with all_or_nothing():
        write_text_atomic(originals["a"], "a first")
        write_text_atomic(originals["a"], "a second")
    assert _tree(tmp_path) == {"a.md": "a second", "b.json": "b original"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md", "b.json"]


# --- temporaries of a killed earlier write -------------------------------------------------------------


@pytest.mark.parametrize("in_block", [False, True])
def test_a_successful_write_removes_its_targets_stale_temporaries_only(tmp_path, in_block):
    """A report stage killed mid-write left ``.table1.md.<random>.tmp``: the next successful write of
    table1.md removes it, and no temporary of another target, nor a user's file."""
    stale = tmp_path / ".table1.md.q8v_3kzp.tmp"
    kept = [tmp_path / ".table1.md.json.q8v_3kzp.tmp", tmp_path / ".table2.md.q8v_3kzp.tmp",
            tmp_path / ".table1.md.draft.tmp", tmp_path / "table1.md.tmp"]
    for p in (stale, *kept):
        p.write_text("partial")
    if in_block:
        with all_or_nothing():
            write_text_atomic(tmp_path / "table1.md", "| table |")
    else:
        write_text_atomic(tmp_path / "table1.md", "| table |")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["table1.md", *(p.name for p in kept)])
