"""reports/gpu/<run>/README.md (dpnrepro.reports.gpu_run): the committed page is what its folder gives, and the
two-copy hash comparison and the GPU-vs-CPU comparison are right on a small crafted folder."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from dpnrepro.errors import UserError
from dpnrepro.reports import gpu_run
from helpers import REPO

RUN = REPO / "reports/gpu/smoke-H200-2026-11-27"


def test_the_committed_page_is_what_the_tool_generates_from_the_folder(capsys):
    assert (RUN / gpu_run.PAGE).read_text() == gpu_run.build_page(RUN), \
        "run `python -m dpnrepro.reports.gpu_run reports/gpu/smoke-H200-2026-11-27`"
    assert gpu_run.main([str(RUN), "--check"]) == 0
    s = gpu_run.summary(gpu_run.load_run(RUN))
    assert s["stages_both"] == 26 and s["outputs_both"] == 58 and s["differ"] == []
    assert {"vtab", "table3", "table4", "table5", "table7", "reports_index", "segment"} == set(s["not_run"])


def _write_json(path, obj) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1))
    return hashlib.md5(path.read_bytes()).hexdigest()


def _lock(path, stages: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {s: {"cmd": f"python stages/{s}.py", "outs": [{"path": p, "md5": m} for p, m in outs.items()]}
            for s, outs in stages.items()}
    path.write_text(yaml.safe_dump({"schema": "2.0", "stages": body}, sort_keys=False))


def _headline(conv: float, dpn: float, verdict: str) -> dict:
    return {"table1": {"Mu/7": {"conv": conv, "dpn": dpn,
                                "dpn-conv": {"ci95": 2.0, "mean": dpn - conv, "verdict": verdict}}}}


@pytest.fixture()
def crafted(tmp_path):
    """Stages a (equal in both copies), b (differs), c (copy 0 only), t (the table: equal), d (in neither)."""
    folder = tmp_path / "smoke-X-2026-01-01"
    rel = "metrics/headline/table1.json"
    gpu_md5 = _write_json(folder / "gpu" / rel, _headline(40.0, 42.0, "not resolved"))
    cpu_md5 = _write_json(folder / "cpu" / rel, _headline(41.0, 42.5, "not resolved"))
    _write_json(folder / "env.json", {"nvidia_smi": "NVIDIA X, 1.0", "git_rev": "0123456789abcdef"})
    (folder / "jobs.tsv").write_text("repro_copy0\trc=0\twall_s=10\nrepro_copy1\trc=0\twall_s=11\n")
    for copy in gpu_run.COPIES:
        _write_json(folder / f"stage_times_{copy}.json", {"a": 1.0, "b": 2.0, "c": 3.0, "t": 1.5})
    _lock(folder / "copy0/dvc.lock", {"a": {"out/a": "1" * 32}, "b": {"out/b": "2" * 32, "out/b2": "5" * 32},
                                      "c": {"out/c": "3" * 32}, "t": {rel: gpu_md5}})
    _lock(folder / "copy1/dvc.lock", {"a": {"out/a": "1" * 32}, "b": {"out/b": "4" * 32, "out/b2": "5" * 32},
                                      "t": {rel: gpu_md5}})
    _lock(folder / "cpu/dvc.lock", {s: {} for s in "abcd"} | {"t": {rel: cpu_md5}})
    return folder


def _row(page: str, stage: str) -> str:
    return next(line for line in page.splitlines() if line.startswith(f"| `{stage}` |"))


def test_the_copies_hash_comparison_on_a_crafted_folder(crafted):
    page = gpu_run.build_page(crafted)
    assert _row(page, "a").endswith("| equal (1 output) |")
    assert _row(page, "b").endswith("| differs: `out/b` |")  # out/b2 is equal in both
    assert _row(page, "c").endswith("| copy 0 only |") and "| CUDA, copy 0 |" in _row(page, "c")
    assert "| not run |" in _row(page, "d") and "- `d`: not run" in page
    s = gpu_run.summary(gpu_run.load_run(crafted))
    assert s["differ"] == ["b"] and s["stages_both"] == 3 and s["outputs_both"] == 4
    assert "the hashes differ in b." in page


def test_gpu_against_cpu_values_and_verdicts_on_a_crafted_folder(crafted):
    rel = "metrics/headline/table1.json"
    table = gpu_run.summary(gpu_run.load_run(crafted))["tables"][rel]
    assert table == {"values": 2, "mean_abs_diff": 0.75, "max_abs_diff": 1.0, "verdicts": 1, "same_verdict": 1}
    page = gpu_run.build_page(crafted)
    assert "| table1/Mu/7/conv | 40.00 | 41.00 | -1.00 |" in page
    assert "| table1/Mu/7/dpn-conv (Δ) | +2.00 ± 2.00, not resolved | +1.50 ± 2.00, not resolved | +0.50 |" in page

    # a GPU verdict that changed is counted as changed (the lock's md5 follows the file, as dvc.lock does)
    md5 = _write_json(crafted / "gpu" / rel, _headline(40.0, 45.0, "better"))
    lock = yaml.safe_load((crafted / "copy0/dvc.lock").read_text())
    lock["stages"]["t"]["outs"][0]["md5"] = md5
    (crafted / "copy0/dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    assert gpu_run.summary(gpu_run.load_run(crafted))["tables"][rel]["same_verdict"] == 0


def test_a_metrics_file_its_lock_does_not_record_is_one_error_line(crafted, capsys):
    _write_json(crafted / "gpu/metrics/headline/table1.json", _headline(1.0, 2.0, "worse"))  # lock unchanged
    with pytest.raises(UserError, match="is not the .* its dvc.lock records"):
        gpu_run.load_run(crafted)
    page_before = (crafted / gpu_run.PAGE).exists()
    assert gpu_run.main([str(crafted)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert (crafted / gpu_run.PAGE).exists() == page_before  # nothing written
    assert gpu_run.main([str(crafted.parent / "absent")]) == 2
