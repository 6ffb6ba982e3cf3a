"""The pull-request report (tools/pr_report.py, docs/ci.md) on real commits of a scratch clone: a params change
that reaches Table 6 names the param, the stages it reran, the Table 6 numbers that moved and the tables that
changed, and nothing of the tables it did not reach; a change that reaches no stage reads "Nothing changed".

``DPNREPRO_WRITE_PR_SAMPLE=1`` also writes the Table 6 scenario's report to reports/pr-report-sample.md."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO, dvc_repro, run, write_params

sys.path.insert(0, str(REPO / "tools"))
import pr_report  # noqa: E402

GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
REPORT = [sys.executable, str(REPO / "tools/pr_report.py")]
SAMPLE = REPO / "reports/pr-report-sample.md"
UNTOUCHED = ("table1", "table2", "table3", "table4", "table5", "table7", "figure1", "figures", "study")


def _commit(root: Path, message: str) -> None:
    run([*GIT, "add", "-A"], root)
    run([*GIT, "commit", "-qm", message], root)


def _table6_headline(root: Path, rev: str | None = None) -> dict[str, object]:
    """Table 6's headline values at ``rev`` (the working tree without one), as ``{dotted key: leaf}``."""
    rel = "metrics/headline/table6.json"
    text = run(["git", "show", f"{rev}:{rel}"], root).stdout if rev else (root / rel).read_text()
    return pr_report.flatten(json.loads(text))


@pytest.fixture(scope="module")
def table6_project(table6_reproduced, tmp_path_factory):
    """A scratch clone whose last commit holds Table 6's smoke outputs (tiny params: Mu/7, DPN and pre-LN,
    one seed, 4 steps)."""
    root = tmp_path_factory.mktemp("pr_report") / "base"
    shutil.copytree(table6_reproduced, root, symlinks=True)
    _commit(root, "base: Table 6's outputs")
    return root


@pytest.mark.slow
def test_a_params_change_that_reaches_table6_reports_its_params_stages_metrics_and_tables(table6_project, tmp_path):
    root = tmp_path / "pr"
    shutil.copytree(table6_project, root, symlinks=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["table6"]["recipe"] = {"train": {"lr": 0.01}}
    write_params(root, params)
    _commit(root, "table6: lr 0.01")
    ran = dvc_repro(root, "table6")
    assert "train-table6" in ran and "prepare" not in ran, ran

    out = root / "reports/pr-report-sample.md"
    run([*REPORT, "--base", "HEAD~1", "--out", str(out)], root)
    report = out.read_text()
    print(report)
    assert "| `params.yaml`: `table6.recipe.train.lr` | — | 0.01 |" in report
    assert "`train-table6`, `evaluate-table6`, `table6`\n" in report
    old, new = _table6_headline(root, "HEAD~1"), _table6_headline(root)
    changed = [k for k in new if old.get(k) != new[k]]
    assert any(not k.endswith(".verdict") for k in changed)  # the lr moved Table 6's numbers
    for key in changed:
        if key.endswith(".verdict"):
            assert f"| table6 | `{key.removesuffix('.verdict')}` | {old.get(key) or '—'} | **{new[key]}** |" in report
        else:
            assert f"| table6 | `{key}` | {old[key]:.4g} | {new[key]:.4g} | {new[key] - old[key]:+.4g} |" in report
    if not any(k.endswith(".verdict") for k in changed):
        assert "None: every verdict reads as at base." in report
    assert "- [reports/table6.md](table6.md)" in report and "![reports/table6.png](table6.png)" in report
    entries = "\n".join(line for line in report.splitlines() if not line.startswith("#")).replace("table6", "")
    for name in UNTOUCHED:  # no param, stage, metric or file of the tables the change did not reach
        assert name not in entries, name
    if os.environ.get("DPNREPRO_WRITE_PR_SAMPLE") == "1":
        SAMPLE.write_text(report)


@pytest.mark.slow
def test_a_change_that_reaches_no_stage_reports_that_nothing_changed(table6_project, tmp_path):
    root = tmp_path / "docs-only"
    shutil.copytree(table6_project, root, symlinks=True)
    (root / "README.md").write_text((root / "README.md").read_text() + "\nA line.\n")
    _commit(root, "README: a line")
    assert dvc_repro(root, "table6") == {}
    report = run([*REPORT, "--base", "HEAD~1"], root).stdout
    assert "**Nothing changed**" in report and "###" not in report, report


def _metrics_project(root: Path) -> Path:
    """A DVC project whose two report stages declare headline metrics, as dvc.yaml does (no training)."""
    root.mkdir()
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q"], root)
    stages = {name: {"cmd": f"python make.py {name}", "deps": ["make.py", "verdicts.json"],
                     "metrics": [{f"metrics/headline/{name}.json": {"cache": False}}]} for name in ("table6", "new")}
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    (root / "make.py").write_text(
        "import json, pathlib, sys\n"
        "v = json.loads(pathlib.Path('verdicts.json').read_text())\n"
        "p = pathlib.Path(f'metrics/headline/{sys.argv[1]}.json'); p.parent.mkdir(parents=True, exist_ok=True)\n"
        "p.write_text(json.dumps({'Mu/7': {'pre': {'gain_over_dpn': {'mean': v['mean'], 'verdict': v['verdict']}}}}))\n")
    return root


def test_a_flipped_verdict_and_a_stage_base_had_no_outputs_for_are_listed(tmp_path):
    root = _metrics_project(tmp_path / "p")
    (root / "verdicts.json").write_text('{"mean": 0.5, "verdict": "not resolved"}')
    run(["dvc", "repro", "table6"], root)
    _commit(root, "base")
    (root / "verdicts.json").write_text('{"mean": 2.5, "verdict": "better"}')
    run(["dvc", "repro"], root)  # table6 reruns, `new` runs for the first time
    report = pr_report.build(root, "HEAD")
    print(report)
    assert "| table6 | `Mu/7.pre.gain_over_dpn` | not resolved | **better** |" in report
    assert "| new | `Mu/7.pre.gain_over_dpn` | — | **better** |" in report
    assert "| table6 | `Mu/7.pre.gain_over_dpn.mean` | 0.5 | 2.5 | +2 |" in report
    assert "| new | `Mu/7.pre.gain_over_dpn.mean` | — | 2.5 | — |" in report
    assert "`table6`, `new` (new)\n" in report
    assert pr_report.main(["--root", str(root), "--base", "no-such-rev"]) == 2


def test_a_push_that_creates_the_branch_compares_with_the_first_parent(tmp_path):
    """GitHub's `before` of a push that creates the branch is forty zeros: the first parent stands in for it
    (a fault with exit 2 otherwise), and a revision that does not exist is still one error line."""
    run(["git", "init", "-q"], tmp_path)
    for i in range(2):
        (tmp_path / "f.txt").write_text(f"{i}\n")
        _commit(tmp_path, f"commit {i}")
    parent = run(["git", "rev-parse", "HEAD~1"], tmp_path).stdout.strip()
    assert pr_report.resolve(tmp_path, pr_report.NO_BASE) == parent
    with pytest.raises(pr_report.ReportError, match="not a git revision"):
        pr_report.resolve(tmp_path, "1" * 40)
