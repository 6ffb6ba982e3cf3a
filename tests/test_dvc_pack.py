"""Carried DVC outputs (tools/dvc_pack.py), checked on the CPU.

The round trip: a project with tiny params runs `dvc repro table6` and packs its training and evaluation
outputs as one file through `dvc push` to a local remote; a clone of the same revision unpacks it,
`dvc pull`s, and `dvc repro table6` regenerates the report byte-identical without training a step (prepare
reruns from the raw data and gives the same hash). A pack whose training code differs from the checkout's is
refused before a training or report stage runs; a checkout of another revision, or one with local edits, is
refused before anything changes.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO, git_init, run

from dpnrepro import dvc_graph
from dpnrepro.dvc_graph import upstream_stages

STAGES = ["train-table6", "evaluate-table6"]
REPORT = ["reports/table6.md", "reports/table6.png", "metrics/table6_summary.json", "metrics/headline/table6.json"]
PIPELINE = ("dvc.yaml", "params.yaml", "dvc.lock")
DVC_PACK = [sys.executable, str(REPO / "tools/dvc_pack.py")]
GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]


def _dvc_project(root: Path, stages: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    (root / "params.yaml").write_text("x: 1\n")
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q"], root)
    git_init(root)
    return root


def test_upstream_stages_follow_a_dependency_inside_another_stages_output(tmp_path):
    """`train` reads data/upstream/jft, inside `prepare`'s output data/upstream: DVC's graph has that edge."""
    write = f"{sys.executable} -c \"import os; os.makedirs('data/upstream/jft', exist_ok=True)\""
    root = _dvc_project(tmp_path / "p", {
        "raw": {"cmd": "echo", "outs": ["raw.txt"]},
        "prepare": {"cmd": write, "deps": ["raw.txt"], "outs": ["data/upstream"]},
        "train": {"cmd": "echo", "deps": ["data/upstream/jft"], "outs": ["model.txt"]},
        "report": {"cmd": "echo", "deps": ["model.txt"], "outs": ["report.md"]},
        "other": {"cmd": "echo", "outs": ["other.txt"]},
    })
    assert upstream_stages(["train"], root) == ["raw", "prepare"]
    assert upstream_stages(["report"], root) == ["raw", "prepare", "train"]


def test_upstream_stages_of_the_pipelines_jft_training_include_prepare():
    assert upstream_stages(["train-jft_220k"], REPO) == ["export_imagefolder", "prepare"]


def _pack(project: Path, out: Path, stages: list[str], *extra: str) -> None:
    run([*DVC_PACK, "pack", str(out), "--stages", *stages, *extra], project)


def test_unpack_into_a_checkout_of_another_revision_is_refused_and_changes_nothing(tmp_path):
    made = _dvc_project(tmp_path / "made", {"make": {"cmd": "echo made > out.txt", "outs": ["out.txt"]}})
    run(["dvc", "repro"], made)
    out = tmp_path / "pack.tar.gz"
    _pack(made, out, ["make"])
    other = tmp_path / "other"
    run(["git", "clone", "-q", str(made), str(other)], tmp_path)
    (other / "params.yaml").write_text("x: 2\n")
    run([*GIT, "commit", "-qam", "another revision"], other)
    before = {name: (other / name).read_bytes() if (other / name).exists() else None for name in PIPELINE}
    refused = run([*DVC_PACK, "unpack", str(out)], other, check=False)
    assert refused.returncode == 2, refused
    assert len(refused.stderr.strip().splitlines()) == 1 and "packed at revision" in refused.stderr, refused.stderr
    assert {name: (other / name).read_bytes() if (other / name).exists() else None for name in PIPELINE} == before
    assert not (other / "out.txt").exists() and not (other / ".dvc/config.local").exists()

    run(["git", "checkout", "-q", "HEAD~1"], other)  # the packed revision: unpacked
    run([*DVC_PACK, "unpack", str(out)], other)
    assert (other / "out.txt").read_text() == "made\n"
    assert (other / "dvc.lock").read_bytes() == (made / "dvc.lock").read_bytes()


@pytest.mark.parametrize("edit", ["params.yaml", "dvc.lock", "staged"])
def test_unpack_into_a_checkout_with_local_edits_at_the_same_revision_is_refused_and_changes_nothing(tmp_path, edit):
    """The pack's pipeline files would replace the edits: refused in one line, exit 2, nothing written."""
    made = _dvc_project(tmp_path / "made", {"make": {"cmd": "echo made > out.txt", "outs": ["out.txt"]}})
    run(["dvc", "repro"], made)
    run([*GIT, "add", "-A"], made)
    run([*GIT, "commit", "-qm", "made"], made)  # dvc.lock committed: each edit below is to a tracked file
    out = tmp_path / "pack.tar.gz"
    _pack(made, out, ["make"])
    other = tmp_path / "other"
    run(["git", "clone", "-q", str(made), str(other)], tmp_path)
    (other / ("params.yaml" if edit == "staged" else edit)).write_text("x: 2\n")
    if edit == "staged":
        run(["git", "add", "params.yaml"], other)
    before = {name: (other / name).read_bytes() for name in PIPELINE}
    refused = run([*DVC_PACK, "unpack", str(out)], other, check=False)
    assert refused.returncode == 2, refused
    line = "params.yaml" if edit == "staged" else edit
    assert len(refused.stderr.strip().splitlines()) == 1 and f"has local changes to {line}" in refused.stderr, \
        refused.stderr
    assert {name: (other / name).read_bytes() for name in PIPELINE} == before
    assert not (other / "out.txt").exists() and not (other / ".dvc/config.local").exists()


@pytest.mark.slow
def test_a_clone_of_the_same_revision_pulls_the_packed_outputs_and_regenerates_the_report_without_training(
        table6_reproduced, tmp_path):
    """First a pack whose dvc.lock records other training code than the commit's (edited, then `dvc commit`):
    refused once the data stages ran, as `dvc repro` would train again. Then, in the checkout made clean again,
    the pack of the committed code: pulled, DVC's status names no stage, the report regenerated
    byte-identical, no train or evaluate stage run."""
    made = tmp_path / "made"
    shutil.copytree(table6_reproduced, made, symlinks=True)  # tiny_table6_project after `dvc repro table6`
    assert dvc_graph.status(["table6"], made) == {}
    lock = (made / "dvc.lock").read_text()
    out = tmp_path / "out" / "gpu_artifacts.tar.gz"
    _pack(made, out, STAGES, "--compare", *REPORT)
    assert out.is_file() and "cache" not in (made / ".dvc/config.local").read_text()  # one file; the remote only
    train_py = made / "stages/train.py"
    train_py.write_text(train_py.read_text() + "# another training code\n")
    run(["dvc", "commit", "-f", "train-table6"], made)  # its lock now records that code, nothing retrained
    other_code = tmp_path / "out" / "other_code.tar.gz"
    _pack(made, other_code, STAGES, "--compare", *REPORT)

    cpu = tmp_path / "cpu"
    run(["git", "clone", "-q", str(made), str(cpu)], tmp_path)  # the same revision, no outputs, no cache
    assert not (cpu / "runs").exists() and not (cpu / ".dvc/cache").exists()
    refused = run([*DVC_PACK, "unpack", str(other_code), "--repro", "table6"], cpu, check=False)
    assert refused.returncode == 2
    assert "would rerun the GPU-made stage(s) ['train-table6'" in refused.stderr, refused.stderr
    assert not (cpu / "reports/table6.md").exists() or \
        (cpu / "reports/table6.md").read_bytes() != (made / "reports/table6.md").read_bytes()  # not regenerated

    run(["git", "checkout", "--", "."], cpu)  # the refused pack's pipeline files out: a clean checkout again
    log = run([*DVC_PACK, "unpack", str(out), "--repro", "table6"], cpu).stdout
    assert "dvc repro ran ['table6']" in log, log  # prepare's outputs (remade from the raw data above) match
    assert f"{len(REPORT)} file(s) byte-identical" in log, log
    for rel in REPORT:
        assert (cpu / rel).read_bytes() == (made / rel).read_bytes(), rel
    assert (cpu / "dvc.lock").read_text() == lock
    assert dvc_graph.status(["table6"], cpu) == {}
    times = tmp_path / "times.json"
    repro = [sys.executable, "-m", "dpnrepro.dvc_graph", "repro", "--times", str(times)]
    run([*repro, "table6"], cpu)
    assert json.loads(times.read_text()) == {}  # nothing to run
    for rel in REPORT:  # the report alone, remade from the pulled outputs: the same bytes
        (cpu / rel).unlink()
    run([*repro, "--force", "--single-item", "table6"], cpu)
    assert list(json.loads(times.read_text())) == ["table6"]
    for rel in REPORT:
        assert (cpu / rel).read_bytes() == (made / rel).read_bytes(), rel


def _tar(path: Path, *members: tuple[str, str]) -> Path:
    """A gzipped tar of (name, text) regular files, or (name, link target) symlinks where the name ends in '@'."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, body in members:
            info = tarfile.TarInfo(name.rstrip("@"))
            if name.endswith("@"):
                info.type, info.linkname = tarfile.SYMTYPE, body
                tar.addfile(info)
            else:
                info.size = len(body.encode())
                tar.addfile(info, io.BytesIO(body.encode()))
    return path


@pytest.mark.parametrize("data_filter", [True, False], ids=["data filter", "python without it"])
@pytest.mark.parametrize("bad", ["../escape.txt", "ABSOLUTE", "files/../../escape.txt", "files/link@"])
def test_no_pack_member_lands_outside_the_pack_and_a_link_is_refused_in_one_line(tmp_path, monkeypatch, data_filter,
                                                                                  bad):
    """tarfile's data filter where Python has it (it refuses the rest and strips an absolute name's leading '/');
    Python 3.10.0-3.10.11 and 3.11.0-3.11.3 (Debian 12's 3.11.2) lack it, and there only files and folders inside
    the pack are taken."""
    import importlib.util
    import tarfile

    from dpnrepro.errors import UserError

    spec = importlib.util.spec_from_file_location("dvc_pack", REPO / "tools/dvc_pack.py")
    dvc_pack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dvc_pack)
    if not data_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    dest = tmp_path / "inner" / "dest"
    good = [("manifest.json", "{}"), ("files/metrics/a.json", "[1]")]
    with tarfile.open(_tar(tmp_path / "good.tar.gz", *good)) as tar:
        dvc_pack._extract(tar, dest)
    assert {p.relative_to(dest).as_posix(): p.read_text() for p in dest.rglob("*") if p.is_file()} == dict(good)
    bad = str(tmp_path / "escape.txt") if bad == "ABSOLUTE" else bad
    with tarfile.open(_tar(tmp_path / "bad.tar.gz", *good, (bad, "/etc/passwd" if bad.endswith("@") else "x"))) as tar:
        if data_filter and bad.startswith("/"):
            dvc_pack._extract(tar, tmp_path / "inner" / "other")
            assert (tmp_path / "inner" / "other" / bad.lstrip("/")).read_text() == "x"
        else:
            with pytest.raises(UserError, match="nothing was changed"):
                dvc_pack._extract(tar, tmp_path / "inner" / "other")
    assert not (tmp_path / "inner" / "escape.txt").exists() and not (tmp_path / "escape.txt").exists()
