"""Tiny end-to-end runs of the training-throughput and input-pipeline benchmarks on CPU (library and stage
entry points). The statistics themselves are checked by hand in test_bench_rounds.py."""
from __future__ import annotations

import json
import runpy
import statistics
import sys

import pytest
import torch
from helpers import REPO

from dpnrepro.benchmarks.contenders import measure_matmul_tflops
from dpnrepro.benchmarks.throughput_report import render_markdown
from dpnrepro.benchmarks.train_throughput import run_benchmark
from dpnrepro.errors import UserError

TINY = {"batch_size": 2, "warmup_steps": 1, "rounds": 6, "steps_per_round": 1, "device": "cpu", "img_size": 28,
        "num_classes": 10, "progress": False}


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
        # one block per round; ms/step is their median, inside its CI ([min, max] for 6 rounds)
        block = row["ms_per_step_rounds"]
        assert len(block) == 6 and row["ms_per_step"] == pytest.approx(statistics.median(block))
        assert row["ms_per_step_ci"] == [min(block), max(block)]
    assert rows["timm"]["model"].startswith("timm VisionTransformer")  # timm registers no Mu size
    # every round ran every model once, in a shuffled order
    orders = res["round_orders"]["Mu-7"]
    assert len(orders) == 6 and all(sorted(o) == sorted(rows) for o in orders)
    comps = res["comparisons"]["Mu-7"]
    assert set(comps) == {"dpn_vs_conv", "linear_vs_conv", "conv_vs_timm", "dpn_vs_timm"}
    c = comps["dpn_vs_conv"]  # paired by round: the ratios are the per-round block-time ratios
    assert c["ratios"] == pytest.approx([d / b for d, b in zip(rows["dpn"]["ms_per_step_rounds"],
                                                               rows["conv"]["ms_per_step_rounds"])])
    assert c["median_pct"] == pytest.approx(100 * (statistics.median(c["ratios"]) - 1))
    assert c["ci_pct"][0] <= c["median_pct"] <= c["ci_pct"][1] and c["rounds"] == 6
    assert c["resolved"] in ("slower", "faster", "not resolved")
    assert all(t["verdict"] == "not evaluated" and "CPU" in t["note"] for t in res["targets"].values())
    json.dumps(res)  # JSON-able as metrics


def test_markdown_names_device_and_cpu_caveat(tiny_result):
    md = render_markdown(tiny_result)
    assert tiny_result["device"] in md
    assert "not evaluated" in md and "MFU is n/a" in md
    assert "| Mu-7 | dpn |" in md and "| Mu-7 | timm stock |" in md
    assert "6 interleaved rounds" in md and "96.9 % with 6 rounds" in md
    timm_row = next(line for line in md.splitlines() if line.startswith("| Mu-7 | timm stock |"))
    assert timm_row.endswith("] |")  # timm vs our conv stem, with its CI


def test_matmul_reference_is_positive():
    assert measure_matmul_tflops(torch.device("cpu"), torch.float32, n=64, min_seconds=0.01) > 0


def test_bad_names_are_user_errors():
    with pytest.raises(UserError, match="unknown arch"):
        run_benchmark(["X-16"], ["dpn"], **TINY)
    with pytest.raises(UserError, match="unknown stem"):
        run_benchmark(["Mu-7"], ["nope"], **TINY)
    with pytest.raises(UserError, match="not divisible"):
        run_benchmark(["Mu-8"], ["dpn"], **TINY)
    with pytest.raises(UserError, match="warm-up"):
        run_benchmark(["Mu-7"], ["dpn"], **{**TINY, "warmup_steps": 0})
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="benchmark.device is 'cuda'"):
            run_benchmark(["Mu-7"], ["dpn"], **{**TINY, "device": "cuda"})


def test_stage_cli_writes_outputs(tmp_path, monkeypatch):
    out_json, out_md = tmp_path / "metrics" / "benchmarks.json", tmp_path / "reports" / "benchmarks.md"
    monkeypatch.setattr(sys, "argv", [
        "benchmark.py", "--params", str(REPO / "params.yaml"), "--archs", "Mu-7", "--stems", "dpn",
        "--no-timm-reference", "--batch-size", "2", "--warmup-steps", "1", "--rounds", "6", "--steps-per-round", "1",
        "--device", "cpu",
        "--img-size", "28", "--num-classes", "10", "--out-json", str(out_json), "--out-md", str(out_md),
        "--no-progress"])
    runpy.run_path(str(REPO / "stages" / "benchmark.py"), run_name="__main__")
    res = json.loads(out_json.read_text())
    assert list(res["results"]["Mu-7"]) == ["dpn"] and res["batch_size"] == 2 and res["rounds"] == 6
    assert res["img_size"] == 28 and res["comparisons"]["Mu-7"] == {}  # one model: nothing to compare
    assert res["device"] in out_md.read_text()


def test_stage_cli_rejects_bad_override(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["benchmark.py", "--params", str(REPO / "params.yaml"), "--batch-size", "0",
                                      "--out-json", str(tmp_path / "b.json"), "--out-md", str(tmp_path / "b.md")])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / "stages" / "benchmark.py"), run_name="__main__")
    assert exc.value.code == 2
    assert "batch_size" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("flag, value", [("--rounds", "5"), ("--steps-per-round", "0"), ("--warmup-steps", "0")])
def test_stage_cli_rejects_too_few_rounds_or_steps(tmp_path, monkeypatch, capsys, flag, value):
    monkeypatch.setattr(sys, "argv", ["benchmark.py", "--params", str(REPO / "params.yaml"), flag, value,
                                      "--out-json", str(tmp_path / "b.json"), "--out-md", str(tmp_path / "b.md")])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / "stages" / "benchmark.py"), run_name="__main__")
    assert exc.value.code == 2
    assert flag[2:].replace("-", "_") in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()


@pytest.fixture
def restore_threads(monkeypatch):
    """The input stage runs single-threaded in this process: give the other tests their threads back."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_input_stage_cli_writes_outputs(tmp_path, monkeypatch, restore_threads):
    out_json, out_md = tmp_path / "input.json", tmp_path / "input.md"
    monkeypatch.setattr(sys, "argv", ["bench_input.py", "--n", "2", "--rounds", "6", "--size", "32",
                                      "--out-json", str(out_json), "--out-md", str(out_md), "--no-progress"])
    runpy.run_path(str(REPO / "stages" / "bench_input.py"), run_name="__main__")
    res = json.loads(out_json.read_text())
    assert res["rounds"] == 6 and res["n_per_round"] == 2 and res["image_size"] == 32
    assert all(len(b["rounds_img_per_s_per_core"]) == 6 for b in res["backends"].values())
    sp = res["speedups"]["fast_over_pil"]
    assert sp["ci"][0] <= sp["median"] <= sp["ci"][1] and sp["resolved"] in ("faster", "slower", "not resolved")
    assert "interleaved rounds" in out_md.read_text()


def test_input_stage_cli_keeps_stage_outputs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["bench_input.py", "--rounds", "6", "--out-json", "metrics/input_pipeline.json"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / "stages" / "bench_input.py"), run_name="__main__")
    assert exc.value.code == 2 and "stage's outputs" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["bench_input.py", "--rounds", "0"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / "stages" / "bench_input.py"), run_name="__main__")
    assert exc.value.code == 2 and "--rounds 0" in capsys.readouterr().err
    assert not (tmp_path / "metrics").exists()


def test_oom_in_a_timing_round_drops_only_that_model(monkeypatch):
    """A GPU OOM while the arch's models are resident (simulated on CPU) gives that model an error row; the
    others finish their rounds and are still compared."""
    from dpnrepro.benchmarks import train_throughput as tt
    from dpnrepro.benchmarks.contenders import Contender

    real_block = Contender.time_block
    calls = {"n": 0}

    def flaky_block(self, steps):
        if "'linear'" in self.name:
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_block(self, steps)

    monkeypatch.setattr(Contender, "time_block", flaky_block)
    monkeypatch.setattr(tt, "is_cuda_oom", lambda exc, device: "out of memory" in str(exc))
    res = run_benchmark(["Mu-7"], ["conv", "linear", "dpn"], timm_reference=False, measure_matmul=False, **TINY)
    rows = res["results"]["Mu-7"]
    assert "round 2" in rows["linear"]["error"]
    assert len(rows["dpn"]["ms_per_step_rounds"]) == 6 and len(rows["conv"]["ms_per_step_rounds"]) == 6
    assert set(res["comparisons"]["Mu-7"]) == {"dpn_vs_conv"}
    assert "| Mu-7 | linear | | | | | | | CUDA out of memory in timing round 2" in render_markdown(res)


def test_the_benchmarks_headline_is_cut_from_their_results_and_is_their_only_dvc_metric():
    """`dvc metrics diff` on benchmarks/dvc.yaml shows img/s, MFU and the paired comparisons, not 20 rounds of
    ratios per comparison; the numbers are the detail's own."""
    import json

    import yaml

    from dpnrepro.benchmarks.headline import input_headline, throughput_headline
    from helpers import REPO

    result = json.loads((REPO / "metrics/benchmarks.json").read_text())
    head = throughput_headline(result)
    for arch, models in result["results"].items():
        assert {m: head[arch][m]["img_per_s"] for m in models} == {m: r["img_per_s"] for m, r in models.items()}
        for name, c in result["comparisons"][arch].items():
            assert head[arch][name] == {"median_pct": c["median_pct"], "ci_pct": c["ci_pct"], "resolved": c["resolved"]}
    res = json.loads((REPO / "metrics/input_pipeline.json").read_text())
    inp = input_headline(res)
    assert inp["img_per_s_per_core"] == {k: b["img_per_s_per_core"] for k, b in res["backends"].items()}
    assert inp["fast_over_pil"]["median"] == res["speedups"]["fast_over_pil"]["median"]
    stages = yaml.safe_load((REPO / "benchmarks/dvc.yaml").read_text())["stages"]
    assert [next(iter(m)) for m in stages["benchmark"]["metrics"]] == ["metrics/headline/benchmarks.json"]
    assert [next(iter(m)) for m in stages["bench_input"]["metrics"]] == ["metrics/headline/input_pipeline.json"]
    for name, fn, detail in (("benchmarks", throughput_headline, result), ("input_pipeline", input_headline, res)):
        assert json.loads((REPO / f"metrics/headline/{name}.json").read_text()) == json.loads(json.dumps(fn(detail)))


# --- step levers ---------------------------------------------------------------------------------------

def test_stage_cli_passes_the_step_levers_and_the_op_profile(tmp_path, monkeypatch):
    from dpnrepro.benchmarks.contenders import Contender

    out_json, out_md = tmp_path / "b.json", tmp_path / "b.md"
    real_init, got = Contender.__init__, []
    monkeypatch.setattr(Contender, "__init__", lambda self, *a, **kw: got.append(kw.get("levers")) or real_init(
        self, *a, **kw))
    monkeypatch.setattr(sys, "argv", [
        "benchmark.py", "--params", str(REPO / "params.yaml"), "--archs", "Mu-7", "--stems", "dpn",
        "--no-timm-reference", "--batch-size", "2", "--warmup-steps", "1", "--rounds", "6", "--steps-per-round", "1",
        "--device", "cpu", "--img-size", "28", "--num-classes", "10", "--sdpa-backend", "math", "--channels-last",
        "--profile-ops", "--out-json", str(out_json), "--out-md", str(out_md), "--no-progress"])
    runpy.run_path(str(REPO / "stages" / "benchmark.py"), run_name="__main__")
    res = json.loads(out_json.read_text())
    assert res["levers"] == {"sdpa_backend": "math", "channels_last": True}
    assert [lv.changed() for lv in got] == [res["levers"]]  # the contender ran with them
    prof = res["results"]["Mu-7"]["dpn"]["op_profile"]
    assert prof["ms_per_step"] > 0 and {g["group"] for g in prof["groups"]} & {"matmul", "attention"}
    md = out_md.read_text()
    assert "Step levers: `sdpa_backend=math`, `channels_last=True`." in md and "time by group" in md


def test_levers_change_the_speed_not_the_step():
    """The same model, batch and update with the math attention kernel and NHWC images: the same loss and weights."""
    from dpnrepro.benchmarks.contenders import DEFAULT_OPTIM, Contender, StepLevers, photo_batch
    from dpnrepro.models import build_vit
    from dpnrepro.training.losses import one_hot_targets

    images = photo_batch(4, 28)
    targets = one_hot_targets(torch.arange(4) % 10, 10)
    out = []
    for levers in (StepLevers(), StepLevers(sdpa_backend="math", channels_last=True)):
        torch.manual_seed(0)
        model = build_vit("Mu/7", stem="dpn", img_size=28, num_classes=10)
        c = Contender(model, "m", images, targets, optim_cfg=DEFAULT_OPTIM, grad_clip=1.0, compile_model=False,
                      levers=levers)
        out.append((c.step(), [p.detach().clone() for p in model.parameters()]))
    assert torch.allclose(out[0][0], out[1][0], rtol=1e-5)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(out[0][1], out[1][1]))


def test_compile_levers_reach_torch_compile(monkeypatch):
    """compile_mode compiles forward + loss in that mode; compiled_optimizer compiles clipping + the step."""
    from dpnrepro.benchmarks.contenders import DEFAULT_OPTIM, Contender, StepLevers, photo_batch
    from dpnrepro.models import build_vit
    from dpnrepro.training.losses import one_hot_targets

    seen = []

    def fake_compile(fn=None, *, mode=None, **kw):
        seen.append((getattr(fn, "__name__", ""), mode))
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    images, targets = photo_batch(2, 28), one_hot_targets(torch.arange(2), 10)
    for levers in (StepLevers(), StepLevers(compile_mode="max-autotune-no-cudagraphs", compiled_optimizer=True)):
        model = build_vit("Mu/7", stem="dpn", img_size=28, num_classes=10)
        Contender(model, "m", images, targets, optim_cfg=DEFAULT_OPTIM, grad_clip=1.0, compile_model=True,
                  levers=levers).step()
    assert seen == [("loss_of", None), ("__call__", "max-autotune-no-cudagraphs"), ("update", None)]
    with pytest.raises(UserError, match="sdpa_backend"):
        StepLevers(sdpa_backend="fast")


def test_the_benchmark_times_the_optimizer_training_uses():
    """On the CPU too, the contenders step the optimizer the trainer builds (torch's fused AdamW)."""
    from dpnrepro.benchmarks.contenders import DEFAULT_OPTIM, Contender, photo_batch
    from dpnrepro.models import build_vit
    from dpnrepro.training.losses import one_hot_targets
    from dpnrepro.training.optim import build_optimizer

    model = build_vit("Mu/7", stem="dpn", img_size=28, num_classes=10)
    timed = Contender(model, "m", photo_batch(2, 28), one_hot_targets(torch.arange(2), 10), optim_cfg=DEFAULT_OPTIM,
                      grad_clip=1.0, compile_model=False).optimizer
    trained = build_optimizer(model, DEFAULT_OPTIM)  # as training/trainer.py builds it
    assert type(timed) is type(trained) and timed.defaults == trained.defaults
    assert timed.defaults["fused"] is True


@pytest.mark.parametrize("script, results, runner, outputs", [
    ("benchmark.py", "train_throughput", "run_benchmark",
     ("metrics/benchmarks.json", "reports/benchmarks.md", "metrics/headline/benchmarks.json")),
    ("bench_input.py", "input_pipeline", "run_input_benchmark",
     ("metrics/input_pipeline.json", "reports/input_pipeline.md", "metrics/headline/input_pipeline.json")),
])
def test_a_benchmark_stage_writes_its_three_files_or_none(tmp_path, monkeypatch, capsys, restore_threads, tiny_result,
                                                          script, results, runner, outputs):
    """A write failing at the third file (full disk) leaves the previous three files as they were."""
    import errno
    import importlib
    import shutil

    import dpnrepro.reports.headline

    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    for path in outputs:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(f"previous {path}\n")
    if runner == "run_input_benchmark":
        from dpnrepro.benchmarks.input_pipeline import run_input_benchmark

        canned = run_input_benchmark(n=2, rounds=6, seed=0, size=32, progress=False)
    else:
        canned = tiny_result
    monkeypatch.setattr(importlib.import_module(f"dpnrepro.benchmarks.{results}"), runner, lambda **_: canned)

    def full_disk(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", outputs[2])

    monkeypatch.setattr(dpnrepro.reports.headline, "write_headline", full_disk)
    monkeypatch.setattr(sys, "argv", [script])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(REPO / "stages" / script), run_name="__main__")
    assert exc.value.code == 2 and "no space left on device" in capsys.readouterr().err
    assert [(tmp_path / p).read_text() for p in outputs] == [f"previous {p}\n" for p in outputs]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        ["params.yaml", *(p.rsplit("/", 1)[1] for p in outputs)]), "no temporary file is left behind"
