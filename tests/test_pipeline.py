"""End to end: the real smoke `dvc repro` in a scratch copy (tests/conftest.py `smoke_repro`, run once),
compared byte for byte with the committed results, then the DVC workflows users rely on."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import pipeline_results
from helpers import REPO, differing_outputs, dvc_repro, plots_errors, run

from dpnrepro import dvc_graph

pytestmark = pytest.mark.slow
GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]


def test_committed_metrics_and_tables_are_what_the_pipeline_produces(smoke_repro):
    """The guarantee of a reproducibility harness: a fresh clone's `dvc repro` rewrites nothing."""
    root, proc, seconds = smoke_repro
    print(f"smoke dvc repro of the whole paper from scratch: {seconds:.0f} s")
    results = pipeline_results()
    assert any(f.startswith("metrics/") for f in results) and any(f.startswith("reports/") for f in results)
    differ = [f for f in results if (root / f).read_bytes() != (REPO / f).read_bytes()]
    assert not differ, f"the pipeline does not reproduce the committed {differ}: rerun `make repro` and commit"


def test_every_output_hash_is_the_committed_one(smoke_repro):
    """dvc.lock records the hash of every output (data, run directories with weights, spec, config and logs,
    segmentation runs, metrics, tables): equal hashes are equal files, so a fresh clone's `make repro`
    leaves `git status` clean and the committed runs can be `dvc pull`ed instead of retrained."""
    root, _, _ = smoke_repro
    ours = yaml.safe_load((root / "dvc.lock").read_text())
    differ = differing_outputs(ours, yaml.safe_load((REPO / "dvc.lock").read_text()))
    print("\n".join(["outputs whose hash differs from the committed dvc.lock:", *differ] if differ else []))
    assert not differ, f"{len(differ)} outputs differ from the committed dvc.lock:\n" + "\n".join(differ)


def test_plots_show_renders_every_plot(smoke_repro):
    """`dvc plots show` on the real outputs: every run's training curves, Fig. 2's CSVs, every PNG."""
    root, _, _ = smoke_repro
    errors = plots_errors(root)
    assert not errors, errors


def test_repro_builds_table1_with_paper_and_ours(smoke_repro):
    root, _, _ = smoke_repro
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert params["profile"] == "smoke" and params["data"]["format"] == "imagefolder"
    md = (root / "reports/table1.md").read_text()
    assert "| left | ViT AugReg | B/16 | 80.4 ± 0.06 | 81.1 ± 0.09 | +0.7 |" in md, "paper row missing or altered"
    assert "profile `smoke`" in md and "Hardware:" in md and "Seeds: " + ", ".join(map(str, params["table1"]["seeds"])) in md
    metrics = json.loads((root / "metrics/table1.json").read_text())
    sw = params["table1"]
    assert len(metrics["runs"]) == len(sw["archs"]) * len(sw["stems"]) * len(sw["seeds"])
    for run_metrics in metrics["runs"].values():
        assert run_metrics["val_top1"] > 25.0, run_metrics  # real learning (chance is 10 %); smoke is not powered
    assert (root / "reports/table1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((root / "runs/table1/Mu-7_dpn_s0/config.json").read_text())
    assert config["train"]["steps"] == params["train"]["steps"] and config["stem"] == "dpn"


def test_second_repro_is_a_no_op(smoke_repro):
    root, _, _ = smoke_repro
    assert dvc_repro(root, no_thread_pin=True) == {}


def test_pulled_clone_regenerates_every_table_without_training(smoke_repro, tmp_path):
    """The workflow between a GPU user and a reader: run the pipeline, `dvc push` to a remote (here a
    local directory); elsewhere a fresh clone `dvc pull`s and `dvc repro` reruns no training or evaluation
    stage. Its deleted reports are rebuilt from the pulled metrics, byte-identical."""
    root, _, _ = smoke_repro
    work = tmp_path / "producer"
    shutil.copytree(root, work, symlinks=True)  # the shared fixture stays untouched
    remote = tmp_path / "remote"
    run(["dvc", "remote", "add", "-d", "shared", str(remote)], work)
    run([*GIT, "add", "-A"], work)
    run([*GIT, "commit", "-qm", "results"], work)
    run(["dvc", "push"], work)
    clone = tmp_path / "reader"
    subprocess.run(["git", "clone", "-q", str(work), str(clone)], check=True)
    run(["dvc", "pull"], clone)
    reports = [f for f in pipeline_results() if f.startswith("reports/")]
    for f in reports:
        (clone / f).unlink()
    ran = list(dvc_repro(clone, no_thread_pin=True))
    assert ran and all(not name.startswith(("export", "prepare", "train-", "evaluate-")) for name in ran), ran
    differ = [f for f in reports if (clone / f).read_bytes() != (root / f).read_bytes()]
    assert not differ, differ
    assert run(["git", "status", "--porcelain"], clone).stdout == ""
    assert plots_errors(clone, "HEAD") == []  # `dvc plots diff`: the committed revision read from the cache


def test_execution_settings_retrain_nothing(smoke_repro):
    """eval batch size, logging and checkpoint cadence, workers: no stage tracks them (params.runtime)."""
    root, _, _ = smoke_repro
    params_file = root / "params.yaml"
    original = params_file.read_text()
    params = yaml.safe_load(original)
    params["runtime"].update(eval_batch_size=7, log_every=3, ckpt_every=11, workers=1)
    params["splus"]["runtime"] = {"log_every": 2}
    params_file.write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        stale = dvc_graph.status(["dvc.yaml"], root)  # the paper's pipeline (not benchmarks/)
    finally:
        params_file.write_text(original)
    assert stale == {}, stale


def test_table_regenerates_byte_identical_from_cached_metrics(smoke_repro):
    root, _, _ = smoke_repro
    before = {p: (root / p).read_bytes() for p in ("reports/table1.md", "reports/table1.png", "metrics/table1_summary.json")}
    run(["dvc", "repro", "--force", "--single-item", "table1"], root, no_thread_pin=True)
    assert before == {p: (root / p).read_bytes() for p in before}


def test_param_change_shows_in_params_and_metrics_diff(smoke_repro):
    root, _, _ = smoke_repro
    run([*GIT, "add", "-A"], root)
    run([*GIT, "commit", "-qm", "repro"], root)
    params = yaml.safe_load((root / "params.yaml").read_text())
    seeds = params["splus"]["seeds"]
    # Dropping a seed retrains nothing: the train stage restores each remaining run from its checkpoint.
    params["splus"]["seeds"] = seeds[:-1]
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    times = root / ".dvc/tmp/seed_dropped.json"
    out = run([sys.executable, "-m", "dpnrepro.dvc_graph", "repro", "--times", str(times)], root, no_thread_pin=True)
    log = out.stdout + out.stderr
    ran = json.loads(times.read_text())
    assert "evaluate-table1" in ran and "train-table1" not in ran, ran
    assert "resuming from checkpoints/splus/" in log and "at step 100/100" in log, log[-3000:]
    pdiff = json.loads(run(["dvc", "params", "diff", "--json"], root).stdout)
    change = pdiff["params.yaml"]["splus.seeds"]  # DVC writes a list value as its YAML text
    assert (yaml.safe_load(change["old"]), yaml.safe_load(change["new"])) == (seeds, seeds[:-1]), pdiff
    mdiff = json.loads(run(["dvc", "metrics", "diff", "--all", "--json"], root).stdout)
    assert "splus.Mu/7.dpn-conv.mean" in mdiff["metrics/headline/table1.json"], mdiff
