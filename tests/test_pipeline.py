"""End to end: the real smoke `dvc repro` in a scratch copy of the project (no mocked stages)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from helpers import FMNIST, copy_project, git_init, run, shrink_sweeps, write_params

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist (make env)"),
]


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory):
    """A copy of the project after a full `dvc repro` of the committed (smoke) params.yaml, with every
    sweep but table1 cut to a few steps (they are the same code path; CI time goes to table1)."""
    root = copy_project(tmp_path_factory.mktemp("repro"))
    write_params(root, shrink_sweeps(yaml.safe_load((root / "params.yaml").read_text())))
    for generated in ("dvc.lock", "metrics", "reports/table1.md", "reports/table1.png", "reports/table2.md",
                      "reports/table2.png"):
        path = root / generated
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    git_init(root)
    proc = run(["dvc", "repro"], root)
    return root, proc


def test_repro_builds_table1_with_paper_and_ours(reproduced):
    root, _ = reproduced
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["profile"] == "smoke"
    md = (root / "reports/table1.md").read_text()
    assert "| left | ViT AugReg | B/16 | 80.4 ± 0.06 | 81.1 ± 0.09 | +0.7 |" in md, "paper row missing or altered"
    assert "profile `smoke`" in md and "Hardware:" in md and "Seeds: " + ", ".join(map(str, params["table1"]["seeds"])) in md
    metrics = json.loads((root / "metrics/table1.json").read_text())
    n_runs = len(params["table1"]["archs"]) * len(params["table1"]["stems"]) * len(params["table1"]["seeds"])
    assert len(metrics["runs"]) == n_runs
    for run_metrics in metrics["runs"].values():
        # Real learning on real images: far above the 10 % of chance on Fashion-MNIST.
        assert run_metrics["val_top1"] > 40.0, run_metrics
    for arch in params["table1"]["archs"]:
        assert f"| {arch.replace('-', '/')} |" in md
    png = (root / "reports/table1.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_second_repro_is_a_no_op(reproduced):
    root, _ = reproduced
    out = run(["dvc", "repro"], root)
    assert "Running stage" not in out.stdout, out.stdout
    status = run(["dvc", "status"], root)
    assert "up to date" in status.stdout.lower(), status.stdout


def test_table_regenerates_byte_identical_from_cached_metrics(reproduced):
    root, _ = reproduced
    before = {p: (root / p).read_bytes() for p in ("reports/table1.md", "reports/table1.png", "metrics/table1_summary.json")}
    run(["dvc", "repro", "--force", "--single-item", "table1"], root)
    after = {p: (root / p).read_bytes() for p in before}
    assert before == after


def test_param_change_shows_in_params_and_metrics_diff(reproduced):
    root, _ = reproduced
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A"], root)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "repro"], root)
    seeds = yaml.safe_load((root / "params.yaml").read_text())["table1"]["seeds"]
    # Dropping a seed reuses the cached training runs: only evaluate + table1 rerun.
    out = run(["dvc", "exp", "run", "-S", f"table1.seeds=[{','.join(map(str, seeds[:-1]))}]"], root)
    assert "Running stage 'train-" not in out.stdout, out.stdout
    assert "Running stage 'evaluate@table1'" in out.stdout
    pdiff = run(["dvc", "params", "diff"], root).stdout
    assert "table1.seeds" in pdiff
    mdiff = run(["dvc", "metrics", "diff", "--all"], root).stdout
    assert "metrics/table1.json" in mdiff or "metrics/table1_summary.json" in mdiff
