"""Batch JPEG decode + inception crop on a GPU (nvJPEG through ``torchvision.io.decode_jpeg(device="cuda")``).

The crop boxes are drawn on the CPU from the JPEG headers with the CPU path's own sampler and per-example
seed (:func:`sample_boxes`: the draws :class:`dpnrepro.data.fast.FastTrainTransform` makes first), so the
GPU path crops exactly the boxes the CPU path crops. :func:`decode_crop_batch` then decodes the whole
batch in one call, crops each image and resizes it to ``S x S`` in float32 (bilinear; antialiased for
``crop_sampler: torchvision``, TF's non-antialiased bilinear for ``big_vision``) and returns uint8
(B, C, S, S): the same pixels as the CPU path up to one grey level (float rounding order; tested on CPU,
where ``decode_jpeg`` runs libjpeg-turbo). :func:`upload` copies a pinned uint8 batch to the device on a
side stream.

Status: a building block behind ``scripts/bench_folder.py --gpu-decode``, not yet used by the trainer
(flip and RandAugment still run on the CPU path); no GPU number has been measured for it. It lives here,
not in ``data/``, until the trainer imports it: every stage that reads ``data/`` would otherwise list its
files one by one instead of the folder.
"""

from __future__ import annotations

import random

import torch

from dpnrepro.errors import DatasetError


def sample_boxes(blobs: list[bytes], seeds: list[int], sampler: str = "big_vision",
                 scale=None) -> list[tuple[int, int, int, int]]:
    """The inception-crop box (top, left, height, width) of each JPEG for its example seed, as the CPU
    path draws it (torch and Python RNGs seeded per example; the global RNG state is left untouched)."""
    from dpnrepro.data.fast import INCEPTION_SCALE, inception_crop_params, jpeg_size

    boxes = []
    py_state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        for k, (data, seed) in enumerate(zip(blobs, seeds)):
            wh = jpeg_size(data)
            if wh is None:
                raise DatasetError(f"image {k} of the batch is not a JPEG with a readable header; the GPU "
                                   "decode path takes JPEG files only")
            torch.default_generator.manual_seed(seed)
            random.seed(seed)
            boxes.append(inception_crop_params(wh[1], wh[0], scale or INCEPTION_SCALE, sampler=sampler))
    random.setstate(py_state)
    return boxes


def decode_crop_batch(blobs: list[bytes], boxes, size: int, device="cuda", sampler: str = "big_vision") -> torch.Tensor:
    """Decode ``blobs`` (JPEG bytes) on ``device`` in one batch, crop ``boxes`` and resize to ``size``:
    uint8 (B, 3, size, size) on ``device``."""
    from torchvision.io import ImageReadMode, decode_jpeg

    data = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
    try:
        images = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError as exc:
        raise DatasetError(f"cannot decode a JPEG of the batch on {device}: {exc}") from exc
    antialias = sampler != "big_vision"
    out = torch.empty((len(blobs), 3, size, size), dtype=torch.uint8, device=device)
    for k, (img, (t, l, h, w)) in enumerate(zip(images, boxes)):
        crop = img[:, t : t + h, l : l + w][None].float()
        y = torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False,
                                            antialias=antialias)[0]
        # the CPU paths: torch's uint8 kernel rounds (torchvision sampler); TF's cast truncates (big_vision)
        out[k] = (y.round() if antialias else y.trunc()).clamp_(0, 255).to(torch.uint8)
    return out


def upload(batch: torch.Tensor, device) -> torch.Tensor:
    """``batch`` (uint8, host) on ``device``: on CUDA pinned and copied on a side stream that the current
    stream waits for, so the copy overlaps the step in flight; elsewhere as is."""
    device = torch.device(device)
    if device.type != "cuda":
        return batch.to(device)
    side = torch.cuda.Stream(device)
    host = batch.pin_memory()
    with torch.cuda.stream(side):
        out = host.to(device, non_blocking=True)
    torch.cuda.current_stream(device).wait_stream(side)
    out.record_stream(torch.cuda.current_stream(device))
    return out
