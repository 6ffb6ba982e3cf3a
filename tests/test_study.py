"""The powered study (study/params.yaml, study/dvc.yaml, reports/study.md): cells, bit-identical runs
whatever the worker count, the report's statistics, and the committed report regenerating from the
committed metrics."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from dpnrepro.errors import ParamsError
from dpnrepro.study.config import PARAMS_FILE, StudyParams, load_study_params
from helpers import REPO


def _raw() -> dict:
    return yaml.safe_load((REPO / PARAMS_FILE).read_text())["study"]


def tiny_study(tmp_path) -> StudyParams:
    """The committed study shrunk to seconds: 2 seeds, a few steps, a few hundred images."""
    raw = _raw()
    raw["datasets"]["fashion_mnist"]["data"].update(train_examples=200, val_examples=100)
    raw["datasets"]["mnist"]["build"]["counts"] = {"train": 200, "test": 100}
    raw["schedules"] = {"short": {"steps": 3, "warmup_steps": 1}, "long": {"steps": 6, "warmup_steps": 1},
                        "saturation": {"steps": 9, "warmup_steps": 1}}
    raw["comparison"].update(archs=["Mu-7"], seeds=[0, 1])
    raw["saturation"]["seeds"] = [0, 1]
    raw["ablations"].update(seeds=[0, 1], stems=["pre", "rmsnorm"])
    return StudyParams.model_validate(raw)


def test_committed_study_meets_the_issue():
    """>= 5 seeds, two patch sizes, two real datasets, long >= 5x short, ablations >= 3 seeds at the short one."""
    p = load_study_params(REPO / PARAMS_FILE)
    assert len(p.comparison.seeds) >= 5 and len(p.ablations.seeds) >= 3
    assert len({a.split("-")[1] for a in p.comparison.archs}) >= 2 and len(p.datasets) >= 2
    short, long_ = (p.schedules[s].steps for s in p.comparison.schedules)
    assert long_ >= 5 * short and p.schedules["saturation"].steps > long_
    assert p.ablations.schedule == p.comparison.schedules[0]
    assert set(p.ablations.stems) == {"pre", "post", "post_posemb", "only_learnable", "rmsnorm", "no_learnable"}
    assert all(p.run_config(c)[2].device == "cpu" for c in p.cells())  # the committed bits are CPU bits


def test_bad_study_params_are_one_line_errors(tmp_path):
    raw = _raw()
    raw["ablations"]["seeds"] = [0, 99]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"study": raw}))
    with pytest.raises(ParamsError, match="ablations pair with the comparison"):
        load_study_params(path)
    with pytest.raises(ParamsError, match="missing.yaml is missing; restore it with `git checkout -- study/params.yaml`"):
        load_study_params(tmp_path / "missing.yaml")


def test_runs_are_bit_identical_whatever_the_worker_count_and_report_builds(tmp_path, monkeypatch):
    from dpnrepro.io import write_json_atomic
    from dpnrepro.study.report import build_study_report
    from dpnrepro.study.run import run_cell

    monkeypatch.chdir(tmp_path)
    # As the stage's entry point does before run_cell (the cell's hardware label is read in this process, the
    # runs happen in spawned workers that route convolutions themselves); the previous setting is restored after.
    import torch

    from dpnrepro.determinism.cpu import route_convolutions
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", torch.backends.mkldnn.enabled)
    route_convolutions()
    params = tiny_study(tmp_path)
    cell = params.cell("mnist-Mu-7-short")
    two = run_cell(params, cell, workers=2, progress=False)
    shutil.rmtree("checkpoints")
    one = run_cell(params, cell, workers=1, progress=False)
    assert one == two
    assert set(one["runs"]) == {"conv_s0", "conv_s1", "dpn_s0", "dpn_s1"}
    assert one["data"]["train_examples"] == 198 and one["data"]["val_examples"] == 100  # 1 % minival held out
    # a killed stage resumes: a run whose checkpoint is complete is restored, so the metrics are the same
    assert run_cell(params, cell, workers=1, progress=False) == one
    for c in params.cells():
        write_json_atomic(tmp_path / "metrics" / "study" / f"{c.name}.json",
                          one if c == cell else run_cell(params, c, workers=1, progress=False))
    outs = build_study_report(tmp_path / "metrics", tmp_path / "reports")
    first = [p.read_bytes() for p in outs]
    assert [p.read_bytes() for p in build_study_report(tmp_path / "metrics", tmp_path / "reports")] == first
    summary = json.loads((tmp_path / "metrics" / "study_summary.json").read_text())
    assert len(summary["comparison"]) == 4 and len(summary["plateau"]) == 2
    assert [r["stem"] for r in summary["ablations"][0]["rows"]] == ["dpn", "pre", "rmsnorm"]
    assert "Over 4 dataset x patch-size x schedule cells" in summary["verdict"]


def test_report_statistics_are_paired_by_seed(tmp_path):
    from dpnrepro.study.report import summarize

    def cell(kind, steps, accs, stems=("conv", "dpn")):
        runs = {f"{st}_s{s}": {"stem": st, "seed": s, "val_top1": accs[st][s]} for st in stems for s in accs[st]}
        return {"cell": f"fm-Mu-7-{kind}{steps}", "kind": kind, "dataset": "fm", "arch": "Mu-7", "steps": steps,
                "schedule": f"s{steps}",
                "stems": list(stems), "seeds": sorted(accs[stems[0]]), "runs": runs}

    # DPN is exactly 1 point better for every seed, though the seeds differ by 10 points: paired, that is resolved
    short = cell("comparison", 10, {"conv": {0: 50.0, 1: 60.0, 2: 70.0}, "dpn": {0: 51.0, 1: 61.0, 2: 71.5}})
    long_ = cell("comparison", 50, {"conv": {0: 80.0, 1: 70.0, 2: 75.0}, "dpn": {0: 79.0, 1: 70.0, 2: 75.0}})
    sat = cell("saturation", 100, {"conv": {0: 80.0, 1: 70.5}, "dpn": {0: 79.0, 1: 70.0}})
    abl = cell("ablations", 10, {"pre": {0: 49.0, 1: 59.0}}, stems=("pre",))
    s = summarize([short, long_, sat, abl])
    assert [r["delta"]["verdict"] for r in s["comparison"]] == ["better", "not resolved"]
    assert s["comparison"][0]["delta"]["mean"] == pytest.approx(7 / 6)
    assert s["plateau"][0]["vs_steps"] == 50 and s["plateau"][0]["gain"]["dpn"]["mean"] == 0.0
    pre = s["ablations"][0]["rows"][1]["vs_dpn"]
    assert pre["seeds"] == [0, 1] and pre["mean"] == pytest.approx(-2.0)  # paired with DPN seeds 0, 1 only
    assert "better in 1, worse in 0 and not resolved in 1" in s["verdict"]


def test_committed_report_regenerates_from_committed_metrics(tmp_path):
    """reports/study.md, .png and the summary: byte-identical from metrics/study/*.json alone."""
    from dpnrepro.study.report import build_study_report

    shutil.copytree(REPO / "metrics" / "study", tmp_path / "metrics" / "study")
    shutil.copy(REPO / "metrics" / "study_probe.json", tmp_path / "metrics" / "study_probe.json")
    outs = build_study_report(tmp_path / "metrics", tmp_path / "reports")
    for path in outs:
        committed = REPO / path.relative_to(tmp_path)
        assert path.read_bytes() == committed.read_bytes(), f"{committed} is not what its metrics give"


def test_study_pipeline_is_up_to_date():
    """study/dvc.lock matches the code, params and committed metrics: the study need not be rerun."""
    from dpnrepro import dvc_graph

    stale = dvc_graph.status(["study/dvc.yaml"], REPO)
    assert stale == {}, stale
