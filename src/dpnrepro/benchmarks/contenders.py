"""The benchmark's contenders: the models it times (ours and timm's stock ViT), each with the trainer's
optimizer and training step on one fixed batch of real photos, and the device-side helpers (peak memory
on CPU, a measured matmul reference, CUDA-OOM detection).

:func:`prepare` builds and warms up one model; :class:`Contender` times it in blocks of steps.
:mod:`dpnrepro.benchmarks.train_throughput` interleaves them in rounds.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import io
import os
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch

from dpnrepro.errors import UserError

__all__ = ["DEFAULT_OPTIM", "Contender", "StepLevers", "CpuPeakRss", "build_timm", "is_cuda_oom", "measure_matmul_tflops",
           "norm_arch", "photo_batch", "prepare", "timm_reference_name"]

_TIMM_SIZES = {"Ti": "tiny", "S": "small", "B": "base", "L": "large", "H": "huge"}
DEFAULT_OPTIM = SimpleNamespace(optimizer="adam", lr=1e-3, weight_decay=1e-4, grad_clip=1.0)


# ---------------------------------------------------------------------------------------------------
# Helpers

def norm_arch(arch: str) -> tuple[str, str]:
    """``"B/16"`` or ``"B-16"`` -> ``("B-16", "B/16")`` (params key, model-registry name); UserError if unknown."""
    from dpnrepro.model_spec import parse_arch

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


def build_timm(arch_name: str, img_size: int, num_classes: int) -> tuple[torch.nn.Module, str]:
    """timm's stock ViT (no pretrained weights); for sizes timm does not register (Mu), timm's
    ``VisionTransformer`` class with the same dimensions."""
    import timm
    from timm.models.vision_transformer import VisionTransformer

    from dpnrepro.model_spec import parse_arch

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


class CpuPeakRss:
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
# Step levers: each a flag of stages/benchmark.py; the defaults are the trainer's step

SDPA_BACKENDS = ("auto", "flash", "cudnn", "efficient", "math")
COMPILE_MODES = ("default", "max-autotune", "max-autotune-no-cudagraphs")


@dataclasses.dataclass(frozen=True)
class StepLevers:
    """Ways to run the same step (fp32 master weights, bf16 autocast, same loss and update) faster.

    ``sdpa_backend``: the attention kernel (``torch.nn.attention.sdpa_kernel``; ``auto``: torch's choice).
    ``compile_mode``: torch.compile's mode for forward + loss (with ``compile``). ``compiled_optimizer``:
    gradient clipping + optimizer step compiled as one region (with ``compile``). ``channels_last``: images
    and 4-D weights in NHWC, the layout the patch embedding reads.
    """

    sdpa_backend: str = "auto"
    compile_mode: str = "default"
    compiled_optimizer: bool = False
    channels_last: bool = False

    def __post_init__(self) -> None:
        if self.sdpa_backend not in SDPA_BACKENDS:
            raise UserError(f"benchmark.sdpa_backend {self.sdpa_backend!r}: choose from {', '.join(SDPA_BACKENDS)}")
        if self.compile_mode not in COMPILE_MODES:
            raise UserError(f"benchmark.compile_mode {self.compile_mode!r}: choose from {', '.join(COMPILE_MODES)}")

    @classmethod
    def of(cls, settings) -> StepLevers:
        """The levers among ``settings`` (a dict or an object with those attributes; missing: default)."""
        get = settings.get if isinstance(settings, dict) else (lambda k, d: getattr(settings, k, d))
        return cls(**{f.name: get(f.name, f.default) for f in dataclasses.fields(cls)})

    def changed(self) -> dict:
        """The levers that differ from the trainer's step."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}

    def sdpa_context(self) -> Callable[[], contextlib.AbstractContextManager]:
        if self.sdpa_backend == "auto":
            return contextlib.nullcontext
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[self.sdpa_backend]
        return lambda: sdpa_kernel([backend])


# ---------------------------------------------------------------------------------------------------
# One model: build + warm-up (memory window), then timed blocks

class Contender:
    """A built model with its optimizer and one training step, ready to be timed in blocks."""

    def __init__(self, model: torch.nn.Module, name: str, images: torch.Tensor, targets: torch.Tensor, *,
                 optim_cfg, grad_clip: float, compile_model: bool, cudagraphs: bool = False,
                 fused_optimizer: bool = True, levers: StepLevers | None = None) -> None:
        from dpnrepro.training.losses import sigmoid_xent
        from dpnrepro.training.optim import build_optimizer
        from dpnrepro.training.step import LossStep, unit_range

        levers = levers or StepLevers()
        self.name = name
        self.model = model
        self.n_params = sum(p.numel() for p in model.parameters())
        device = images.device
        self.device = device
        model.train()
        if levers.channels_last:  # the patch embedding reads NHWC: the patchify permute moves contiguous pixels
            model.to(memory_format=torch.channels_last)
            images = images.contiguous(memory_format=torch.channels_last)
        # the trainer's step (training/trainer.py): uint8 batch scaled on the device, LossStep, and its optimizer
        # (build_optimizer: fused on every device); a compiled optimizer is compiled from the for-each path
        # (inductor fuses it with the clipping)
        fused = fused_optimizer and not (compile_model and levers.compiled_optimizer)
        optimizer = build_optimizer(model, optim_cfg, fused=fused)
        params = [p for p in model.parameters() if p.requires_grad]
        own_mode = compile_model and levers.compile_mode != "default"
        loss_step = LossStep(model, sigmoid_xent, device, compile=compile_model and not own_mode,
                             cudagraphs=cudagraphs)
        loss_fn, graphs = loss_step, loss_step.cudagraphs
        if own_mode:  # forward + loss as one graph, as LossStep compiles it, in the lever's mode
            loss_fn = torch.compile(loss_step.__call__, mode=levers.compile_mode)
            graphs = device.type == "cuda" and levers.compile_mode == "max-autotune"

        def update() -> None:
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            optimizer.step()

        if compile_model and levers.compiled_optimizer:
            update = torch.compile(update)
        attention = levers.sdpa_context()

        def step() -> torch.Tensor:
            optimizer.zero_grad(set_to_none=True)
            if own_mode and graphs:  # the lever's own compiled region: one graph step per optimizer step
                torch.compiler.cudagraph_mark_step_begin()
            else:
                loss_step.begin_step()
            with attention():
                loss = loss_fn(unit_range(images), targets)
                loss.backward()
            update()
            return loss.detach().clone() if graphs else loss_step.kept(loss)

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


def is_cuda_oom(exc: BaseException, device: torch.device) -> bool:
    return device.type == "cuda" and "out of memory" in str(exc).lower()


def prepare(build, *, device, images, targets, optim_cfg, grad_clip, warmup_steps, compile_model,
             seed, cudagraphs=False, fused_optimizer=True, levers=None) -> tuple[Contender | None, dict]:
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
        cpu_mem = CpuPeakRss()
        cpu_mem.start()
    torch.manual_seed(seed)
    contender = None
    try:
        model, name = build()
        contender = Contender(model.to(device), name, images, targets, optim_cfg=optim_cfg, grad_clip=grad_clip,
                               compile_model=compile_model, cudagraphs=cudagraphs, fused_optimizer=fused_optimizer,
                               levers=levers)
        warmup_s = contender.warm_up(warmup_steps)
    except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:  # torch.compile may wrap the OOM
        if not is_cuda_oom(exc, device):
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
