"""Training throughput, MFU and peak memory of our ViTs (conv / linear / DPN stems) next to timm's stock ViT.

One process, one fixed batch on the device (real photos as uint8, random labels: no input pipeline), the
trainer's own step (``dpnrepro.training.step``) for every model:

    uint8 → [-1, 1] on the device → forward (bf16 autocast on CUDA, fp32 on CPU) → sigmoid cross-entropy
    (``dpnrepro.training.losses``) → backward → global-norm clip (``grad_clip``, 0 = off) → optimizer step
    (``dpnrepro.training.optim.build_optimizer``: the project's Adam with decoupled weight decay; fused on
    CUDA unless ``fused_optimizer=False``). ``compile`` compiles forward + loss (and so the backward) as
    one graph; ``cudagraphs`` replays them as CUDA graphs.

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

:func:`run_benchmark` returns a JSON-able dict; :func:`render_markdown` turns it into
``reports/benchmarks.md``. ``stages/benchmark.py`` is the entry point.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import torch
from tqdm.auto import tqdm

from dpnrepro.benchmarks.flops import (
    TRAIN_FLOPS_MULTIPLIER,
    peak_bf16_tflops,
    vit_forward_flops,
)
from dpnrepro.benchmarks.rounds import MIN_ROUNDS, compare, median_ci, ratio_summary, round_orders, target_verdict
from dpnrepro.cli import cpu_model
from dpnrepro.errors import UserError
from dpnrepro.training.distributed import pick_device

__all__ = ["COMPARISONS", "TARGETS", "measure_matmul_tflops", "render_markdown", "run_benchmark",
           "timm_reference_name"]

# The targets (GPU, bf16): B/16 DPN MFU on one H100, and DPN's step-time overhead over conv.
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

_TIMM_SIZES = {"Ti": "tiny", "S": "small", "B": "base", "L": "large", "H": "huge"}
DEFAULT_OPTIM = SimpleNamespace(optimizer="adam", lr=1e-3, weight_decay=1e-4, grad_clip=1.0)


# ---------------------------------------------------------------------------------------------------
# Helpers

def _norm_arch(arch: str) -> tuple[str, str]:
    """``"B/16"`` or ``"B-16"`` -> ``("B-16", "B/16")`` (params key, model-registry name); UserError if unknown."""
    from dpnrepro.models import parse_arch

    key = arch.strip().replace("/", "-")
    name = key.replace("-", "/")
    try:
        parse_arch(name)
    except ValueError as exc:
        raise UserError(f"benchmark.archs: {exc}") from None
    return key, name


def timm_reference_name(arch: str, img_size: int) -> str | None:
    """timm's stock model for ``arch`` (``vit_base_patch16_224`` for B/16 at 224), None if timm has none."""
    import timm

    size, patch = arch.replace("-", "/").split("/")
    if size not in _TIMM_SIZES:
        return None
    name = f"vit_{_TIMM_SIZES[size]}_patch{patch}_{img_size}"
    if name not in timm.list_models(name):
        name = f"vit_{_TIMM_SIZES[size]}_patch{patch}_224"  # any img_size can be passed to it
        if name not in timm.list_models(name):
            return None
    return name


def _build_timm(arch_name: str, img_size: int, num_classes: int) -> tuple[torch.nn.Module, str]:
    """timm's stock ViT (no pretrained weights); for sizes timm does not register (Mu), timm's
    ``VisionTransformer`` class with the same dimensions."""
    import timm
    from timm.models.vision_transformer import VisionTransformer

    from dpnrepro.models import parse_arch

    name = timm_reference_name(arch_name, img_size)
    if name is not None:
        return timm.create_model(name, pretrained=False, num_classes=num_classes, img_size=img_size), name
    spec, patch = parse_arch(arch_name)
    model = VisionTransformer(img_size=img_size, patch_size=patch, embed_dim=spec.width, depth=spec.depth,
                              num_heads=spec.heads, mlp_ratio=spec.mlp_dim / spec.width, num_classes=num_classes)
    return model, f"timm VisionTransformer ({arch_name} dims)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _CpuPeakRss:
    """Peak resident-set-size increase of this process over a window (Linux ``VmHWM``).

    Writing ``5`` to ``/proc/self/clear_refs`` resets the high-water mark to the current RSS (Linux ≥ 4.0),
    so each model gets its own window. It is process-wide and approximate (allocator caching; memory
    freed by the previous model may be reused without raising RSS). Without ``clear_refs`` the
    high-water mark cannot be reset and the label says so.
    """

    def __init__(self) -> None:
        self.resettable = os.access("/proc/self/clear_refs", os.W_OK)
        self.base = 0

    @property
    def label(self) -> str:
        if self.resettable:
            return "peak RSS increase over the pre-model RSS (CPU, process-wide, approximate)"
        return "process peak RSS (CPU, ru_maxrss; NOT reset between models)"

    @staticmethod
    def _status_kib(key: str) -> int | None:
        with contextlib.suppress(OSError):
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(key + ":"):
                        return int(line.split()[1])
        return None

    def start(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed memory back so the baseline is honest
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.resettable = False
        self.base = (self._status_kib("VmRSS") or 0) * 1024

    def peak_bytes(self) -> int | None:
        if self.resettable:
            hwm = self._status_kib("VmHWM")
            return None if hwm is None else max(0, hwm * 1024 - self.base)
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, n: int | None = None,
                          min_seconds: float = 0.5) -> float:
    """Achieved TFLOP/s of an ``n × n`` matmul (2·n³ FLOPs each), a measured reference peak (not a datasheet)."""
    if n is None:
        n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b)
    _sync(device)
    iters, elapsed = 0, 0.0
    t0 = time.perf_counter()
    while elapsed < min_seconds or iters < 3:
        torch.mm(a, b)
        iters += 1
        if device.type != "cuda" or iters % 10 == 0:
            _sync(device)
            elapsed = time.perf_counter() - t0
    _sync(device)
    elapsed = time.perf_counter() - t0
    return 2 * n ** 3 * iters / elapsed / 1e12




# ---------------------------------------------------------------------------------------------------
# One model: build + warm-up (memory window), then timed blocks

class _Contender:
    """A built model with its optimizer and one training step, ready to be timed in blocks."""

    def __init__(self, model: torch.nn.Module, name: str, images: torch.Tensor, targets: torch.Tensor, *,
                 optim_cfg, grad_clip: float, compile_model: bool, cudagraphs: bool = False,
                 fused_optimizer: bool = True) -> None:
        from dpnrepro.training.losses import sigmoid_xent
        from dpnrepro.training.optim import build_optimizer
        from dpnrepro.training.step import LossStep, unit_range

        self.name = name
        self.model = model
        self.n_params = sum(p.numel() for p in model.parameters())
        device = images.device
        self.device = device
        model.train()
        # the trainer's step (training/trainer.py): uint8 batch scaled on the device, LossStep, fused optimizer
        optimizer = build_optimizer(model, optim_cfg, fused=fused_optimizer and device.type == "cuda")
        params = [p for p in model.parameters() if p.requires_grad]
        loss_step = LossStep(model, sigmoid_xent, device, compile=compile_model, cudagraphs=cudagraphs)

        def step() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_step(unit_range(images), targets)
            loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            optimizer.step()
            return loss_step.kept(loss)

        self.step: Callable[[], torch.Tensor] = step
        self.optimizer = optimizer
        self.last_loss: torch.Tensor | None = None

    def warm_up(self, steps: int) -> float:
        """``steps`` untimed steps (compilation included); returns their wall seconds."""
        t0 = time.perf_counter()
        for _ in range(steps):
            self.last_loss = self.step()
        _sync(self.device)
        return time.perf_counter() - t0

    def time_block(self, steps: int) -> float:
        """Milliseconds per step of one block of ``steps`` consecutive steps (CUDA events / perf_counter)."""
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                self.last_loss = self.step()
            end.record()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end) / steps
        t0 = time.perf_counter()
        for _ in range(steps):
            self.last_loss = self.step()
        return (time.perf_counter() - t0) * 1e3 / steps

    def release(self) -> None:
        self.model = self.optimizer = self.step = None  # type: ignore[assignment]


def photo_batch(batch_size: int, img_size: int) -> torch.Tensor:
    """A uint8 (B, 3, S, S) batch of the benchmark's real photos (the eval pipeline's resize_small +
    central_crop, data/loader.py), cycled."""
    from PIL import Image
    from torchvision.transforms import v2

    from dpnrepro.benchmarks.input_pipeline import load_photos
    from dpnrepro.data.crop import resize_ops

    to_crop = v2.Compose([*resize_ops(img_size, squash=False), v2.PILToTensor()])
    crops = []
    for blob in load_photos()[0]:
        with Image.open(io.BytesIO(blob)) as im:
            crops.append(to_crop(im.convert("RGB")))
    return torch.stack([crops[i % len(crops)] for i in range(batch_size)])


def _is_cuda_oom(exc: BaseException, device: torch.device) -> bool:
    return device.type == "cuda" and "out of memory" in str(exc).lower()


def _prepare(build, *, device, images, targets, optim_cfg, grad_clip, warmup_steps, compile_model,
             seed, cudagraphs=False, fused_optimizer=True) -> tuple[_Contender | None, dict]:
    """Build one model with ``build()`` on ``device`` and warm it up; peak memory over build + warm-up
    (the other models of the arch stay resident but idle, so they do not count). Returns the contender
    and its partial row, or ``(None, {"error": ...})`` when CUDA runs out of memory."""
    gc.collect()
    cpu_mem = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.synchronize(device)
        mem_base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        cpu_mem = _CpuPeakRss()
        cpu_mem.start()
    torch.manual_seed(seed)
    contender = None
    try:
        model, name = build()
        contender = _Contender(model.to(device), name, images, targets, optim_cfg=optim_cfg, grad_clip=grad_clip,
                               compile_model=compile_model, cudagraphs=cudagraphs, fused_optimizer=fused_optimizer)
        warmup_s = contender.warm_up(warmup_steps)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:  # torch.compile may wrap the OOM
        if not _is_cuda_oom(exc, device):
            raise
        if contender is not None:
            contender.release()
        del contender
        gc.collect()
        torch.cuda.empty_cache()
        return None, {"error": f"CUDA out of memory at batch {images.shape[0]}: {str(exc).splitlines()[0][:200]}"}
    peak_mem = (torch.cuda.max_memory_allocated(device) - mem_base) if device.type == "cuda" \
        else cpu_mem.peak_bytes()
    return contender, {"model": contender.name, "params_m": contender.n_params / 1e6, "peak_mem_bytes": peak_mem,
                       "warmup_s": warmup_s}


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
) -> dict:
    """Measure the training step of every ``arch × stem`` (plus timm's stock ViT per arch) in this process,
    the models of one arch interleaved in ``rounds`` rounds of ``steps_per_round`` timed steps each.

    ``optim_cfg``: anything with ``optimizer``, ``lr``, ``weight_decay`` (e.g. ``params.train``) and
    optionally ``grad_clip``; default Adam lr 1e-3, wd 1e-4, clip 1.0 (the smoke/AugReg recipe).
    ``peak_tflops`` overrides the datasheet table for MFU. ``seed`` fixes the weights, the batch and the
    round orders. Returns a JSON-able dict (see :func:`render_markdown`); a model that runs out of GPU
    memory gets an ``error`` row. All models of one arch are resident at once (memory: one arch's models
    and optimizer states, plus one model's activations).
    """
    from dpnrepro.models import STEMS, build_vit
    from dpnrepro.training.losses import one_hot_targets

    arch_names = [_norm_arch(a) for a in archs]
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
        mem_label = _CpuPeakRss().label + ", over build + warm-up"

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
            jobs["timm"] = lambda: _build_timm(name, img_size, num_classes)
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
            live: dict[str, _Contender] = {}
            rows: dict[str, dict] = {}
            for variant, build in builders(name).items():
                bar.set_description(f"benchmark {key} {variant} warm-up")
                contender, partial = _prepare(build, device=dev, images=images, targets=targets,
                                              optim_cfg=optim_cfg, grad_clip=grad_clip, warmup_steps=warmup_steps,
                                              compile_model=compile, seed=seed, cudagraphs=cudagraphs,
                                              fused_optimizer=fused_optimizer)
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
                            if not _is_cuda_oom(exc, dev):
                                raise
                            # the other models of the arch are resident: drop this one, keep the rest going
                            live.pop(variant).release()
                            rows[variant] = {"error": f"CUDA out of memory in timing round {r + 1} at batch "
                                                      f"{batch_size} ({n_variants} models resident)"}
                            gc.collect()
                            torch.cuda.empty_cache()
                    bar.update(1)
            recompiled[key] = compile and _compiled_graphs() != graphs_before
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

    b16_fwd = vit_forward_flops("B/16", img_size=224, num_classes=1000).total  # the reference point
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
        "fused_optimizer": bool(fused_optimizer and dev.type == "cuda"),
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
    }


def _compiled_graphs() -> int:
    """How many graphs torch.compile has produced so far in this process (0 when dynamo is unavailable)."""
    with contextlib.suppress(Exception):
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    return 0


# ---------------------------------------------------------------------------------------------------
# Report

def _f(x, fmt: str = ".1f", na: str = "n/a") -> str:
    return na if x is None else format(x, fmt)


def _ci(ci, fmt: str = ".1f", unit: str = "") -> str:
    return "n/a" if ci is None else f"[{format(ci[0], fmt)}, {format(ci[1], fmt)}]{unit}"


def _pct_ci(c: dict | None) -> str:
    """'+1.2 % [−0.3, +2.8]'-style cell of a comparison."""
    if not c:
        return "n/a"
    ci = c["ci_pct"]
    text = f"{c['median_pct']:+.1f} %"
    return text + (" (no CI)" if ci is None else f" [{ci[0]:+.1f}, {ci[1]:+.1f}]")


def _vs(row: dict, ref: dict | None) -> dict | None:
    """A comparison cell's numbers for ``row`` against ``ref`` from their per-round times (e.g. timm vs conv)."""
    if not ref or "ms_per_step_rounds" not in ref:
        return None
    s = ratio_summary(row["ms_per_step_rounds"], ref["ms_per_step_rounds"])
    return {"median_pct": 100 * (s["median"] - 1),
            "ci_pct": None if s["lo"] is None else [100 * (s["lo"] - 1), 100 * (s["hi"] - 1)]}


def render_markdown(res: dict) -> str:
    """``reports/benchmarks.md`` from :func:`run_benchmark`'s result."""
    cpu = res["device_type"] != "cuda"
    mm = res.get("matmul_reference")
    n_rounds = res["rounds"]
    cov = next((r["ci_coverage"] for rows in res["results"].values() for r in rows.values()
                if r.get("ci_coverage")), None)
    lines = [
        "# Training throughput, MFU and memory (synthetic input)",
        "",
        "Generated by `stages/benchmark.py`; params section `benchmark`.",
        "",
        f"- **Device: {res['device']}** ({'CPU run' if cpu else 'CUDA run'}; measured on {res['hardware']})",
        f"- dtype: {res['dtype']}; torch {res['torch']}, timm {res['timm']}; "
        f"torch.compile: {'on' if res['compile'] else 'off'}"
        + ("; cudnn.benchmark on" if res.get("cudnn_benchmark") else "")
        + ("; **deterministic algorithms on (slower kernels)**" if res.get("deterministic_algorithms") else ""),
        f"- batch {res['batch_size']}, {res['img_size']} px, {res['num_classes']} classes; one random batch "
        "generated once on the device",
        f"- timing: per arch, every model is built and warmed up ({res['warmup_steps']} untimed step(s)), then "
        f"**{n_rounds} interleaved rounds**; each round runs one block of {res['steps_per_round']} timed steps "
        f"of every model, in an order reshuffled every round (seed {res['seed']}; orders in the JSON), "
        + ("CUDA events" if not cpu else "`time.perf_counter`")
        + " around each block",
        f"- statistics: a model's ms/step is the median over rounds of its block time ÷ steps; a comparison is "
        "the median over rounds of the per-round step-time ratio (paired by round), shown as "
        "(ratio − 1) × 100 %; brackets are **95 % CIs for the median from order statistics** "
        "(distribution-free; exact binomial coverage"
        + (f" {100 * cov:.1f} % with {n_rounds} rounds" if cov else f"; none with fewer than {MIN_ROUNDS} rounds")
        + ")",
        f"- step: forward → sigmoid cross-entropy → backward → {res['optimizer']} "
        "(the trainer's step, without data loading)",
        "- models: ours = `build_vit(arch, stem)` (class token, no pre-logits, no dropout, as timm's stock "
        "ViT); timm = `timm.create_model('vit_*_patch16_224', pretrained=False)`",
        "- FLOPs: analytic matmul FLOPs (multiply-add = 2; LayerNorm/softmax/GELU excluded, so all stems of "
        "an arch count the same), training = 3 × forward "
        "(`src/dpnrepro/benchmarks/flops.py`; ViT-B/16 forward = "
        f"{vit_forward_flops('B/16').total / 1e9:.2f} GFLOP/img at 224 px, timm's 17.6 GMACs × 2)",
        "- MFU peak: " + (f"{res['peak_tflops']:.1f} TFLOP/s ({res['peak_source']})" if res["peak_tflops"]
                          else res["peak_source"]),
    ]
    if mm:
        lines.append(f"- measured {mm['dtype']} matmul reference on this device: {mm['tflops']:.3f} TFLOP/s "
                     "(an achievable rate, not a datasheet peak)")
    lines.append(f"- peak memory: {res['memory_measure']}")
    if res.get("b16_img_per_s_for_50pct_mfu"):
        lines.append(f"- B/16 (224 px, 1000 classes) at 50 % MFU on this device = "
                     f"{res['b16_img_per_s_for_50pct_mfu']:,.0f} img/s")
    recompiled = [a for a, flag in (res.get("recompiled_during_timing") or {}).items() if flag]
    if recompiled:
        lines.append(f"- **torch.compile recompiled during the timed rounds for {', '.join(recompiled)}**: "
                     "those timings include compilation")
    if cpu:
        lines += [
            "",
            "> **CPU run.** The issue's targets (B/16 DPN ≥ 50 % MFU in bf16 on one H100; DPN overhead over the "
            "conv stem ≤ 1 % for B/16 and ≤ 3 % for Ti/16) are GPU targets and were **not evaluated** here. "
            "MFU is n/a (there is no reliable CPU peak); the \"vs matmul\" column compares with the fp32 matmul "
            "rate measured above on this machine, which is not MFU. The stem comparisons below are CPU fp32 "
            "facts about this machine, not about a GPU. On a GPU: "
            "`python stages/benchmark.py --device cuda --batch-size 256 --img-size 224 --rounds 20 "
            "--steps-per-round 10 --compile` (writes `*_cli` files).",
        ]
    lines += ["", "## Results", ""]
    ratio_col = "vs matmul" if cpu else "MFU [95 % CI]"
    lines += [
        f"| arch | model | params (M) | ms/step, median [95 % CI] | img/s | TFLOP/s | {ratio_col} | "
        "peak mem (GiB) | vs conv stem [95 % CI] |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arch, rows in res["results"].items():
        comps = res["comparisons"].get(arch, {})
        for variant, r in rows.items():
            label = "timm stock" if variant == "timm" else variant
            if "error" in r:
                lines.append(f"| {arch} | {label} | | | | | | | {r['error']} |")
                continue
            if cpu:
                ratio = _f(r["vs_matmul_pct"], ".1f") + ("" if r["vs_matmul_pct"] is None else " %")
            else:
                ratio = (_f(r["mfu_pct"], ".1f") + ("" if r["mfu_pct"] is None else
                                                    f" % {_ci(r['mfu_pct_ci'])}"))
            mem = None if r["peak_mem_bytes"] is None else r["peak_mem_bytes"] / 2**30
            vs = "—" if variant == "conv" else _pct_ci(comps.get(f"{variant}_vs_conv") or _vs(r, rows.get("conv")))
            lines.append(
                f"| {arch} | {label} | {r['params_m']:.1f} | {r['ms_per_step']:.1f} {_ci(r['ms_per_step_ci'])} "
                f"| {r['img_per_s']:,.1f} | {r['achieved_tflops']:.3g} | {ratio} | {_f(mem, '.2f')} | {vs} |")
    lines += [
        "",
        "\"vs conv stem\": median over rounds of (step time of the model ÷ step time of our conv stem in the same "
        "round − 1) × 100 (positive = slower); \"timm stock\" vs conv is shown the same way.",
        "",
        "## Stem overhead and ours vs timm (median over rounds [95 % CI]; verdict: CI wholly above / below 0)",
        "",
        "| arch | DPN vs conv | linear vs conv | ours (conv) vs timm | ours (DPN) vs timm |",
        "|---|---:|---:|---:|---:|",
    ]
    for arch, c in res["comparisons"].items():
        cells = []
        for key in ("dpn_vs_conv", "linear_vs_conv", "conv_vs_timm", "dpn_vs_timm"):
            cells.append("n/a" if key not in c else f"{_pct_ci(c[key])} {c[key]['resolved']}")
        lines.append(f"| {arch} | " + " | ".join(cells) + " |")
    lines += ["", "## Targets (from the issue)", "",
              "| target | required | measured, median [95 % CI] | verdict |", "|---|---:|---:|---|"]
    for t in res["targets"].values():
        verdict = t["verdict"] if t["verdict"] in ("not evaluated", "not resolved") else f"**{t['verdict']}**"
        if t.get("note"):
            verdict += f" ({t['note']})"
        measured = "n/a" if t["value"] is None else f"{t['value']:+.1f} % {_ci(t['ci'], '+.1f')}" \
            if "overhead" in t["what"] else f"{t['value']:.1f} % {_ci(t['ci'])}"
        lines.append(f"| {t['what']} | {t['op']} {t['threshold']:g} % | {measured} | {verdict} |")
    lines += [
        "",
        "Verdicts: **met** when the whole 95 % CI satisfies the target, **not met** when none of it does, "
        "\"not resolved\" when the CI spans the threshold (more rounds, or a quieter device, would be needed).",
        "",
    ]
    return "\n".join(lines)
