"""benchmarks/measured/gpu_check.sh's dry run on the CPU, as a lent GPU machine meets it: a bare checkout (the
project not installed: a Python that cannot `import dpnrepro` by itself), `start` detached, then `collect` calls
that each hand back at most 8 files. Two copies run a tiny Table 6 side by side, the last one is killed at its
first training checkpoint and resumes, and the hashes of both dvc.lock files are compared."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml
from helpers import FMNIST, copy_project, stage_env, tiny_params

pytestmark = pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist (make env)")


def bare_python(venv: Path) -> Path:
    """A venv whose only link to the pinned packages is a plain path line (so no .pth of that folder, the
    project's editable install among them, is processed): `import dpnrepro` fails there."""
    import importlib.util

    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin/python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    (Path(site) / "pinned.pth").write_text(f"{Path(importlib.util.find_spec('dvc').origin).parents[1]}\n")
    return python


def check(checkout: Path, python: Path, env: dict, cmd: str, **extra: str) -> str:
    proc = subprocess.run(["bash", str(checkout / "benchmarks/measured/gpu_check.sh"), cmd], cwd=checkout,
                          env={**env, **extra}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_the_dry_run_from_a_bare_checkout_repros_twice_resumes_a_killed_run_and_hands_back(tmp_path):
    python = bare_python(tmp_path / "venv")
    env = {k: v for k, v in stage_env().items() if k not in ("PYTHONPATH", "DPNREPRO_CPU_THREADS")}
    probe = subprocess.run([python, "-c", "import dvc, torch; import dpnrepro"], env=env, capture_output=True,
                           text=True)
    assert "No module named 'dpnrepro'" in probe.stderr, probe.stderr  # the project is not installed there
    checkout = copy_project(tmp_path / "checkout")
    # 24 steps, a checkpoint every 2: the watcher (0.2 s polls) kills mid-run even where a step takes 40 ms
    params = tiny_params(**{"train.steps": 24, "train.warmup_steps": 2, "runtime.ckpt_every": 2})
    params["export_imagefolder"] = None
    params["table6"].update(archs=["Mu-7"], stems=["dpn", "pre"], seeds=[0], recipe={})
    params["table6"]["runtime"]["ckpt_every"] = 2  # the kill lands mid-run: its rerun resumes before step 24
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    work = tmp_path / "work"
    env.update(DRY_RUN="1", PARAMS=str(tmp_path / "tiny.yaml"), GROUPS="train-table6;evaluate-table6",
               KILL="train-table6", WORK=str(work), CARRY=str(tmp_path / "no_carry"), SITE=str(tmp_path / "site"),
               PYTHON=str(python), BUDGET_S="1500", HANDBACK_MIB="16")
    assert "started" in check(checkout, python, env, "start")
    back: dict[str, Path] = {}
    for call in range(40):
        out = tmp_path / f"out{call}"
        said = check(checkout, python, env, "collect", OUT=str(out), WAIT_S="30")
        files = sorted(out.iterdir()) if out.exists() else []
        assert len(files) <= 8 and sum(f.stat().st_size for f in files) <= 16 * 2**20, files  # one call's hand-back
        back |= {f.name: f for f in files}
        if "finished" in said and "left for the next call: -" in said:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"not finished: {said}\n{(work / 'run.log').read_text()[-3000:]}")
    log = (work / "run.log").read_text()
    assert "error" not in log, log[-3000:]  # e.g. "No module named 'dpnrepro'" where src/ is not on PYTHONPATH
    assert "results.tar.gz" in back and ("artifacts.tar.gz" in back or "artifacts.tar.gz.part00" in back), back
    with tarfile.open(back["results.tar.gz"]) as tar:
        read = lambda name: tar.extractfile(f"res/{name}").read().decode()  # noqa: E731
        jobs = dict(line.split("\t")[:2] for line in read("jobs.tsv").splitlines())
        assert jobs["copy1_group0_killed_in_train-table6"] == "rc=-9", jobs  # SIGKILLed, then run again
        assert jobs["copy0_group0"] == jobs["copy1_group0"] == jobs["copy1_group1"] == jobs["pack"] == "rc=0", jobs
        diff = json.loads(read("lock_diff.json"))
        assert diff["differ"] == [], diff
        assert {"prepare", "train-table6", "evaluate-table6"} <= {*diff["stages_compared"]}, diff
        resume = json.loads(read("resume.json"))
        assert resume["train-table6"]["outputs_equal_to_uninterrupted"] is True, resume
        resumed = re.search(r"resuming from checkpoints/table6/Mu-7_dpn_s0 at step (\d+)/24", read("repro_copy1.log"))
        assert resumed and 2 <= int(resumed[1]) < 24, read("repro_copy1.log")[-3000:]  # killed mid-run
        assert json.loads(read("env.json"))["device"] == "cpu"
        assert "train-table6" in json.loads(read("stage_times_copy0.json"))
        assert "res/copy0/metrics/table6.json" in tar.getnames()
