"""The fork's CI (.github/workflows/smoke.yml) cannot run here, so it is checked as far as a machine without
GitHub can: actionlint passes, every `run:` step is a Makefile target (with variables the target reads) or a
script these tests run, and those scripts do what the workflow relies on."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpnrepro import dvc_graph
from helpers import REPO, run

WORKFLOW = REPO / ".github/workflows/smoke.yml"
DVC_REMOTE_SH = ".github/ci/dvc_remote.sh"
POST_REPORT_SH = ".github/ci/post_report.sh"
SCRIPTS_RUN_HERE = (DVC_REMOTE_SH, POST_REPORT_SH)  # each run by a test below
GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]


def run_commands(workflow: Path = WORKFLOW) -> list[str]:
    """The ``run:`` command of every step of every job."""
    jobs = yaml.safe_load(workflow.read_text())["jobs"]
    return [step["run"].strip() for job in jobs.values() for step in job["steps"] if "run" in step]


def makefile_targets(makefile: Path = REPO / "Makefile") -> set[str]:
    return set(re.findall(r"^([\w-]+):(?!=)", makefile.read_text(), flags=re.M))


def unfit_commands(commands: list[str], makefile: Path = REPO / "Makefile") -> list[str]:
    """The commands that are neither ``make <target> [VAR=value ...]`` (a target of the Makefile, each VAR
    read by it) nor ``bash <script>`` of :data:`SCRIPTS_RUN_HERE`, nor a single command."""
    targets, text, bad = makefile_targets(makefile), makefile.read_text(), []
    for command in commands:
        words = shlex.split(command) if "\n" not in command else []
        if words[:1] == ["make"] and len(words) >= 2 and words[1] in targets:
            unread = [w.split("=")[0] for w in words[2:] if "=" not in w or f"$({w.split('=')[0]})" not in text]
            if not unread:
                continue
        elif words[:1] == ["bash"] and len(words) >= 2 and words[1] in SCRIPTS_RUN_HERE:
            continue
        bad.append(command)
    return bad


def test_actionlint_passes_on_the_workflow():
    actionlint = Path(sys.executable).parent / "actionlint"
    assert actionlint.is_file(), "actionlint is not installed: requirements/base.txt pins it (make env)"
    proc = subprocess.run([str(actionlint), "-no-color", str(WORKFLOW.relative_to(REPO))], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_run_step_is_a_make_target_or_a_script_the_suite_runs():
    commands = run_commands()
    assert {c.split()[1] for c in commands if c.startswith("make ")} >= {"env", "repro", "test-fast", "pr-report"}
    assert unfit_commands(commands) == []
    # the check itself: an ad-hoc command, an unknown target and a variable no target reads are refused
    assert unfit_commands(["pip install x", "make no-such-target", "make pr-report BASE=x NOPE=1",
                           "bash tools/other.sh"]) == ["pip install x", "make no-such-target",
                                                       "make pr-report BASE=x NOPE=1", "bash tools/other.sh"]


def _dvc_project(root: Path) -> Path:
    """A git + DVC project with one cached output and the CI scripts."""
    root.mkdir(parents=True)
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q"], root)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"make": {"cmd": "echo made > out.txt",
                                                                       "outs": ["out.txt"]}}}))
    for rel in SCRIPTS_RUN_HERE:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, root / rel)
    run(["dvc", "repro", "-q"], root)
    run([*GIT, "add", "-A"], root)
    run([*GIT, "commit", "-qm", "made"], root)
    return root


def _ci_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PR_", "GH_", "DVC_REMOTE"))}
    return dict(env, VENV=str(Path(sys.executable).parent.parent), DVC_NO_ANALYTICS="1", **extra)


def test_dvc_remote_script_pulls_from_the_secret_s_remote_and_goes_on_without_one(tmp_path):
    made = _dvc_project(tmp_path / "made")
    remote = tmp_path / "remote"
    run(["dvc", "remote", "add", "--local", "store", str(remote)], made)
    run(["dvc", "push", "-q", "-r", "store"], made)
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(made), str(clone)], tmp_path)
    script = ["bash", DVC_REMOTE_SH]

    none = subprocess.run(script, cwd=clone, env=_ci_env(), capture_output=True, text=True)
    assert none.returncode == 0 and "no DVC remote" in none.stdout, none
    assert not (clone / "out.txt").exists()

    broken = subprocess.run(script, cwd=clone, env=_ci_env(DVC_REMOTE_URL=str(tmp_path / "nowhere")),
                            capture_output=True, text=True)
    assert broken.returncode == 0 and "warning: dvc pull did not bring every output" in broken.stderr, broken
    assert not (clone / "out.txt").exists()

    pulled = subprocess.run(script, cwd=clone, env=_ci_env(DVC_REMOTE_URL=str(remote)), capture_output=True,
                            text=True)
    assert pulled.returncode == 0 and "pulled the cache" in pulled.stdout, pulled
    assert (clone / "out.txt").read_text() == "made\n"
    assert dvc_graph.status([], clone) == {}  # dvc repro would rerun nothing
    assert str(remote) not in (clone / ".dvc/config").read_text()  # the secret stays out of tracked files


@pytest.fixture
def fake_gh(tmp_path):
    """A ``gh`` on PATH that records its arguments and, like gh before a first comment, fails ``--edit-last``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "gh.log"
    (bin_dir / "gh").write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$*" in *--edit-last*) exit 1;; esac\n')
    (bin_dir / "gh").chmod(0o755)
    return bin_dir, log


def test_post_report_script_fills_the_job_summary_and_comments_on_a_pull_request(tmp_path, fake_gh):
    bin_dir, log = fake_gh
    report = tmp_path / "pr-report.md"
    report.write_text("## report\n")
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    script = ["bash", str(REPO / POST_REPORT_SH), str(report)]
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"

    push = subprocess.run(script, env=_ci_env(GITHUB_STEP_SUMMARY=str(summary), PATH=path, GH_TOKEN="t"),
                          capture_output=True, text=True)
    assert push.returncode == 0, push
    assert summary.read_text() == "earlier step\n## report\n" and not log.exists()  # no PR: no comment

    pr = subprocess.run(script, env=_ci_env(GITHUB_STEP_SUMMARY=str(summary), PATH=path, GH_TOKEN="t",
                                            PR_NUMBER="7"), capture_output=True, text=True)
    assert pr.returncode == 0 and "posted on pull request #7" in pr.stdout, pr
    assert log.read_text().splitlines() == [f"pr comment 7 --body-file {report} --edit-last",
                                            f"pr comment 7 --body-file {report}"]

    missing = subprocess.run(["bash", str(REPO / POST_REPORT_SH), str(tmp_path / "none.md")], env=_ci_env(),
                             capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.startswith("error: no report"), missing
