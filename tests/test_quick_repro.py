"""`make repro`'s no-op without DVC (dpnrepro.quick_repro): it answers "up to date" only after DVC said so
and nothing DVC reads has changed since; every edit, removal or target goes back to DVC."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import yaml

from dpnrepro import quick_repro
from helpers import REPO, run

PIPELINE = {"stages": {
    "first": {"cmd": "python -c \"import shutil; shutil.copy('in.txt', 'mid.txt')\"", "deps": ["in.txt"],
              "outs": ["mid.txt"]},
    "second": {"cmd": "python -c \"import os; open('out.txt', 'w').write(open('mid.txt').read() + "
                      "str(sorted(os.listdir('folder'))))\"",
               "deps": ["mid.txt", "folder"], "params": ["k"], "outs": ["out.txt"]},
}}


def _project(root: Path) -> Path:
    root.mkdir()
    (root / "in.txt").write_text("a")
    (root / "folder").mkdir()
    (root / "folder" / "x.txt").write_text("x")
    (root / "params.yaml").write_text("k: 1\n")
    (root / "dvc.yaml").write_text(yaml.safe_dump(PIPELINE, sort_keys=False))
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q"], root)
    return root


def _repro(root: Path, *args: str) -> str:
    return run([sys.executable, "-m", "dpnrepro.quick_repro", *args], root).stdout


def _edit(path: Path, text: str) -> None:
    time.sleep(0.01)  # a new mtime even on a coarse clock
    path.write_text(text)


def test_quick_path_only_after_dvc_said_up_to_date_and_never_after_an_edit(tmp_path):
    root = _project(tmp_path / "p")
    assert quick_repro.UP_TO_DATE not in _repro(root)  # ran both stages: no stamp
    assert not (root / quick_repro.STAMP).exists()
    assert quick_repro.UP_TO_DATE not in _repro(root)  # DVC ran nothing: stamp written
    assert (root / quick_repro.STAMP).is_file()
    assert _repro(root).strip() == quick_repro.UP_TO_DATE
    for edit in (lambda: _edit(root / "in.txt", "b"),  # a dep
                 lambda: _edit(root / "folder" / "y.txt", "y"),  # a new file in a dep folder
                 lambda: _edit(root / "params.yaml", "k: 2\n"),  # a param
                 lambda: (root / "out.txt").unlink()):  # an output removed
        edit()
        assert quick_repro.UP_TO_DATE not in _repro(root)  # DVC decides, and reruns
        assert quick_repro.UP_TO_DATE not in _repro(root)  # DVC says up to date: stamp again
        assert _repro(root).strip() == quick_repro.UP_TO_DATE
    assert (root / "out.txt").read_text() == "b['x.txt', 'y.txt']"
    assert quick_repro.UP_TO_DATE not in _repro(root, "second")  # targets always go to DVC


def test_a_stage_the_fingerprint_cannot_model_never_takes_the_quick_path(tmp_path):
    root = _project(tmp_path / "p")
    pipeline = json.loads(json.dumps(PIPELINE))
    pipeline["stages"]["second"]["always_changed"] = True
    (root / "dvc.yaml").write_text(yaml.safe_dump(pipeline))
    assert quick_repro.fingerprint(root) is None
    for _ in range(3):
        assert quick_repro.UP_TO_DATE not in _repro(root)


def test_the_fingerprint_covers_every_path_dvc_reads_for_the_project_pipeline():
    """Parity with DVC's own index of the real dvc.yaml: every dep, output and params file of every stage
    that `dvc repro` (no targets) reproduces is among the paths fingerprinted."""
    from dpnrepro.dvc_graph import open_repo

    ours = set(quick_repro.read_paths(REPO))
    with open_repo(REPO) as repo:
        stages = repo.index.stages
        theirs = {os.path.relpath(o.fs_path, repo.root_dir) for s in stages if s.path.endswith(f"{os.sep}dvc.yaml")
                  and os.path.dirname(s.path) == repo.root_dir for o in [*s.deps, *s.outs]}
    assert len(theirs) > 100 and theirs <= ours, sorted(theirs - ours)[:5]


def test_folders_are_walked_and_what_dvcignore_ignores_is_skipped(tmp_path):
    root = _project(tmp_path / "p")
    before = quick_repro.fingerprint(root)
    (root / "folder" / "__pycache__").mkdir()
    (root / "folder" / "__pycache__" / "m.pyc").write_bytes(b"x")
    assert quick_repro.fingerprint(root) != before  # DVC reads it: no .dvcignore
    (root / ".dvcignore").write_text("**/__pycache__/\n")
    before = quick_repro.fingerprint(root)
    (root / "folder" / "__pycache__" / "m.pyc").write_bytes(b"yy")
    assert quick_repro.fingerprint(root) == before  # DVC ignores it too
    _edit(root / "folder" / "x.txt", "z")
    assert quick_repro.fingerprint(root) != before


def test_outside_the_project_root_it_leaves_no_stamp(tmp_path):
    """From a folder with its own dvc.yaml (as study/ has), DVC decides and no .dvc/ appears there."""
    root = _project(tmp_path / "p")
    sub = root / "sub"
    sub.mkdir()
    (sub / "in.txt").write_text("s")
    (sub / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"copy": {
        "cmd": "python -c \"import shutil; shutil.copy('in.txt', 'out.txt')\"", "deps": ["in.txt"], "outs": ["out.txt"]}}}))
    for _ in range(3):
        assert quick_repro.UP_TO_DATE not in _repro(sub)
    assert (sub / "out.txt").read_text() == "s" and not (sub / ".dvc").exists()
