"""reports/README.md (dpnrepro.reports.index): every report of dvc.yaml listed, byte-reproducible, GPU-hours
(dpnrepro.cost.gpu_hours) from a measured throughput (tests/fixtures/gpu_throughput_summary.json) or, without
one, from FLOPs."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from dpnrepro.benchmarks.flops import train_flops_per_image
from dpnrepro import pipeline
from dpnrepro.codedeps import code_deps
from dpnrepro.cost import gpu_hours
from dpnrepro.reports import index
from helpers import REPO

FIXTURE = REPO / "tests" / "fixtures" / "gpu_throughput_summary.json"
H100_PEAK = 989.4e12


def _stages(path: str) -> dict:
    return yaml.safe_load((REPO / path).read_text())["stages"]


def _outputs(stages: dict, keys=("outs",)) -> set[str]:
    return {next(iter(o)) if isinstance(o, dict) else o
            for body in stages.values() for k in keys for o in body.get(k, [])}


def _md_outs(stages: dict) -> set[str]:
    return {p for p in _outputs(stages) if p.endswith(".md")}


@pytest.fixture(scope="module")
def entries() -> list:
    """What the stage passes the index: the reports of the pipeline's stages (what dvc.yaml is generated from)."""
    return index.report_entries(pipeline.stages())


@pytest.fixture(scope="module")
def page(entries) -> str:
    return index.build_index(entries, REPO)


def test_every_report_dvc_yaml_writes_is_listed_with_its_stage(page, entries):
    stages = _stages("dvc.yaml")
    assert index.report_entries(stages) == entries
    written = _md_outs(stages) - {index.INDEX.as_posix()}
    assert len(written) >= 11  # Tables 1-7, Figures 1-4
    for path in written:
        stage = next(name for name, body in stages.items() if path in _md_outs({name: body}))
        assert f"| [{index._title(path[8:-3])}]({path[8:]}) | `{stage}` |" in page, path
    # derived from the stages, not a list: a new report stage is listed without touching the index
    new = {"table8": {"cmd": "python stages/table.py --table 8", "deps": ["metrics/t8.json"],
                      "outs": [{"reports/table8.md": {"cache": False}}], "metrics": ["metrics/table8_summary.json"]}}
    entries = index.report_entries({**stages, **new})
    assert [e.name for e in entries if e.stage == "table8"] == ["table8"]
    assert {"metrics/table8_summary.json", "metrics/t8.json"} <= set(index.index_inputs({**stages, **new}))


def test_reports_outside_dvc_repro_are_listed_without_being_dependencies(page):
    """study/ and benchmarks/ reports appear as static rows; the index stage reads none of their outputs."""
    for path, _, how in index.STATIC_REPORTS:
        assert f"]({path}) | {how} |" in page
    static = {f"reports/{path}" for path, _, _ in index.STATIC_REPORTS}
    other = {**_stages("benchmarks/dvc.yaml"), **_stages("study/dvc.yaml")}
    assert _md_outs(other) <= static, "a benchmark/study report is missing from STATIC_REPORTS"
    other_outputs = _outputs(other, ("outs", "metrics"))
    deps = _stages("dvc.yaml")["reports_index"]["deps"]
    assert not other_outputs & set(deps), other_outputs & set(deps)
    inputs = index.index_inputs(_stages("dvc.yaml"))
    assert deps == [*code_deps("stages/reports_index.py"), *inputs]
    assert gpu_hours.THROUGHPUT.as_posix() in deps and (REPO / gpu_hours.THROUGHPUT).exists()


def test_committed_index_is_what_the_stage_writes_and_building_twice_gives_the_same_bytes(page, entries):
    assert index.build_index(entries, REPO) == page
    assert (REPO / index.INDEX).read_text() == page, "run `python stages/reports_index.py` (or dvc repro)"


def test_provenance_and_headline_come_from_the_metrics(page):
    summary = json.loads((REPO / "metrics/table1_summary.json").read_text())
    table1 = json.loads((REPO / "metrics/table1.json").read_text())
    row = next(line for line in page.splitlines() if line.startswith("| [Table 1]"))
    seeds = sorted({r["seed"] for r in table1["runs"].values()})
    assert f"| {table1['profile']} |" in row and f"| {', '.join(map(str, seeds))} |" in row
    assert f"`{index.md5_of(REPO / 'metrics/table1_summary.json')[:8]}`" in row
    for arch, entry in summary["table1"].items():
        d = entry["delta_dpn"]
        assert f"{arch} {round(d['mean'], 2) + 0.0:+.2f} ± {d['ci95']:.2f}, {d['verdict']}" in row
    hardware = {r["hardware"] for r in table1["runs"].values()}
    assert all(f"= {hw}" in page for hw in hardware)
    # the paper's Δ are derived from its printed values: Table 1 B/16 81.1 − 80.4; Table 3's natural group
    assert index.paper_deltas(1, block="ViT AugReg")["B/16"] == [pytest.approx(0.7)]
    natural_b32 = [0.6, 4.4, 4.7, 2.5, 0.8, 3.4, 3.5]  # Caltech101 ... SVHN, as reports/table3.md prints them
    assert index.paper_deltas(3, group="natural")["B/32"] == pytest.approx(natural_b32)


def test_verdicts_are_the_recorded_ones_and_a_delta_without_one_is_refused():
    assert index.delta_verdict({"mean": 1.0, "ci95": 3.0, "verdict": "better"}) == "better"
    one_run = {"mean": 6.4, "ci95": 2.17, "verdict": "not resolved", "why": "1 training run"}
    assert index.delta_verdict(one_run) == "not resolved (1 training run)"
    for unjudged in ({"mean": 1.0, "ci95": 0.5}, {"mean": -1.0, "outside_ci": True}):  # no CI rule of its own
        with pytest.raises(ValueError, match="paired_test"):
            index.delta_verdict(unjudged)
    summary = {"A": {"delta_dpn": {"mean": 1.0, "ci95": 0.5, "verdict": "better"}, "gain_x": one_run},
               "B": {"delta_dpn": {"from scratch": {"mean": 0.0, "verdict": "not resolved", "why": "1 training run"},
                                   "+ Augmentation": {"mean": 1.0, "verdict": "not resolved"}}}}  # Table 7
    assert index.verdict_counts(index.all_deltas(summary)) == "4: 1 better, 0 worse, 3 not resolved"


def _workload(arch="B/16", img=224, stem="dpn", images=2_500 * 3600 * 10, vit_step=True):
    flops = float(train_flops_per_image(arch, img_size=img))
    return gpu_hours.Workload("t", arch, img, stem, 1, images, flops, vit_step)


def test_gpu_hours_from_measured_throughput_and_from_the_nearest_arch_mfu():
    tp = gpu_hours.load_throughput(FIXTURE)
    assert tp.device == "NVIDIA H100 80GB HBM3" and tp.peak_tflops == 989.4
    # measured at this arch and resolution: images / (images/s); same stem first, else the slowest stem
    assert gpu_hours.estimate(_workload(stem="dpn"), tp)[:2] == (pytest.approx(10.0), "measured")
    assert gpu_hours.estimate(_workload(stem="conv"), tp)[0] == pytest.approx(2_500 * 10 / 2_600)
    assert gpu_hours.estimate(_workload(stem="rmsnorm"), tp)[0] == pytest.approx(10.0)
    # not measured at 384 px: FLOPs at the MFU of the same arch (its slowest stem, dpn 26.63 %)
    w = _workload(img=384)
    hours, method, source = gpu_hours.estimate(w, tp)
    assert method == "mfu" and "B/16 dpn 224 px" in source
    assert hours == pytest.approx(w.images * w.flops_per_image / (H100_PEAK * 0.2663) / 3600)
    # an arch never measured: the measurement nearest in FLOPs per image (L/16 224 for B/16 384's FLOPs)
    w = _workload(arch="B/32", img=384)
    nearest = min(("B/16", "L/16"), key=lambda a: abs(math.log(train_flops_per_image(a) / w.flops_per_image)))
    mfu = {"B/16": 0.2663, "L/16": 0.2986}[nearest]
    hours, method, source = gpu_hours.estimate(w, tp)
    assert method == "mfu" and f"{nearest} dpn 224 px" in source
    assert hours == pytest.approx(w.images * w.flops_per_image / (H100_PEAK * mfu) / 3600)
    # LiT's step is not a ViT training step: never measured img/s, even where its arch was measured
    assert gpu_hours.estimate(_workload(vit_step=False), tp)[1] == "mfu"
    total, cell, note = index.cost_cell_and_note([_workload(), _workload(img=384)], tp, False)
    assert total == pytest.approx(10.0 + gpu_hours.estimate(_workload(img=384), tp)[0])
    assert cell.endswith("(measured + MFU-scaled)") and "B/16 384 px" in note


def test_without_a_measurement_gpu_hours_fall_back_to_flops_at_an_assumed_mfu(tmp_path):
    placeholder = tmp_path / "placeholder.json"
    placeholder.write_text(json.dumps({"device": None, "runs": []}))
    no_runs_key = tmp_path / "no_runs.json"
    no_runs_key.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3"}))
    for path in (placeholder, no_runs_key, tmp_path / "missing.json"):
        assert gpu_hours.load_throughput(path) is None
    w = _workload()
    assert gpu_hours.estimate(w, None) == (pytest.approx(w.images * w.flops_per_image / (H100_PEAK * 0.40) / 3600),
                                       "assumed", "40 % MFU assumed")
    _, cell, _ = index.cost_cell_and_note([w], None, False)
    assert cell.endswith("(assumed MFU)")
    assert "No GPU measurement is committed yet" in index._cost_preamble(None)


def test_page_with_a_measurement_names_the_device_and_the_method_per_report():
    text = index.build_index(index.report_entries(pipeline.stages()), REPO, throughput=FIXTURE)
    gpu = text[text.index("## GPU-hours"):]
    assert "Device: **NVIDIA H100 80GB HBM3**" in gpu and "code at 0123456789ab" in gpu
    table1 = next(line for line in gpu.splitlines() if line.startswith("- [Table 1]"))
    assert "from measured img/s (B/16 224 px)" in table1 and "B/16 384 px" in table1
    table4 = next(line for line in gpu.splitlines() if line.startswith("- [Table 4]"))
    assert "measured img/s" not in table4  # LiT


def test_a_truncated_committed_summary_is_one_line_naming_it_and_how_to_restore_it(tmp_path, entries):
    """A damaged metrics file read by the index is a UserError naming the file (was a JSONDecodeError traceback)."""
    import shutil

    from dpnrepro.errors import UserError

    entry = next(e for e in entries if e.summary)
    for folder in ("profiles", "configs"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    for rel in {*entry.metrics, entry.summary}:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    (tmp_path / entry.summary).write_text((REPO / entry.summary).read_text()[:40])
    with pytest.raises(UserError, match=rf"{entry.summary}.*git checkout -- {entry.summary}") as err:
        index.build_index([entry], tmp_path)
    assert "\n" not in str(err.value)


def _study_summary(verdicts: list[str], plateau_gain: str = "not resolved") -> dict:
    """A study summary with one cell per verdict (the last one the longest schedule) and one saturation cell."""
    def delta(verdict):
        return {"n": 5, "mean": 1.0, "ci95": 0.5, "verdict": verdict}
    cells = [{"cell": f"c{i}", "dataset": "mnist", "arch": "Mu-7", "schedule": "long" if i == len(verdicts) - 1
              else "short", "steps": 1600 if i == len(verdicts) - 1 else 160, "delta": delta(v)}
             for i, v in enumerate(verdicts)]
    plateau = [{"cell": "sat", "dataset": "mnist", "arch": "Mu-7", "steps": 3200, "vs_steps": 1600,
                "delta": delta("not resolved"), "gain": {"conv": delta("not resolved"), "dpn": delta(plateau_gain)}}]
    return {"comparison": cells, "plateau": plateau}


def test_findings_are_counted_from_the_verdicts_and_follow_them():
    """The Findings section's counts come from the summaries' verdicts: a changed verdict changes the words."""
    from dpnrepro.reports import findings

    summary = {"A": {"delta_dpn": {"mean": 1.0, "ci95": 0.5, "verdict": "better"}},
               "B": {"delta_dpn": {"mean": 0.1, "ci95": 3.0, "verdict": "not resolved", "why": "1 pretraining run"}}}
    row = lambda s: [("[Table 9](table9.md)", "smoke", index.verdict_words(index.all_deltas(s)))]  # noqa: E731
    assert "[Table 9](table9.md) 2 Δs: 1 better, 0 worse, 1 not resolved." in findings.smoke_text(row(summary))
    summary["A"]["delta_dpn"]["verdict"] = "worse"
    assert "[Table 9](table9.md) 2 Δs: 0 better, 1 worse, 1 not resolved." in findings.smoke_text(row(summary))
    assert "profile smoke" in findings.smoke_text(row(summary))

    text = findings.study_text(findings.study_record(_study_summary(["better", "worse", "worse"]), "0" * 32))
    assert "over 3 dataset × patch × schedule cells" in text and "better in 1, worse in 2, not resolved in 0." in text
    assert "(1600 steps) it is better in 0, worse in 1, not resolved in 0 of 1 cells" in text
    assert "resolves none of the 2 stems' gains" in text
    text = findings.study_text(findings.study_record(_study_summary(["better", "not resolved", "better"], "better"),
                                                     "0" * 32))
    assert "better in 2, worse in 0, not resolved in 1." in text and "resolves 1 of the 2 stems' gains" in text


def test_the_study_record_is_the_study_summary_and_the_index_reads_it_not_the_study_outputs():
    """study/findings.json is what the committed study summary gives (`python -m dpnrepro.reports.findings`);
    the index depends on it and on the GPU runs' folder, plain git-tracked files, so `dvc repro` runs no study."""
    from dpnrepro.reports import findings

    assert findings.read_study_record(REPO) == findings.current_study_record(REPO), \
        "run `python -m dpnrepro.reports.findings`"
    deps = _stages("dvc.yaml")["reports_index"]["deps"]
    assert findings.STUDY_RECORD.as_posix() in deps and findings.GPU_RUNS.as_posix() in deps
    assert findings.STUDY_SUMMARY.as_posix() not in deps
    assert findings.gpu_runs(REPO), "no committed GPU run under reports/gpu/"
