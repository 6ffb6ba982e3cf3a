"""The ``input.backend: gpu`` train-time pipeline: loader workers read bytes and draw, the device computes.

Split of the work (same op chain as ``pil`` / ``fast``: inception crop → flip → RandAugment → ``[-1, 1]``):

* **Workers** (:class:`PlanTransform`, run by ``TransformedSplit`` with its per-example seeding) read the
  JPEG bytes, parse the header and make every random draw of the CPU path, in its order and from its
  generators: the crop box (:func:`dpnrepro.data.fast.inception_crop_params`), the flip
  (``torch.rand(1) < 0.5``), the RandAugment ops (:meth:`SeededRandAugment.choose`), their level arguments
  (:func:`dpnrepro.data.randaugment.op_args`) and the draws timm makes inside an op (the filter of a geometric op,
  Cutout's centre). No pixel is decoded there, except for non-JPEG files (PNG), which are decoded to uint8
  because the device decoder takes JPEG only; pre-decoded pixel-store arrays pass as they are. The batch's
  collate (:func:`pack`) puts all bytes in one uint8 tensor and every number of every image in one float64
  tensor (:data:`ROW`, then one :data:`dpnrepro.data.gpu_ops.LAYER` row per RandAugment layer).
* **A producer thread** of the main process (:class:`DeviceBatches`, on CUDA) takes the loader's batches and
  runs :class:`DeviceAugment` on its own CUDA stream: the parameter tensor pinned and copied with one
  ``non_blocking`` copy, the JPEGs decoded in one call (nvJPEG through ``torchvision.io.decode_jpeg``; it
  waits on its stream, which blocks this thread only), crop + resize + flip of the whole batch as gathers
  (:mod:`dpnrepro.data.gpu_resize`), RandAugment layer by layer, each op kind on its run of images
  (:mod:`dpnrepro.data.gpu_ops`).
  No step of the augmentation reads a device value back (a CUDA test runs it under
  ``torch.cuda.set_sync_debug_mode("error")``): what the host decides (which op kinds a layer holds, the widest
  crop) it reads from its own copy of the parameters. The trainer's thread waits on an event per batch, so
  batch k + 1 is decoded and augmented while step k runs. Images stay uint8; the trainer's
  :func:`dpnrepro.training.step.unit_range` scales them on the device.

Agreement with the CPU path (``tests/test_gpu_input.py``, device="cpu", real JPEG photos): identical crop
boxes, flips, ops and arguments for every seed (and the RNGs left in the same state); crop + resize bit-exact
for ``crop_sampler: big_vision`` and within 1 grey level for ``torchvision`` (float vs torch's fixed-point
uint8 kernel); every RandAugment op bit-exact against PIL on equal inputs. On CUDA nvJPEG's IDCT and chroma
upsampling differ from libjpeg-turbo's: ``python -m dpnrepro.benchmarks.gpu_input --device cuda`` measures that
difference. Not supported (one-line error): ``inception_crop: false`` and ``random_erasing`` (use ``fast``).
For crops of at least ``2 S`` px on both sides the ``fast`` CPU path decodes at reduced JPEG scale
(``draft``); this path decodes at full scale, like ``pil``.
"""

from __future__ import annotations

import queue
import random
import threading
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
    hw: tuple[int, int]  # the decoded image's height and width (the JPEG header's)
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
            payload, hw = bytes(data), (wh[1], wh[0])
        else:  # pixels, PNG, PIL: decoded here (no draws), box from the pixels' size as the CPU path does
            pixels, _ = decode(image, self.mode, self.size, crop=False)
            payload = pixels.numpy()
            hw = payload.shape[:2]
        box = inception_crop_params(hw[0], hw[1], self.scale, sampler=self.crop_sampler)
        flip = bool(self.flip and torch.rand(1) < 0.5)  # v2.RandomHorizontalFlip's draw
        ops = tuple(draw_op(op, self.size) for op in self.randaug.choose()) if self.randaug else ()
        return Plan(payload, wh is not None, tuple(int(v) for v in hw), tuple(int(v) for v in box), flip, ops,
                    str(where))


# ---------------------------------------------------------------------------------------------- the batch
# per image, before its RandAugment layers: the crop head (gpu_resize.HEAD), then where its payload lies
ROW = ("H", "W", "top", "left", "h", "w", "flip", "offset", "jpeg", "start", "nbytes")
_R = {name: k for k, name in enumerate(ROW)}


class PackedBatch(NamedTuple):
    """A batch as the workers hand it over: every payload in ``data`` (uint8; JPEG files, or (C, H, W) pixels),
    every number in ``params`` (float64 (n, len(ROW) + layers x len(LAYER)))."""

    data: torch.Tensor
    params: torch.Tensor
    where: tuple[str, ...]

    @property
    def layers(self) -> int:
        from dpnrepro.data.gpu_ops import LAYER

        return (self.params.shape[1] - len(ROW)) // len(LAYER)


def pack(plans: list[Plan], size: int, channels: int) -> PackedBatch:
    """The plans of a batch as one byte tensor and one parameter tensor (each layer's images sorted by op kind)."""
    from dpnrepro.data.gpu_ops import LAYER, encode_op, order_layer

    layers = max((len(p.ops) for p in plans), default=0)
    blobs, rows, start, offset = [], [], 0, 0
    for p in plans:
        blob = p.payload if p.jpeg else np.ascontiguousarray(p.payload.transpose(2, 0, 1)).tobytes()
        h, w = p.hw
        row = [h, w, *p.box, float(p.flip), offset, float(p.jpeg), start, len(blob)]
        ops = list(p.ops) + [None] * (layers - len(p.ops))
        rows.append(row + [v for op in ops for v in encode_op(op, size)])
        blobs.append(blob)
        start, offset = start + len(blob), offset + channels * h * w
    data = torch.frombuffer(bytearray().join(blobs), dtype=torch.uint8) if start else torch.empty(0, dtype=torch.uint8)
    params = torch.tensor(rows, dtype=torch.float64)
    for layer in range(layers):
        order_layer(params[:, len(ROW) + layer * len(LAYER):len(ROW) + (layer + 1) * len(LAYER)])
    return PackedBatch(data, params, tuple(p.where for p in plans))


def collate_plans(batch, size: int, channels: int) -> tuple[PackedBatch, torch.Tensor]:
    """``(plan, target)`` pairs → (the packed plans, the stacked targets); runs in the loader workers."""
    plans, targets = zip(*batch)
    return pack(list(plans), size, channels), torch.utils.data.default_collate(list(targets))


def upload(batch: torch.Tensor, device) -> torch.Tensor:
    """``batch`` on ``device``: on CUDA pinned and copied on the current stream without blocking the host
    (:class:`DeviceBatches` makes that its producer's stream); elsewhere as is."""
    device = torch.device(device)
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)


def _decode_jpegs(blobs: list[torch.Tensor], where: list[str], mode, device) -> list[torch.Tensor]:
    """JPEG files decoded on ``device`` in one call (C, H, W). When the batch fails (a JPEG the device decoder
    does not take: CMYK, some progressive files; or a corrupt one), each image alone, and one the device
    refuses on the CPU (libjpeg-turbo, then uploaded); a file the CPU cannot decode either is named."""
    from torchvision.io import decode_jpeg

    try:
        return decode_jpeg(blobs, mode=mode, device=device)
    except RuntimeError:
        pass
    out = []
    for blob, name in zip(blobs, where):
        try:
            out.append(decode_jpeg(blob, mode=mode, device=device))
        except RuntimeError:
            try:
                out.append(upload(decode_jpeg(blob, mode=mode), device))
            except RuntimeError as exc:
                raise DatasetError(f"cannot decode image {name}: corrupt JPEG: {exc}") from exc
    return out


class DeviceAugment:
    """The device half: a :class:`PackedBatch` (or a :class:`PlanBatch`) → uint8 (n, C, S, S) on ``device``,
    cropped, flipped and RandAugment-ed as the plans say."""

    def __init__(self, size: int, channels: int, device, crop_sampler: str = "torchvision"):
        self.size, self.channels, self.device = size, channels, torch.device(device)
        self.antialias = crop_sampler != "big_vision"

    def decode(self, batch: PackedBatch) -> torch.Tensor:
        """Every image decoded on the device, back to back in one flat uint8 tensor (``offset`` in ``ROW``)."""
        from torchvision.io import ImageReadMode

        mode = ImageReadMode.GRAY if self.channels == 1 else ImageReadMode.RGB
        p = batch.params.tolist()
        pieces = [batch.data[int(r[_R["start"]]):int(r[_R["start"]] + r[_R["nbytes"]])] for r in p]
        jpeg = [k for k in range(len(pieces)) if p[k][_R["jpeg"]]]
        decoded = dict(zip(jpeg, _decode_jpegs([pieces[k] for k in jpeg], [batch.where[k] for k in jpeg], mode,
                                               self.device) if jpeg else ()))
        images = []
        for k, piece in enumerate(pieces):
            shape = (self.channels, int(p[k][_R["H"]]), int(p[k][_R["W"]]))
            img = decoded[k] if k in decoded else upload(piece.view(shape), self.device)
            if tuple(img.shape) != shape:
                raise DatasetError(f"cannot decode image {batch.where[k]}: header says {shape[2]}x{shape[1]}, "
                                   f"decoded {img.shape[-1]}x{img.shape[-2]}")
            images.append(img.reshape(-1))
        return torch.cat(images)

    def augment(self, flat: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """Crop + resize + flip and RandAugment of the decoded batch; no device value is read back."""
        from dpnrepro.data.gpu_ops import LAYER, augment_layer
        from dpnrepro.data.gpu_resize import aa_taps_needed, antialiased, tf_bilinear

        p = upload(batch.params, self.device)
        head = p[:, :_R["offset"] + 1]
        if self.antialias:
            boxes = batch.params[:, [_R["h"], _R["w"]]]
            x = antialiased(flat, head, self.channels, self.size, aa_taps_needed(boxes, self.size),
                            int(boxes[:, 0].max()))
        else:
            x = tf_bilinear(flat, head, self.channels, self.size)
        for layer in range(batch.layers):
            cols = slice(len(ROW) + layer * len(LAYER), len(ROW) + (layer + 1) * len(LAYER))
            x = augment_layer(x, p[:, cols], batch.params[:, cols])
        return x

    def __call__(self, batch: PackedBatch | PlanBatch) -> torch.Tensor:
        if isinstance(batch, PlanBatch):
            batch = pack(batch.plans, self.size, self.channels)
        if not len(batch.where):
            return torch.empty((0, self.channels, self.size, self.size), dtype=torch.uint8, device=self.device)
        return self.augment(self.decode(batch), batch)


class DeviceBatches:
    """``(uint8 images on the device, targets)`` from a loader of packed plans. On CUDA a producer thread
    decodes and augments on its own stream, up to ``depth`` batches ahead; the consumer's stream waits on each
    batch's event, so the augmentation of batch k + 1 overlaps step k and the host never waits for it.
    Elsewhere (the CPU: the tests) batch by batch in this thread."""

    def __init__(self, loader, augment: DeviceAugment, depth: int = 2):
        self.loader, self.augment, self.depth = loader, augment, depth

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        if self.augment.device.type != "cuda":
            for batch, targets in self.loader:
                yield self.augment(batch), targets
            return
        yield from self._threaded()

    def _produce(self, out: queue.Queue, stop: threading.Event) -> None:
        device = self.augment.device
        if device.index is not None:
            torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device)

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for batch, targets in self.loader:
                with torch.cuda.stream(stream):
                    images = self.augment(batch)
                    ready = torch.cuda.Event()
                    ready.record(stream)
                if not put((images, targets, ready)):
                    return
            put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put(exc)

    def _threaded(self):
        out: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        thread = threading.Thread(target=self._produce, args=(out, stop), name="dpnrepro-device-batches",
                                  daemon=True)
        thread.start()
        try:
            while (item := out.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                images, targets, ready = item
                current = torch.cuda.current_stream(images.device)
                current.wait_event(ready)
                images.record_stream(current)  # made on the producer's stream, freed after this stream's use
                yield images, targets
        finally:
            stop.set()
            while thread.is_alive():
                try:
                    out.get(timeout=0.1)
                except queue.Empty:
                    pass
