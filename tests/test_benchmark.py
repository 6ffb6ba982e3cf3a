"""A tiny end-to-end run of the training-throughput benchmark on CPU (library and stage entry point)."""
from __future__ import annotations

import json
import runpy
import sys

import pytest
import torch
from helpers import REPO

from dpnrepro.benchmarks.train_throughput import (
    measure_matmul_tflops,
    render_markdown,
    run_benchmark,
)
from dpnrepro.errors import UserError

TINY = {"batch_size": 2, "warmup_steps": 1, "steps": 1, "device": "cpu", "img_size": 28, "num_classes": 10, "progress": False}


@pytest.fixture(scope="module")
def tiny_result():
    return run_benchmark(["Mu-7"], ["conv", "linear", "dpn"], timm_reference=True, measure_matmul=False, **TINY)


def test_result_fields(tiny_result):
    res = tiny_result
    assert res["device_type"] == "cpu" and res["device"].startswith("CPU")
    assert res["dtype"] == "fp32" and res["torch"] == torch.__version__
    assert res["peak_tflops"] is None  # no datasheet peak on CPU: MFU is n/a
    rows = res["results"]["Mu-7"]
    assert set(rows) == {"conv", "linear", "dpn", "timm"}
    for variant, row in rows.items():
        for key in ("params_m", "fwd_gflop_per_img", "train_gflop_per_img", "ms_per_step", "img_per_s",
                    "achieved_tflops"):
            assert row[key] > 0, (variant, key)
        assert row["peak_mem_bytes"] is not None and row["peak_mem_bytes"] >= 0
        assert row["mfu_pct"] is None and row["vs_matmul_pct"] is None
        assert row["train_gflop_per_img"] == pytest.approx(3 * row["fwd_gflop_per_img"])
        assert row["img_per_s"] == pytest.approx(2 / (row["ms_per_step"] / 1e3))
    assert rows["timm"]["model"].startswith("timm VisionTransformer")  # timm registers no Mu size
    assert set(res["comparisons"]["Mu-7"]) == {"dpn_vs_conv_pct", "linear_vs_conv_pct", "conv_vs_timm_pct",
                                               "dpn_vs_timm_pct"}
    assert all(t["met"] is None and "CPU" in t["note"] for t in res["targets"].values())
    json.dumps(res)  # JSON-able as metrics


def test_markdown_names_device_and_cpu_caveat(tiny_result):
    md = render_markdown(tiny_result)
    assert tiny_result["device"] in md
    assert "not measurable" in md and "MFU is n/a" in md
    assert "| Mu-7 | dpn |" in md and "| Mu-7 | timm stock |" in md


def test_matmul_reference_is_positive():
    assert measure_matmul_tflops(torch.device("cpu"), torch.float32, n=64, min_seconds=0.01) > 0


def test_bad_names_are_user_errors():
    with pytest.raises(UserError, match="unknown arch"):
        run_benchmark(["X-16"], ["dpn"], **TINY)
    with pytest.raises(UserError, match="unknown stem"):
        run_benchmark(["Mu-7"], ["nope"], **TINY)
    with pytest.raises(UserError, match="not divisible"):
        run_benchmark(["Mu-8"], ["dpn"], **TINY)


def test_stage_cli_writes_outputs(tmp_path, monkeypatch):
    out_json, out_md = tmp_path / "metrics" / "benchmarks.json", tmp_path / "reports" / "benchmarks.md"
    monkeypatch.setattr(sys, "argv", [
        "benchmark.py", "--params", str(REPO / "params.yaml"), "--archs", "Mu-7", "--stems", "dpn",
        "--no-timm-reference", "--batch-size", "2", "--warmup-steps", "0", "--steps", "1", "--device", "cpu",
        "--img-size", "28", "--num-classes", "10", "--out-json", str(out_json), "--out-md", str(out_md),
        "--no-progress"])
    runpy.run_path(str(REPO / "stages" / "benchmark.py"), run_name="__main__")
    res = json.loads(out_json.read_text())
    assert list(res["results"]["Mu-7"]) == ["dpn"] and res["batch_size"] == 2
    assert res["device"] in out_md.read_text()


def test_stage_cli_rejects_bad_override(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["benchmark.py", "--params", str(REPO / "params.yaml"), "--batch-size", "0",
                                      "--out-json", str(tmp_path / "b.json"), "--out-md", str(tmp_path / "b.md")])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / "stages" / "benchmark.py"), run_name="__main__")
    assert exc.value.code == 2
    assert "batch_size" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()
