"""Committed GPU throughput (tools/gpu_measured.py): the summary and reports/benchmarks_gpu.md are
rebuilt byte-identically from the committed full JSON, the summary keeps the flat schema that
dpnrepro.cost.gpu_hours reads, and ``collect`` turns a run directory into the full document."""

from __future__ import annotations

import json

import gpu_measured as gm
from dpnrepro.cost import gpu_hours
from helpers import REPO

ROW_KEYS = {"arch", "stem", "img_size", "batch_size", "compile", "images_per_s", "mfu_pct", "peak_mem_gib"}


def _doc() -> dict:
    return json.loads((REPO / gm.MEASURED_JSON).read_text())


def test_summary_and_report_are_rebuilt_from_the_committed_json(tmp_path):
    gm.write_outputs(_doc(), tmp_path)
    for path in (gm.SUMMARY_JSON, gm.REPORT_MD):
        assert (tmp_path / path).read_text() == (REPO / path).read_text(), \
            f"{path} is stale: python tools/gpu_measured.py render"


def test_summary_schema_is_flat_and_read_by_the_cost_model():
    doc = json.loads((REPO / gm.SUMMARY_JSON).read_text())
    assert {"device", "torch", "measured", "git_rev", "runs"} <= set(doc)
    assert doc["runs"], "no measured rows"
    for row in doc["runs"]:
        assert set(row) == ROW_KEYS
        assert row["stem"] in gm.OUR_STEMS and "/" in row["arch"]
        assert row["images_per_s"] > 0 and isinstance(row["compile"], bool)
    tp = gpu_hours.load_throughput(REPO / gm.SUMMARY_JSON)
    assert tp is not None and len(tp.runs) == len(doc["runs"]) and tp.peak_tflops
    # every (arch, stem, resolution, compile) once
    keys = [(r["arch"], r["stem"], r["img_size"], r["compile"]) for r in doc["runs"]]
    assert len(keys) == len(set(keys))


def test_summary_matches_the_full_results():
    doc = _doc()
    rows = {(r["arch"], r["stem"], r["img_size"], r["compile"]): r for r in gm.summary(doc)["runs"]}
    for run in doc["runs"].values():
        res = run["result"]
        for arch, models in res["results"].items():
            for stem, r in models.items():
                key = (arch.replace("-", "/"), stem, res["img_size"], res["compile"])
                if stem == "timm":
                    assert key not in rows
                    continue
                assert abs(rows[key]["images_per_s"] - r["img_per_s"]) < 0.1
                assert rows[key]["batch_size"] == res["batch_size"]


def test_collect_reads_a_run_directory_and_records_failures(tmp_path):
    doc = _doc()
    job, run = next(iter(doc["runs"].items()))
    (tmp_path / f"{job}.json").write_text(json.dumps(run["result"]))
    (tmp_path / "commands.tsv").write_text(f"{job}\t{run['command']}\nbroken\tpython3 stages/benchmark.py --x\n"
                                           "skipped\tpython3 stages/benchmark.py --y\n")
    (tmp_path / "jobs.tsv").write_text(f"{job}\trc=0\twall_s=12\nbroken\trc=1\twall_s=3\n")
    (tmp_path / "env.json").write_text(json.dumps({"git_rev": "abc", "measured": "2026-01-01", "python": "3.12"}))
    got = gm.collect(tmp_path)
    assert list(got["runs"]) == [job] and got["runs"][job]["wall_s"] == 12
    assert got["device"] == run["result"]["device"] and got["git_rev"] == "abc"
    assert got["failed"]["broken"]["error"] == "no result: exit status 1"
    assert got["failed"]["skipped"]["error"] == "no result: not run (time budget)"
    assert "**failed**" in gm.render(got)
