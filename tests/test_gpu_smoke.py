"""benchmarks/measured/gpu_smoke.sh, dry run on the CPU (DRY_RUN=1: every stage on `cpu`, tiny params): two
copies run `dvc repro table6` side by side from empty caches, their dvc.lock files are compared output by
output, copy 0's model stages are packed, and the results file holds the per-stage wall times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest
import yaml
from helpers import REPO, stage_env, tiny_params


@pytest.mark.slow
def test_the_dry_run_repros_twice_compares_every_output_hash_and_packs(tmp_path):
    params = tiny_params(**{"train.steps": 4, "train.warmup_steps": 1})
    params["export_imagefolder"] = None
    params["table6"].update(archs=["Mu-7"], stems=["dpn", "pre"], seeds=[0], recipe={})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(stage_env(), DRY_RUN="1", PARAMS=str(tmp_path / "params.yaml"), TARGETS="table6", WORK=str(work),
               OUT=str(out), PYTHON=sys.executable, BUDGET_S="1500", CARRY=str(tmp_path / "no_carry"))
    env["PYTHONPATH"] = f"{REPO / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.pop("DPNREPRO_CPU_THREADS")  # the script gives each copy its share of the cores
    proc = subprocess.run(["bash", "benchmarks/measured/gpu_smoke.sh"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_smoke_results.tar.gz", "smoke_artifacts.tar.gz"]
    with tarfile.open(out / "gpu_smoke_results.tar.gz") as tar:
        read = lambda name: tar.extractfile(f"res/{name}").read().decode()  # noqa: E731
        jobs = dict(line.split("\t")[:2] for line in read("jobs.tsv").splitlines())
        assert jobs["repro_copy0"] == jobs["repro_copy1"] == jobs["pack"] == "rc=0", jobs
        assert read("lock_diff_copy1.txt").startswith("none: "), read("lock_diff_copy1.txt")
        times = json.loads(read("stage_times_copy0.json"))
        assert {"prepare", "train-table6", "evaluate-table6", "table6"} <= set(times), times
        assert read("unpack_command.txt").strip().endswith("--repro table6")
        assert json.loads(read("env.json"))["device"] == "cpu"
        lock = yaml.safe_load(read("copy0/dvc.lock"))
        assert "train-table6" in lock["stages"] and "cpu" in read("copy0/params.yaml")
        assert "metrics/table6.json" in tar.getnames() or "res/copy0/metrics/table6.json" in tar.getnames()
