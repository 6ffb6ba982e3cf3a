"""The fork's CI (.github/workflows/smoke.yml) cannot run here, so it is checked as far as a machine without
GitHub can: actionlint passes, every `run:` step is a Makefile target (with variables the target reads) or a
script these tests run, and those scripts do what the workflow relies on."""

from __future__ import annotations

import json
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
PR_REPORT_SH = ".github/ci/pr_report.sh"
SCRIPTS_RUN_HERE = (DVC_REMOTE_SH, POST_REPORT_SH, PR_REPORT_SH)  # each run by a test below
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
    assert {c.split()[1] for c in commands if c.startswith("make ")} >= {"env", "repro", "test-fast", "test-report"}
    assert "make pr-report" in (REPO / PR_REPORT_SH).read_text()  # the report step's script
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


def steps() -> list[dict]:
    return [step for job in yaml.safe_load(WORKFLOW.read_text())["jobs"].values() for step in job["steps"]]


def test_the_mmcv_wheel_is_saved_after_the_set_up_whatever_the_outcome_and_restored_before_it():
    names = [step.get("uses", step.get("run", "")).split("@")[0] for step in steps()]
    restore, setup, save = (names.index(n) for n in ("actions/cache/restore", "make env", "actions/cache/save"))
    assert restore < setup == save - 1 and "actions/cache" not in names  # not the save-on-success action
    saving, restoring = steps()[save], steps()[restore]
    assert saving["if"].startswith("always()"), saving
    assert saving["with"]["path"] == restoring["with"]["path"] == "/github/home/.cache/dpnrepro/wheels"
    assert saving["with"]["key"] == f"${{{{ steps.{restoring['id']}.outputs.cache-primary-key }}}}"


def test_the_report_names_the_uploaded_artifact_and_its_tests_run_beside_the_fast_ones():
    all_steps = steps()
    upload = next(i for i, s in enumerate(all_steps) if s.get("uses", "").startswith("actions/upload-artifact"))
    report = next(i for i, s in enumerate(all_steps) if s.get("run", "").startswith(f"bash {PR_REPORT_SH}"))
    assert upload < report and all_steps[upload]["if"] == "always()"
    assert all_steps[report]["env"]["ARTIFACT_URL"] == f"${{{{ steps.{all_steps[upload]['id']}.outputs.artifact-url }}}}"
    assert "head.sha" not in WORKFLOW.read_text()  # no links to the commit's files: CI regenerated them
    assert "make test-report" in run_commands()
    target = re.search(r"^test-report:.*\n\t(.*)", (REPO / "Makefile").read_text(), flags=re.M).group(1)
    assert "tests/test_pr_report.py" in target and "not slow" not in target
    assert "enable" in (REPO / "docs/ci.md").read_text().split("## The report")[0]  # a fork's Actions: off at first


def test_the_report_links_the_artifact_instead_of_the_commit_s_files():
    sys.path.insert(0, str(REPO / "tools"))
    import pr_report

    found = {"params": [], "stages": [], "verdicts": [], "metrics": [], "reports": ["reports/table6.md",
                                                                                  "reports/table6.png"]}
    text = pr_report.render("main", "a" * 40, found, lambda rel: "blob/" + rel, artifact_url="https://run/art/1")
    assert "[reports](https://run/art/1)" in text and "- `reports/table6.png`" in text and "blob/" not in text
    assert "- [reports/table6.md](blob/reports/table6.md)" in pr_report.render("main", "a" * 40, found,
                                                                             lambda rel: "blob/" + rel)


def _history(root: Path) -> tuple[Path, str, str]:
    """``root/clone``: a clone of a repository whose main has commit A; the clone adds B on HEAD. Returns
    (clone, A, B)."""
    origin = root / "origin"
    origin.mkdir()
    run(["git", "init", "-q", "-b", "main"], origin)
    run([*GIT, "commit", "-q", "--allow-empty", "-m", "A"], origin)
    clone = root / "clone"
    run(["git", "clone", "-q", str(origin), str(clone)], root)
    run([*GIT, "commit", "-q", "--allow-empty", "-m", "B"], clone)
    return clone, *(run(["git", "rev-parse", rev], clone).stdout.strip() for rev in ("HEAD~1", "HEAD"))


def test_the_report_s_base_falls_back_to_the_merge_base_or_says_there_is_none(tmp_path):
    clone, a, b = _history(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "make.log"
    (bin_dir / "make").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (bin_dir / "make").chmod(0o755)
    out = tmp_path / "report.md"

    def report(**env):
        log.unlink(missing_ok=True)
        proc = subprocess.run(["bash", str(REPO / PR_REPORT_SH), str(out)], cwd=clone, capture_output=True, text=True,
                              env=_ci_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env))
        assert proc.returncode == 0, proc
        return log.read_text().strip() if log.exists() else None, proc.stdout

    gone = "f" * 40  # a force-push: `before` is not in the clone
    made, said = report(PUSH_BEFORE=gone, BASE_BRANCH="main", ARTIFACT_URL="https://run/art/1")
    assert made == f"pr-report BASE={a} OUT={out} PR_REPORT_ARGS=--artifact-url https://run/art/1", made
    assert "not a base this clone holds" in said and "merge base" in said
    assert report(PR_BASE=a, PUSH_BEFORE=gone)[0].startswith(f"pr-report BASE={a} ")
    assert report(PUSH_BEFORE="0" * 40, BASE_BRANCH="main")[0].startswith(f"pr-report BASE={a} ")  # a new branch
    run(["git", "update-ref", "refs/remotes/origin/main", "HEAD"], clone)  # a force-push to main: HEAD is main
    made, said = report(PUSH_BEFORE=gone, BASE_BRANCH="main")
    assert made is None and "no base" in said
    assert out.read_text().startswith("## What this change does to the paper's tables\n\nNo base: ")


@pytest.fixture
def fake_gh(tmp_path):
    """A ``gh`` on PATH that records its arguments and the body it posts, and answers the comment list with
    FAKE_COMMENTS (a JSON file) through the ``--jq`` filter it is given, as gh does."""
    if shutil.which("jq") is None:
        pytest.skip("jq is not installed (Debian's jq)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "gh.log"
    (bin_dir / "gh").write_text(f"""#!/bin/bash
echo "$*" >> {log}
for a in "$@"; do case "$a" in body=@*) cat "${{a#body=@}}" >> {log};; esac; done
[ "$1 $2" = "pr comment" ] && cat "$5" >> {log}
if [ "$1" = api ] && [ "$2" = --paginate ]; then jq -r "$5" "$FAKE_COMMENTS"; fi
exit 0
""")
    (bin_dir / "gh").chmod(0o755)
    return bin_dir, log


def test_post_report_script_fills_the_job_summary_and_edits_only_its_own_comment(tmp_path, fake_gh):
    bin_dir, log = fake_gh
    report = tmp_path / "pr-report.md"
    report.write_text("## report\n")
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    script = ["bash", str(REPO / POST_REPORT_SH), str(report)]
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    comments = tmp_path / "comments.json"
    marker = "<!-- dpnrepro-pr-report -->"

    def post(listed: list[dict], **env):
        comments.write_text(json.dumps(listed))
        log.unlink(missing_ok=True)
        proc = subprocess.run(script, env=_ci_env(GITHUB_STEP_SUMMARY=str(summary), PATH=path, GH_TOKEN="t",
                                                  FAKE_COMMENTS=str(comments), **env), capture_output=True, text=True)
        assert proc.returncode == 0, proc
        return proc.stdout, log.read_text().splitlines() if log.exists() else []

    said, calls = post([])
    assert summary.read_text() == "earlier step\n## report\n" and calls == []  # no PR: no comment

    other_bot = {"id": 5, "body": "## coverage report"}
    said, calls = post([other_bot], PR_NUMBER="7")
    assert "posted on pull request #7" in said, said
    assert calls[0].startswith("api --paginate repos/{owner}/{repo}/issues/7/comments --jq ")
    assert re.fullmatch(r"pr comment 7 --body-file \S+", calls[1]) and calls[2:] == [marker, "## report"], calls

    ours = {"id": 9, "body": f"{marker}\n## old report"}
    said, calls = post([other_bot, ours, {"id": 11, "body": "quoting " + marker}], PR_NUMBER="7")
    assert "updated in comment 9" in said, said
    assert calls[1].startswith("api -X PATCH repos/{owner}/{repo}/issues/comments/9 -F body=@")
    assert calls[2:] == [marker, "## report"] and not any("--edit-last" in c or "pr comment" in c for c in calls)

    missing = subprocess.run(["bash", str(REPO / POST_REPORT_SH), str(tmp_path / "none.md")], env=_ci_env(),
                             capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.startswith("error: no report"), missing
