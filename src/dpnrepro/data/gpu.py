"""The ``input.backend: gpu`` train-time pipeline: loader workers read bytes and draw, the device computes.

Split of the work (same op chain as ``pil`` / ``fast``: inception crop → flip → RandAugment → ``[-1, 1]``):

* **Workers** (:class:`PlanTransform`, run by ``TransformedSplit`` with its per-example seeding) read the
  JPEG bytes, parse the header and make every random draw of the CPU path, in its order and from its
  generators: the crop box (:func:`dpnrepro.data.fast.inception_crop_params`), the flip
  (``torch.rand(1) < 0.5``), the RandAugment ops (:meth:`SeededRandAugment.choose`), their level arguments
  (:func:`dpnrepro.data.randaugment.op_args`) and the draws timm makes inside an op (the filter of a geometric op,
  Cutout's centre). No pixel is decoded there, except for non-JPEG files (PNG), which are decoded to uint8
  because the device decoder takes JPEG only; pre-decoded pixel-store arrays pass as they are.
* **The main process** (:class:`DeviceAugment`) decodes the batch's JPEGs in one call on the device
  (nvJPEG through ``torchvision.io.decode_jpeg(device="cuda")``; libjpeg-turbo with ``device="cpu"``, what
  the tests run), crops each box and resizes it in float32 (antialiased bilinear rounded for
  ``crop_sampler: torchvision``, TF's bilinear truncated for ``big_vision``), flips, and runs RandAugment
  on the whole batch (:mod:`dpnrepro.data.gpu_ops`, one batched call per op and layer). Images stay uint8;
  the trainer's :func:`dpnrepro.training.step.unit_range` scales them on the device.
* :class:`DeviceBatches` puts that work for batch ``k + 1`` on a side CUDA stream before step ``k`` is
  queued, so decode and augmentation overlap the step; pixel payloads are pinned and copied there.

Agreement with the CPU path (``tests/test_gpu_input.py``, device="cpu", real JPEG photos): identical crop
boxes, flips, ops and arguments for every seed (and the RNGs left in the same state); crop + resize within
1 grey level (big_vision: ~0.1 % of the values; torchvision: ~11 %, float vs torch's fixed-point uint8
kernel); every RandAugment op bit-exact against PIL on equal inputs (:mod:`dpnrepro.data.gpu_ops`). End to
end (crop, flip, ``rand-n2-m15-tbigvision``) the mean |diff| is 0.001 (big_vision crop) / 0.22 (torchvision
crop): RandAugment amplifies the resize's 1-level differences (factors up to 2.8, histogram stretches).
On CUDA nvJPEG's IDCT and chroma upsampling differ from libjpeg-turbo's: ``python -m
dpnrepro.benchmarks.gpu_input --device cuda`` (``run_gpu.sh`` phase ``input``) measures that difference; it
is not known before a GPU session has run it. Not supported
(one-line error): ``inception_crop: false`` and ``random_erasing`` (use ``fast``). For crops of at least
``2 S`` px on both sides the ``fast`` CPU path decodes at reduced JPEG scale (``draft``); this path decodes
at full scale, like ``pil`` (never at 224 px from ImageNet-sized photos).
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import NamedTuple

import numpy as np
import torch

from dpnrepro.errors import DatasetError


class Plan(NamedTuple):
    """One example as a worker hands it over: its bytes (or pixels) and every random draw of its transform."""

    # the JPEG file, or uint8 pixels (H, W, C): bytes and NumPy pickle through the worker pipe (a torch tensor
    # would travel as a shared-memory file descriptor each: 256 a batch)
    payload: bytes | np.ndarray
    jpeg: bool
    box: tuple[int, int, int, int]  # top, left, height, width
    flip: bool
    ops: tuple  # per RandAugment layer: (device op, level args, extra draws) or None when skipped
    where: str  # the image's path, for error messages


class PlanBatch(NamedTuple):
    plans: list[Plan]


def draw_op(op, size: int):
    """(device op name, level args, extra) of one timm ``AugmentOp`` applied to a ``size x size`` image,
    consuming Python ``random`` exactly as the CPU path's call does; None when the op is skipped."""
    from dpnrepro.data.randaugment import op_args, resample_filter
    from dpnrepro.data.gpu_ops import GEOMETRIC, device_op_name

    name = device_op_name(op)
    args = op_args(op)
    if args is None:
        return None
    extra = {"fill": tuple(op.kwargs.get("fillcolor", (128,)))}
    if name in GEOMETRIC:  # timm's _check_args_tf: one random.choice when the op has a tuple of filters
        extra["resample"] = int(resample_filter(op.kwargs))
    elif name == "Cutout":  # the centre, drawn before the size check as the CPU op does
        extra["centre"] = (random.randrange(size), random.randrange(size))
    return name, tuple(args), extra


class PlanTransform:
    """The worker half: image (bytes, path, ``datasets`` dict, PIL image or uint8 pixels) → :class:`Plan`.
    Randomness as :class:`dpnrepro.data.fast.FastTrainTransform`: torch's global RNG for crop + flip,
    Python's ``random`` for RandAugment, in the same order."""

    def __init__(self, size: int, channels: int, *, flip: bool = True, randaug: str = "",
                 crop_min_area: float = 0.05, crop_sampler: str = "torchvision"):
        from dpnrepro.data.fast import MODES
        from dpnrepro.data.gpu_ops import device_op_name
        from dpnrepro.data.randaugment import randaugment

        self.size, self.channels, self.mode = size, channels, MODES[channels]
        self.flip, self.scale, self.crop_sampler = flip, (crop_min_area, 1.0), crop_sampler
        self.randaug = randaugment(randaug, size, channels) if randaug else None
        for op in self.randaug.ops if self.randaug else ():
            device_op_name(op)  # unsupported ops fail here, at construction

    def __call__(self, image) -> Plan:
        from dpnrepro.data.fast import decode, encoded_bytes, inception_crop_params, jpeg_size

        if isinstance(image, (np.ndarray, torch.Tensor)):
            data, wh, where = None, None, "<pixels>"
        else:
            data, where, _ = encoded_bytes(image)
            wh = jpeg_size(data) if data is not None else None
        if wh is not None:
            payload = bytes(data)
            box = inception_crop_params(wh[1], wh[0], self.scale, sampler=self.crop_sampler)
        else:  # pixels, PNG, PIL: decoded here (no draws), box from the pixels' size as the CPU path does
            pixels, _ = decode(image, self.mode, self.size, crop=False)
            payload = pixels.numpy()
            box = inception_crop_params(payload.shape[0], payload.shape[1], self.scale, sampler=self.crop_sampler)
        flip = bool(self.flip and torch.rand(1) < 0.5)  # v2.RandomHorizontalFlip's draw
        ops = tuple(draw_op(op, self.size) for op in self.randaug.choose()) if self.randaug else ()
        return Plan(payload, wh is not None, tuple(int(v) for v in box), flip, ops, str(where))


def collate_plans(batch) -> tuple[PlanBatch, torch.Tensor]:
    """``(plan, target)`` pairs → (the plans, the stacked targets)."""
    plans, targets = zip(*batch)
    return PlanBatch(list(plans)), torch.utils.data.default_collate(list(targets))


def upload(batch: torch.Tensor, device) -> torch.Tensor:
    """``batch`` (uint8, host) on ``device``: on CUDA pinned and copied on the current stream without
    blocking the host (:class:`DeviceBatches` makes that a side stream); elsewhere as is."""
    device = torch.device(device)
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _decode_jpegs(plans: list[Plan], mode, device) -> list[torch.Tensor]:
    """The JPEG payloads decoded on ``device`` in one call (C, H, W). When the batch fails (a JPEG the device
    decoder does not take: CMYK, some progressive files; or a corrupt one), each image alone, and one the
    device refuses on the CPU (libjpeg-turbo, then uploaded); a file the CPU cannot decode either is named."""
    from torchvision.io import decode_jpeg

    try:
        return decode_jpeg([_bytes_tensor(p.payload) for p in plans], mode=mode, device=device)
    except RuntimeError:
        pass
    out = []
    for p in plans:
        try:
            out.append(decode_jpeg(_bytes_tensor(p.payload), mode=mode, device=device))
        except RuntimeError:
            try:
                out.append(upload(decode_jpeg(_bytes_tensor(p.payload), mode=mode), device))
            except RuntimeError as exc:
                raise DatasetError(f"cannot decode image {p.where}: corrupt JPEG: {exc}") from exc
    return out


def resize_crop(img: torch.Tensor, box, size: int, antialias: bool) -> torch.Tensor:
    """Crop ``box`` of a uint8 (C, H, W) image and resize it to ``size x size`` in float32: antialiased
    bilinear rounded (torchvision's sampler) or TF's bilinear truncated (big_vision's) → uint8."""
    t, l, h, w = box
    if t < 0 or l < 0 or t + h > img.shape[1] or l + w > img.shape[2]:
        raise DatasetError(f"crop box {box} outside the decoded {img.shape[2]}x{img.shape[1]} image")
    crop = img[None, :, t : t + h, l : l + w].float()
    y = torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False,
                                        antialias=antialias)[0]
    # the CPU paths: torch's uint8 kernel rounds (torchvision sampler); TF's cast truncates (big_vision)
    return (y.round_() if antialias else y.trunc_()).clamp_(0, 255).to(torch.uint8)


class DeviceAugment:
    """The device half: a :class:`PlanBatch` → uint8 (B, C, S, S) on ``device``, cropped, flipped and
    RandAugment-ed as the plans say."""

    def __init__(self, size: int, channels: int, device, crop_sampler: str = "torchvision"):
        self.size, self.channels, self.device = size, channels, torch.device(device)
        self.antialias = crop_sampler != "big_vision"

    def decode_crop(self, plans: list[Plan]) -> torch.Tensor:
        from torchvision.io import ImageReadMode

        mode = ImageReadMode.GRAY if self.channels == 1 else ImageReadMode.RGB
        jpegs = [p for p in plans if p.jpeg]
        decoded = iter(_decode_jpegs(jpegs, mode, self.device) if jpegs else ())
        out = torch.empty((len(plans), self.channels, self.size, self.size), dtype=torch.uint8, device=self.device)
        for k, p in enumerate(plans):
            img = next(decoded) if p.jpeg else upload(torch.from_numpy(p.payload), self.device).permute(2, 0, 1)
            out[k] = resize_crop(img, p.box, self.size, self.antialias)
        return out

    def __call__(self, batch: PlanBatch) -> torch.Tensor:
        from dpnrepro.data.gpu_ops import apply_batched

        plans = batch.plans
        x = self.decode_crop(plans)
        flips = [k for k, p in enumerate(plans) if p.flip]
        if flips:
            idx = torch.tensor(flips, device=self.device)
            x[idx] = x[idx].flip(-1)
        for layer in range(max((len(p.ops) for p in plans), default=0)):
            groups = defaultdict(list)
            for k, p in enumerate(plans):
                if p.ops[layer] is not None:
                    groups[p.ops[layer][0]].append(k)
            for name, members in groups.items():
                idx = torch.tensor(members, device=self.device)
                x[idx] = apply_batched(name, x[idx], [plans[k].ops[layer][1:] for k in members])
        return x


class DeviceBatches:
    """``(uint8 images on the device, targets)`` from a loader of plans. On CUDA the device work of the next
    batch is queued on a side stream before the current batch is handed over, so it overlaps the step."""

    def __init__(self, loader, augment: DeviceAugment):
        self.loader, self.augment = loader, augment

    def __len__(self) -> int:
        return len(self.loader)

    def _start(self, item, stream):
        batch, targets = item
        if stream is None:
            return self.augment(batch), targets, None
        with torch.cuda.stream(stream):
            images = self.augment(batch)
        return images, targets, stream

    def _ready(self, started):
        images, targets, stream = started
        if stream is not None:
            current = torch.cuda.current_stream(images.device)
            current.wait_stream(stream)
            images.record_stream(current)  # allocated on the side stream, freed after the step's use
        return images, targets

    def __iter__(self):
        device = self.augment.device
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        pending = None
        for item in self.loader:
            started = self._start(item, stream)
            if pending is not None:
                yield self._ready(pending)
            pending = started
        if pending is not None:
            yield self._ready(pending)
