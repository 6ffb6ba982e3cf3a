"""The committed GPU validation run (benchmarks/measured/gpu_validation.json, reports/gpu_validation.md)."""

import json

import pytest
from helpers import REPO

import gpu_validation as gv
from dpnrepro.benchmarks.flops import TRAIN_FLOPS_MULTIPLIER, vit_forward_flops


def _doc():
    return json.loads((REPO / gv.VALIDATION_JSON).read_text())


def test_committed_report_is_what_the_committed_json_renders():
    assert (REPO / gv.REPORT_MD).read_text() == gv.render(_doc())


def test_the_run_names_its_device_revision_and_the_cuda_tests_passed():
    doc = _doc()
    assert "H100" in doc["device"] and len(doc["git_rev"]) == 40 and doc["measured"]
    cuda = [c for c in doc["tests"] if "cuda" in c["test"]]
    assert {c["test"].split("::")[1] for c in cuda} >= {
        "test_deterministic_cuda_trainings_are_bit_identical[conv]",
        "test_deterministic_cuda_trainings_are_bit_identical[dpn]"}
    assert all(c["outcome"] == "passed" for c in cuda)


def test_trainer_loop_mfu_is_model_flops_over_the_peak():
    doc = _doc()
    for row in doc["loop"]:
        fwd = vit_forward_flops(row["arch"], img_size=row["img_size"], num_classes=1000).total
        want = 100 * TRAIN_FLOPS_MULTIPLIER * fwd * row["img_per_s"] / (doc["peak_tflops"] * 1e12)
        assert abs(row["mfu_pct"] - want) < 1e-9
        assert abs(row["img_per_s"] - row["batch_size"] / (row["ms_per_step"] / 1e3)) < 1e-6


# --- benchmarks/measured/run_gpu.sh, dry run on the CPU ----------------------------------------------


def _dry_run(root, out, *phases, **env):
    import os
    import subprocess
    import sys

    from helpers import stage_env

    e = dict(stage_env(), DRY_RUN="1", PYTHON=sys.executable, OUT=str(out), RES=str(out.parent / "res"), **env)
    e["PYTHONPATH"] = f"{root / 'src'}{os.pathsep}{e.get('PYTHONPATH', '')}"
    return subprocess.run(["bash", "benchmarks/measured/run_gpu.sh", *phases], cwd=root, env=e, capture_output=True,
                          text=True, timeout=600)


def _packed_jobs(out):
    import tarfile

    with tarfile.open(out / "gpu_results.tar.gz") as tar:
        jobs = tar.extractfile("res/jobs.tsv").read().decode()
    return dict(line.split("\t")[:2] for line in jobs.splitlines())


@pytest.mark.slow
def test_dry_run_of_the_table1_call_trains_commits_packs_and_returns_one_results_file(tmp_path):
    """The one GPU call, on the CPU: `tests` then `table1` (params made as `make profile` makes them with a
    YAML-aware edit, `dvc repro prepare`, the sweep's runs in parallel, `dvc commit`, evaluation, the DVC pack);
    every result in one file under $OUT, and the artifacts pack beside it."""
    import tarfile

    from helpers import copy_project

    root = copy_project(tmp_path / "gpu")
    out = tmp_path / "out"
    proc = _dry_run(root, out, "env", "tests", "table1", TESTS_IN_BACKGROUND="1")  # as the GPU call runs it
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = _packed_jobs(out)
    assert {k: jobs.get(k) for k in ("tests", "table1_prepare", "table1_train", "table1_evaluate")} == dict.fromkeys(
        ("tests", "table1_prepare", "table1_train", "table1_evaluate"), "rc=0"), (jobs, proc.stdout[-3000:])
    with tarfile.open(out / "gpu_artifacts.tar.gz") as tar:
        names = tar.getnames()
    assert "manifest.json" in names and "pipeline/dvc.lock" in names and "files/metrics/table1.json" in names
    assert "train-table1" in (root / "dvc.lock").read_text()  # recorded by `dvc commit`
    assert sorted(p.name for p in out.iterdir()) == ["gpu_artifacts.tar.gz", "gpu_results.tar.gz"]


def test_a_spent_budget_skips_the_jobs_and_still_returns_the_results_file(tmp_path):
    from helpers import copy_project

    root = copy_project(tmp_path / "gpu")
    out = tmp_path / "out"
    proc = _dry_run(root, out, "tests", BUDGET_S="20", PACK_RESERVE_S="20")
    assert "skipped, the budget is spent" in proc.stdout and proc.returncode == 1, proc.stdout
    assert _packed_jobs(out) == {"tests": "rc=skipped"}


def test_set_params_edits_yaml_keys_and_refuses_what_the_schema_refuses(tmp_path):
    import shutil
    import subprocess
    import sys

    from helpers import REPO, stage_env

    shutil.copy(REPO / "profiles/mini.yaml", tmp_path / "params.yaml")
    cmd = [sys.executable, str(REPO / "tools/set_params.py"), "--file", str(tmp_path / "params.yaml")]
    ok = subprocess.run([*cmd, "runtime.workers=14", "runtime.compile=true"], env=stage_env(), capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr
    text = (tmp_path / "params.yaml").read_text()
    assert text.count("\n  compile:") == 2 and "  workers: 14\n" in text  # runtime's and benchmark's; no duplicate
    for bad in ("runtime.wrkers=3", "runtme.workers=3", "runtime.workers=-1"):
        proc = subprocess.run([*cmd, bad], env=stage_env(), capture_output=True, text=True)
        assert proc.returncode != 0 and "set_params:" in proc.stderr, bad
    assert (tmp_path / "params.yaml").read_text() == text  # a refused edit leaves the file as it was
