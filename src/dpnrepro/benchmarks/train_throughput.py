"""Training throughput, MFU and peak memory of our ViTs (conv / linear / DPN stems) next to timm's stock ViT.

One process, one fixed batch on the device (real photos as uint8, random labels: no input pipeline), the
trainer's own step (``dpnrepro.training.step``) for every model:

    uint8 → [-1, 1] on the device → forward (bf16 autocast on CUDA, fp32 on CPU) → sigmoid cross-entropy
    (``dpnrepro.training.losses``) → backward → global-norm clip (``grad_clip``, 0 = off) → optimizer step
    (``dpnrepro.training.optim.build_optimizer``: the project's Adam with decoupled weight decay; fused on
    every device, as in training, unless ``fused_optimizer=False``). ``compile`` compiles forward + loss
    (and so the backward) as one graph; ``cudagraphs`` replays them as CUDA graphs.

Per arch, every model (stems + timm's stock ViT) is built and given ``warmup_steps`` untimed steps
(they include torch.compile's compilation; peak memory is measured over build + warm-up), then the
models are timed in **interleaved rounds**: round ``r`` runs one block of ``steps_per_round`` steps of
every model, in an order reshuffled each round with a fixed seed (:mod:`dpnrepro.benchmarks.rounds`),
timed with CUDA events on CUDA and ``time.perf_counter`` on CPU. A model's ms/step is the median over
rounds of its per-round block time / ``steps_per_round``; a comparison (DPN vs conv, linear vs conv,
ours vs timm) is the median over rounds of the paired per-round step-time ratio with a
distribution-free 95 % CI for that median (order statistics); a target is "met" / "not met" only
when the CI lies wholly on one side of its threshold, else "not resolved".

Reported per model: ms/step, img/s, achieved model TFLOP/s (3 × the analytic forward FLOPs of
:mod:`dpnrepro.benchmarks.flops`), MFU against the device's datasheet dense bf16 peak (CUDA only; "n/a"
on CPU and on unknown GPUs), and peak memory (``torch.cuda.max_memory_allocated`` on CUDA; the
process's peak-RSS increase on CPU).

:func:`run_benchmark` returns a JSON-able dict; :func:`~dpnrepro.benchmarks.throughput_report.render_markdown`
turns it into ``reports/benchmarks.md``. The models, their training step and the memory / matmul helpers
are in :mod:`dpnrepro.benchmarks.contenders`. ``stages/benchmark.py`` is the entry point.
"""

from __future__ import annotations

import contextlib
import gc
import math
import re
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from dpnrepro.benchmarks.contenders import (
    DEFAULT_OPTIM,
    Contender,
    CpuPeakRss,
    build_timm,
    is_cuda_oom,
    measure_matmul_tflops,
    norm_arch,
    photo_batch,
    prepare,
    timm_reference_name,
)
from dpnrepro.benchmarks.flops import (
    TRAIN_FLOPS_MULTIPLIER,
    peak_bf16_tflops,
    vit_forward_flops,
)
from dpnrepro.benchmarks.rounds import MIN_ROUNDS, compare, median_ci, ratio_summary, round_orders, target_verdict
from dpnrepro.benchmarks.throughput_report import render_markdown
from dpnrepro.cli import cpu_model
from dpnrepro.errors import UserError
from dpnrepro.training.distributed import pick_device

# re-exported: DEFAULT_OPTIM, measure_matmul_tflops, photo_batch, timm_reference_name (contenders.py) and
# render_markdown (throughput_report.py) keep their old import path
__all__ = ["COMPARISONS", "DEFAULT_OPTIM", "TARGETS", "measure_matmul_tflops", "photo_batch", "render_markdown",
           "run_benchmark", "timm_reference_name"]

# The benchmark's targets (GPU, bf16): B/16 DPN MFU on one H100, and DPN's step-time overhead over conv.
TARGETS = {
    "b16_dpn_mfu_pct": {"arch": "B-16", "what": "B/16 DPN MFU, bf16, one H100", "op": ">=", "threshold": 50.0},
    "b16_dpn_overhead_pct": {"arch": "B-16", "what": "B/16 DPN step-time overhead over conv stem", "op": "<=",
                             "threshold": 1.0},
    "ti16_dpn_overhead_pct": {"arch": "Ti-16", "what": "Ti/16 DPN step-time overhead over conv stem", "op": "<=",
                              "threshold": 3.0},
}

# Paired comparisons per arch: key -> (model, reference); reported as (step time ratio - 1) x 100.
COMPARISONS = {
    "dpn_vs_conv": ("dpn", "conv"),
    "linear_vs_conv": ("linear", "conv"),
    "conv_vs_timm": ("conv", "timm"),
    "dpn_vs_timm": ("dpn", "timm"),
}


def _row(partial: dict, block_ms: list[float], *, batch: int, fwd_flops: float, peak_tflops: float | None,
         matmul_tflops: float | None, final_loss: float) -> dict:
    """A model's result row from its per-round ms/step: medians over rounds with their 95 % CIs."""
    med, lo, hi, cov = median_ci(block_ms)
    train_flops = TRAIN_FLOPS_MULTIPLIER * fwd_flops

    def rate(ms):  # achieved TFLOP/s at ``ms`` per step
        return None if ms is None else train_flops * batch / (ms / 1e3) / 1e12

    achieved = rate(med)

    def pct_of(peak, ms):
        return None if (peak is None or ms is None) else 100 * rate(ms) / peak

    row = dict(partial)
    row.update({
        "fwd_gflop_per_img": fwd_flops / 1e9,
        "train_gflop_per_img": train_flops / 1e9,
        "ms_per_step": med,  # median over rounds
        "ms_per_step_ci": None if lo is None else [lo, hi],
        "ci_coverage": cov,
        "ms_per_step_rounds": block_ms,
        "img_per_s": batch / (med / 1e3),
        "achieved_tflops": achieved,
        "mfu_pct": pct_of(peak_tflops, med),
        # a longer step is a lower MFU: the CI's ends swap
        "mfu_pct_ci": None if (peak_tflops is None or lo is None) else [pct_of(peak_tflops, hi),
                                                                          pct_of(peak_tflops, lo)],
        "vs_matmul_pct": pct_of(matmul_tflops or None, med),
        "final_loss": final_loss,
    })
    if not math.isfinite(final_loss):
        row["note"] = "loss not finite (synthetic data; throughput still valid)"
    return row


# ---------------------------------------------------------------------------------------------------
# The benchmark

def _comparisons(rows: dict[str, dict]) -> dict[str, dict]:
    """Per comparison: median over rounds of (step time model / step time reference − 1) × 100, 95 % CI."""
    out = {}
    for key, (a, b) in COMPARISONS.items():
        ra, rb = rows.get(a), rows.get(b)
        if not ra or not rb or "ms_per_step_rounds" not in ra or "ms_per_step_rounds" not in rb:
            continue
        s = ratio_summary(ra["ms_per_step_rounds"], rb["ms_per_step_rounds"])
        pct = (lambda x: None if x is None else 100 * (x - 1))
        out[key] = {"model": a, "reference": b, "rounds": s["n"], "median_pct": pct(s["median"]),
                    "ci_pct": None if s["lo"] is None else [pct(s["lo"]), pct(s["hi"])],
                    "ci_coverage": s["coverage"], "resolved": compare(s, above="slower", below="faster"),
                    "ratios": s["ratios"]}
    return out


def _evaluate_targets(results: dict, comparisons: dict, *, device_type: str, device_name: str) -> dict:
    is_h100 = device_type == "cuda" and re.search(r"\bH100\b", device_name) is not None
    out = {}
    for key, t in TARGETS.items():
        arch = t["arch"]
        if key.endswith("mfu_pct"):
            row = results.get(arch, {}).get("dpn") or {}
            value, ci = row.get("mfu_pct"), row.get("mfu_pct_ci")
        else:
            c = comparisons.get(arch, {}).get("dpn_vs_conv") or {}
            value, ci = c.get("median_pct"), c.get("ci_pct")
        entry = dict(t, value=value, ci=ci, verdict="not evaluated")
        if device_type != "cuda":
            entry["note"] = "GPU (bf16) target; not measurable on CPU"
        elif arch not in results:
            entry["note"] = f"{arch} not in this run"
        elif value is None:
            entry["note"] = "no value (model failed, or MFU unknown for this device)"
        elif key.endswith("mfu_pct") and not is_h100:
            entry["note"] = f"defined on an H100; this device is {device_name}"
        else:
            entry["verdict"] = target_verdict(*(ci or (None, None)), t["op"], t["threshold"])
            if ci is None:
                entry["note"] = f"fewer than {MIN_ROUNDS} rounds: no 95 % CI"
        out[key] = entry
    return out


def run_benchmark(
        archs: Sequence[str],
        stems: Sequence[str] = ("conv", "linear", "dpn"),
        *,
        timm_reference: bool = True,
        batch_size: int = 8,
        warmup_steps: int = 2,
        rounds: int = 10,
        steps_per_round: int = 2,
        compile: bool = False,
        cudagraphs: bool = False,
        fused_optimizer: bool = True,
        device: str = "auto",
        img_size: int = 224,
        num_classes: int = 1000,
        optim_cfg=None,
        peak_tflops: float | None = None,
        measure_matmul: bool = True,
        hardware: str | None = None,
        seed: int = 0,
        progress: bool = True,
        sdpa_backend: str = "auto",
        compile_mode: str = "default",
        compiled_optimizer: bool = False,
        channels_last: bool = False,
        profile_ops: bool = False,
) -> dict:
    """Measure the training step of every ``arch × stem`` (plus timm's stock ViT per arch) in this process,
    the models of one arch interleaved in ``rounds`` rounds of ``steps_per_round`` timed steps each.

    ``optim_cfg``: anything with ``optimizer``, ``lr``, ``weight_decay`` (e.g. ``params.train``) and
    optionally ``grad_clip``; default Adam lr 1e-3, wd 1e-4, clip 1.0 (the smoke/AugReg recipe).
    ``peak_tflops`` overrides the datasheet table for MFU. ``seed`` fixes the weights, the batch and the
    round orders. Returns a JSON-able dict (see :func:`render_markdown`); a model that runs out of GPU
    memory gets an ``error`` row. All models of one arch are resident at once (memory: one arch's models
    and optimizer states, plus one model's activations).

    Step levers (:class:`~dpnrepro.benchmarks.contenders.StepLevers`): ``sdpa_backend``,
    ``compile_mode``, ``compiled_optimizer``, ``channels_last``; recorded under ``levers`` when any differs
    from the trainer's step. ``profile_ops``: after the rounds, each model's step profiled by kernel group
    (:func:`~dpnrepro.benchmarks.op_profile.kernel_breakdown`), under ``op_profile``.
    """
    from dpnrepro.benchmarks.contenders import StepLevers
    from dpnrepro.models import STEMS, build_vit
    from dpnrepro.training.losses import one_hot_targets

    arch_names = [norm_arch(a) for a in archs]
    bad = [s for s in stems if s not in STEMS]
    if bad:
        raise UserError(f"benchmark.stems: unknown stem(s) {bad}; choose from {', '.join(STEMS)}")
    for key, name in arch_names:
        patch = int(name.split("/")[1])
        if img_size % patch:
            raise UserError(f"benchmark: img_size {img_size} is not divisible by the patch size of {key}")
    if warmup_steps < 1:
        raise UserError("benchmark: needs at least one warm-up step (first-step allocations and torch.compile's "
                        "compilation would be timed; peak memory is measured over the warm-up)")
    if rounds < 1 or steps_per_round < 1:
        raise UserError("benchmark: rounds and steps_per_round must be >= 1")
    levers = StepLevers(sdpa_backend, compile_mode, compiled_optimizer, channels_last)
    optim_cfg = optim_cfg or DEFAULT_OPTIM
    grad_clip = float(getattr(optim_cfg, "grad_clip", 0.0) or 0.0)
    if device == "cuda" and not torch.cuda.is_available():  # pick_device's message names train.device
        raise UserError("benchmark.device is 'cuda' but no CUDA device is visible; use --device auto or cpu")
    dev = pick_device(device)
    if hardware is None:
        from dpnrepro.cli import hardware_label

        hardware = hardware_label(measured_on=True)

    if dev.type == "cuda":
        device_name = torch.cuda.get_device_name(dev)
        dtype_label = "bf16 autocast (fp32 master weights)"
        known = peak_bf16_tflops(device_name)
        if peak_tflops is not None:
            peak, peak_source = float(peak_tflops), "given on the command line"
        elif known is not None:
            peak, peak_source = known[0], f"{known[1]} datasheet dense bf16"
        else:
            peak, peak_source = None, f"unknown device {device_name!r}: no datasheet peak (pass --peak-tflops)"
        mem_label = ("torch.cuda.max_memory_allocated over build + warm-up − allocated before the model "
                     "(excl. the shared batch)")
    else:
        device_name = f"CPU {cpu_model()} ({torch.get_num_threads()} threads)"
        dtype_label = "fp32"
        peak = float(peak_tflops) if peak_tflops is not None else None
        peak_source = ("given on the command line" if peak is not None
                       else "none: no reliable CPU peak, MFU is n/a")
        mem_label = CpuPeakRss().label + ", over build + warm-up"

    matmul = None
    if measure_matmul:
        mm_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        matmul = {"dtype": str(mm_dtype).replace("torch.", ""),
                  "tflops": measure_matmul_tflops(dev, mm_dtype)}

    gen = torch.Generator(device=dev).manual_seed(seed)
    images = photo_batch(batch_size, img_size).to(dev)
    labels = torch.randint(0, num_classes, (batch_size,), device=dev, generator=gen)
    targets = one_hot_targets(labels, num_classes)

    def builders(name: str) -> dict:
        jobs = {stem: (lambda stem=stem: (build_vit(name, stem=stem, img_size=img_size, num_classes=num_classes),
                                          f"dpnrepro build_vit({name!r}, stem={stem!r})")) for stem in stems}
        if timm_reference:
            jobs["timm"] = lambda: build_timm(name, img_size, num_classes)
        return jobs

    n_variants = len(stems) + bool(timm_reference)
    bar = tqdm(total=len(arch_names) * n_variants * (1 + rounds), desc="benchmark", unit="block",
               disable=not progress, dynamic_ncols=True)
    results: dict[str, dict[str, dict]] = {}
    schedules: dict[str, list[list[str]]] = {}
    recompiled: dict[str, bool] = {}
    cudnn_benchmark = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True  # let cuDNN pick its fastest conv-stem kernels (as timm's benchmark)
    try:
        for a_idx, (key, name) in enumerate(arch_names):
            if compile:
                torch._dynamo.reset()  # this arch's models compile afresh (no recompile limit shared across archs)
            fwd = vit_forward_flops(key, img_size=img_size, num_classes=num_classes).total
            live: dict[str, Contender] = {}
            rows: dict[str, dict] = {}
            for variant, build in builders(name).items():
                bar.set_description(f"benchmark {key} {variant} warm-up")
                contender, partial = prepare(build, device=dev, images=images, targets=targets,
                                              optim_cfg=optim_cfg, grad_clip=grad_clip, warmup_steps=warmup_steps,
                                              compile_model=compile, seed=seed, cudagraphs=cudagraphs,
                                              fused_optimizer=fused_optimizer, levers=levers)
                rows[variant] = partial
                if contender is not None:
                    live[variant] = contender
                bar.update(1 if contender is not None else 1 + rounds)
            graphs_before = _compiled_graphs()
            schedule = round_orders(list(live), rounds, seed + a_idx)
            block_ms: dict[str, list[float]] = {v: [] for v in live}
            for r, order in enumerate(schedule):
                bar.set_description(f"benchmark {key} round {r + 1}/{rounds}")
                for variant in order:
                    if variant in live:
                        try:
                            block_ms[variant].append(live[variant].time_block(steps_per_round))
                        except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
                            if not is_cuda_oom(exc, dev):
                                raise
                            # the other models of the arch are resident: drop this one, keep the rest going
                            live.pop(variant).release()
                            rows[variant] = {"error": f"CUDA out of memory in timing round {r + 1} at batch "
                                                      f"{batch_size} ({n_variants} models resident)"}
                            gc.collect()
                            torch.cuda.empty_cache()
                    bar.update(1)
            recompiled[key] = compile and _compiled_graphs() != graphs_before
            if profile_ops:
                from dpnrepro.benchmarks.op_profile import kernel_breakdown

                for variant, c in live.items():
                    rows[variant]["op_profile"] = kernel_breakdown(c.step, steps_per_round, dev)
            for variant, c in live.items():
                rows[variant] = _row(rows[variant], block_ms[variant], batch=batch_size, fwd_flops=fwd,
                                     peak_tflops=peak, matmul_tflops=matmul["tflops"] if matmul else None,
                                     final_loss=float(c.last_loss.detach()))
                c.release()
            del live
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            results[key] = rows
            schedules[key] = schedule
    finally:
        torch.backends.cudnn.benchmark = cudnn_benchmark
        bar.close()

    comparisons = {key: _comparisons(rows) for key, rows in results.items()}

    import timm

    extra = {"levers": levers.changed()} if levers.changed() else {}
    b16_fwd = vit_forward_flops("B/16", img_size=224, num_classes=1000).total  # the targets' reference point
    return {
        "device_type": dev.type,
        "device": device_name,
        "hardware": hardware,
        "dtype": dtype_label,
        "torch": torch.__version__,
        "timm": timm.__version__,
        "batch_size": batch_size,
        "warmup_steps": warmup_steps,
        "rounds": rounds,
        "steps_per_round": steps_per_round,
        "seed": seed,
        "statistic": ("median over rounds of the per-round ratio (paired by round); 95 % CI for the median from "
                      "order statistics (distribution-free, exact binomial coverage)"),
        "compile": bool(compile),
        "cudagraphs": bool(compile and cudagraphs and dev.type == "cuda"),
        "fused_optimizer": bool(fused_optimizer),
        "input": "uint8 batch of real photos (benchmarks/input_pipeline.py), scaled to [-1, 1] on the device each step",
        "recompiled_during_timing": recompiled if compile else None,
        "cudnn_benchmark": dev.type == "cuda",
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "img_size": img_size,
        "num_classes": num_classes,
        "optimizer": f"{optim_cfg.optimizer} (dpnrepro build_optimizer), grad clip {grad_clip:g}",
        "peak_tflops": peak,
        "peak_source": peak_source,
        "matmul_reference": matmul,
        "memory_measure": mem_label,
        "b16_img_per_s_for_50pct_mfu": (None if peak is None
                                        else 0.5 * peak * 1e12 / (TRAIN_FLOPS_MULTIPLIER * b16_fwd)),
        "round_orders": schedules,
        "results": results,
        "comparisons": comparisons,
        "targets": _evaluate_targets(results, comparisons, device_type=dev.type, device_name=device_name),
        **extra,
    }


def _compiled_graphs() -> int:
    """How many graphs torch.compile has produced so far in this process (0 when dynamo is unavailable)."""
    with contextlib.suppress(Exception):
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    return 0


