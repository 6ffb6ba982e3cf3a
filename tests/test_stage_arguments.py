"""Every ``stages/*.py`` from a clean shell (no inherited pins or offline switches): ``--help`` prints what the
stage does and exits 0 having done nothing; an argument the stage does not define is one ``error:`` line
and exit 2, with nothing written.

``--help`` runs each stage as its own process from :func:`helpers.clean_env` (what a user's shell starts:
the stage's own imports, pins and start-up). The unknown-argument calls fork from one process that has
imported ``dpnrepro.cli`` (argparse's refusal does not depend on what was imported first), so the suite
starts one torch import for them instead of 23."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, clean_env

STAGES = sorted((REPO / "stages").glob("*.py"))
CALLS = {"unknown": ["--bogus-flag", "7"]}  # forked (RUNNER); --help runs as a real process

# One process started with a clean environment imports what the stages import (dpnrepro.cli: the package
# pins; then torch and timm, which the training stages load) and forks a child per stage and call, which runs
# the script as `python <script> <args>` would, in its own empty folder: the stages' start without 46 imports
# of torch. (The report stages load no torch of their own: tests/test_stage_startup.py.)
RUNNER = """
import json, os, runpy, sys, traceback
import dpnrepro.cli, dpnrepro.models
results = {}
for key, (script, args, cwd) in json.loads(sys.argv[1]).items():
    out, err = os.path.join(cwd, "..", "stdout"), os.path.join(cwd, "..", "stderr")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.chdir(cwd)
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.argv = [script, *args]
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else (print(exc.code) or 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    results[key] = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), open(out).read(), open(err).read()]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    """``{(stage name, call): (exit code, stdout, stderr, files left in its empty working folder)}``."""
    jobs = {}
    for script in STAGES:
        for call, args in CALLS.items():
            cwd = tmp_path_factory.mktemp(f"{script.stem}-{call}") / "cwd"
            cwd.mkdir()
            jobs[f"{script.name} {call}"] = (str(script), args, str(cwd))
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(jobs)], env=clean_env(),
                          cwd=tmp_path_factory.getbasetemp(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    return {tuple(key.split(" ")): (*results[key], sorted(p.name for p in Path(jobs[key][2]).rglob("*")))
            for key in jobs}


@pytest.mark.parametrize("script", STAGES, ids=lambda p: p.name)
def test_help_describes_the_stage_and_does_nothing(script, tmp_path):
    """``python stages/X.py --help`` as a user's fresh shell runs it, in an empty folder."""
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    written = sorted(p.name for p in tmp_path.rglob("*"))
    assert code == 0, stderr[-2000:]
    summary = ast.get_docstring(ast.parse(script.read_text())).splitlines()[0]
    assert summary in stdout, stdout
    assert written == [], f"--help wrote {written}"


@pytest.mark.parametrize("script", STAGES, ids=lambda p: p.name)
def test_an_argument_the_stage_does_not_define_is_one_error_line(outcomes, script):
    code, _, stderr, written = outcomes[script.name, "unknown"]
    assert code == 2, stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-2000:]
    assert "--bogus-flag 7" in lines[0], lines[0]
    assert written == [], f"{script.name} --bogus-flag 7 wrote {written}"
