"""Stages start fast: a stage imports what it uses. The report stages only turn JSON into Markdown and PNG, so
neither their ``--help`` nor their build loads torch or timm (seconds per process on a 2-core machine);
``python -X importtime`` of the real process says what it loaded. A stage that does use torch still runs it
on the pinned threads and convolution path, whether it imports torch at its top or inside ``main``.
The floor measured before and after: benchmarks/measured/stage_startup.json."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO, clean_env, copy_project, imported_packages, stage_env

# script: the arguments of one real build on the committed metrics (None: it needs trained runs, --help only)
REPORT_STAGES = {
    "table.py": ["--table", "1"],
    "transfer_table.py": ["--table", "3"],
    "table4.py": [],
    "ablations.py": ["--report", "table6"],
    "study_report.py": [],
    "reports_index.py": [],
    "figures.py": None,  # reads runs/ (gradient-norm logs, weights for Figure 3): its own test below
}
MODEL_STACK = ("torch", "timm", "torchvision", "mmseg", "mmcv")
NOT_IN_HELP = ("mmengine", "dvc")  # not even these for --help: reports_index's build reads the mmseg config with mmengine's Config


def _run(args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-X", "importtime", *args], cwd=cwd, env=stage_env(),
                          capture_output=True, text=True, timeout=300)


def test_the_listed_report_stages_exist():
    assert {p.name for p in (REPO / "stages").glob("*.py")} >= REPORT_STAGES.keys()


@pytest.mark.parametrize("script", sorted(REPORT_STAGES))
def test_a_report_stage_help_loads_no_model_stack(script, tmp_path):
    proc = _run([str(REPO / "stages" / script), "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = imported_packages(proc.stderr)
    assert "dpnrepro" in loaded  # the parse saw the stage's own imports
    assert not loaded & {*MODEL_STACK, *NOT_IN_HELP}, sorted(loaded & {*MODEL_STACK, *NOT_IN_HELP})


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("startup"))


@pytest.mark.parametrize("script", sorted(s for s, args in REPORT_STAGES.items() if args is not None))
def test_a_report_build_on_the_committed_metrics_loads_neither_torch_nor_timm(script, project):
    proc = _run([f"stages/{script}", *REPORT_STAGES[script]], project)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("wrote "), proc.stdout
    loaded = imported_packages(proc.stderr)
    assert {"dpnrepro", "numpy"} <= loaded
    assert not loaded & set(MODEL_STACK), sorted(loaded & set(MODEL_STACK))


def test_the_figures_build_reads_its_runs_without_torch_or_timm(tmp_path):
    """Figures 2-4 from a sweep of runs (gradient-norm logs, Figure 3's weights file): the stage writes every
    figure and loads no model stack."""
    import json

    from test_figures import fake_run, mu_spec, save_run

    project = copy_project(tmp_path / "project")
    sweep = project / "runs" / "table1"
    for stem in ("conv", "dpn"):
        for seed in (0, 1):
            if stem == "dpn":
                spec = mu_spec(stem, 1, 7)
                save_run(sweep / f"Mu-7_{stem}_s{seed}", spec, spec.build())
            norms = {s: s / 100 for s in range(10, 101, 10)}
            run = fake_run(sweep, "Mu-7", stem, seed, 100, {"stem": norms, "block_00": norms})
            (run / "run.json").write_text(json.dumps({"hardware": "a stand-in"}))
    proc = _run(["stages/figures.py"], project)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("wrote ") and "reports/figure3.png" in proc.stdout, proc.stdout
    loaded = imported_packages(proc.stderr)
    assert "dpnrepro" in loaded and not loaded & set(MODEL_STACK), sorted(loaded & set(MODEL_STACK))


LAZY_STAGE = """
from dpnrepro.cli import stage
{top}

@stage
def main():
    import torch
    print(torch.get_num_threads(), torch.backends.mkldnn.enabled)

main()
"""


@pytest.mark.parametrize("top", ["import torch", ""], ids=["torch-at-the-top", "torch-inside-main"])
def test_a_stage_that_loads_torch_late_still_runs_it_pinned(top, tmp_path):
    """The stage decorator does not load torch to pin it: the pin applies the moment torch loads."""
    script = tmp_path / "late_torch.py"
    script.write_text(LAZY_STAGE.format(top=top))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          env=clean_env(DPNREPRO_CPU_THREADS="3"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["3", "False"]
