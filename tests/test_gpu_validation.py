"""The committed GPU validation run (benchmarks/measured/gpu_validation.json, reports/gpu_validation.md)."""

import json

from helpers import REPO

from dpnrepro.benchmarks import gpu_validation as gv
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
