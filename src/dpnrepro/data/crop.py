"""big_vision's inception crop, ``decode_jpeg_and_inception_crop(size)``: TF's box sampler + TF's resize.

Sources (read, not copied):

* big_vision ``big_vision/pp/ops_image.py`` (commit 4a12790a8696c0f6df6cf975a5839e52134f9f80),
  ``get_decode_jpeg_and_inception_crop``: ``tf.image.sample_distorted_bounding_box`` on the JPEG header's
  shape with ``area_range=(area_min / 100, area_max / 100)`` = (0.05, 1.0), ``aspect_ratio_range=(0.75,
  1.33)`` (note 1.33, not 4/3), ``min_object_covered=0`` and ``use_image_if_no_bounding_boxes=True``;
  ``max_attempts`` is left at the op's default, 100 (``tensorflow/core/ops/image_ops.cc``). The window is
  decoded at full scale (``decode_and_crop_jpeg``) and resized with ``tf.image.resize(method='bilinear',
  antialias=False)``, then ``clip_by_value`` and ``tf.cast`` back to uint8 (which truncates).
* TF ``tensorflow/core/kernels/image/sample_distorted_bounding_box_op.cc`` (commit
  27b00cb6ae84b1f8ca5d54c6dac7d37067be46bb), ``GenerateRandomCrop`` and ``DoCompute``: per attempt an aspect
  ratio ``w / h`` drawn *uniformly* (float32) from the range; a height drawn uniformly among the integers
  between ``round(sqrt(min_area / ar))`` and ``round(sqrt(max_area / ar))`` (clamped so the width fits and
  the height fits), width ``round(h * ar)`` (``lrintf``: half to even), one ±1 height correction when
  rounding pushed the area out of range, else the attempt fails; the offset is ``Uniform(H - h)`` /
  ``Uniform(W - w)``, i.e. in ``[0, H - h)``: a box shorter than the image never touches its bottom (right)
  edge. After 100 failed attempts: the whole image. With the whole image as the only "object" and
  ``min_object_covered=0`` the overlap test always passes.
* TF ``tensorflow/core/kernels/image/resize_bilinear_op.cc`` (commit
  023ab92b0a2b63392214443c20f3279bb75845d4) with ``half_pixel_centers=True`` (what TF2's
  ``tf.image.resize`` uses): source coordinate ``(x + 0.5) * in / out - 0.5`` in float32, taps
  ``max(floor, 0)`` and ``min(ceil, in - 1)``, ``top = tl + (tr - tl) * fx``, ``out = top + (bottom - top)
  * fy``; a same-size resize is the identity.

TF draws from a Philox stream; here the same sequence of draws (aspect ratio, height, top, left per
attempt) comes from a NumPy generator, so the distribution is TF's but not its exact samples.

A pipeline without the inception crop resizes with :func:`resize_ops` (torchvision ops).
"""

from __future__ import annotations

import numpy as np

AREA_RANGE = (0.05, 1.0)  # big_vision area_min=5, area_max=100 (percent)
ASPECT_RATIO_RANGE = (0.75, 1.33)  # big_vision ratio_min / ratio_max
MAX_ATTEMPTS = 100  # the op's default; big_vision does not pass it

_f32 = np.float32


def _lrintf(x) -> int:
    """C's ``lrintf`` in the default rounding mode: nearest, ties to even."""
    return int(np.rint(x))


def _try_crop(height: int, width: int, min_frac: np.float32, max_frac: np.float32, aspect: np.float32,
              rng: np.random.Generator) -> tuple[int, int, int, int] | None:
    """One attempt of TF's ``GenerateRandomCrop`` (float32 like the C++); None when it fails."""
    if max_frac <= 0 or aspect <= 0 or min_frac > max_frac:
        return None
    min_area = min_frac * _f32(width) * _f32(height)
    max_area = max_frac * _f32(width) * _f32(height)
    h = _lrintf(np.sqrt(min_area / aspect))
    max_h = _lrintf(np.sqrt(max_area / aspect))
    if _lrintf(_f32(max_h) * aspect) > width:  # the widest box must still fit: largest h with round(h ar) <= W
        max_h = int((width + 0.5 - float(_f32(1e-7))) / float(aspect))
        if _lrintf(_f32(max_h) * aspect) > width:
            max_h -= 1
    max_h = min(max_h, height)
    h = min(h, max_h)
    if h < max_h:
        h += int(rng.integers(max_h - h + 1))
    w = _lrintf(_f32(h) * aspect)
    area = _f32(w * h)
    if area < min_area:  # rounding fell below the range: one step up
        h += 1
        w = _lrintf(_f32(h) * aspect)
        area = _f32(w * h)
    if area > max_area:  # ... or above it: one step down
        h -= 1
        w = _lrintf(_f32(h) * aspect)
        area = _f32(w * h)
    if area < min_area or area > max_area or w > width or h > height or w <= 0 or h <= 0:
        return None
    top = int(rng.integers(height - h)) if h < height else 0
    left = int(rng.integers(width - w)) if w < width else 0
    return top, left, h, w


def sample_distorted_box(height: int, width: int, rng: np.random.Generator, area_range=AREA_RANGE,
                         aspect_ratio_range=ASPECT_RATIO_RANGE,
                         max_attempts: int = MAX_ATTEMPTS) -> tuple[int, int, int, int]:
    """(top, left, height, width) as ``tf.image.sample_distorted_bounding_box`` samples it for big_vision's
    inception crop (no object boxes, ``min_object_covered=0``): up to ``max_attempts`` tries, then the
    whole image."""
    min_frac, max_frac = _f32(area_range[0]), _f32(area_range[1])
    lo, hi = _f32(aspect_ratio_range[0]), _f32(aspect_ratio_range[1])
    for _ in range(max_attempts):
        aspect = rng.random(dtype=np.float32) * (hi - lo) + lo
        box = _try_crop(height, width, min_frac, max_frac, aspect, rng)
        if box is not None:
            return box
    return 0, 0, height, width


def _taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TF's half-pixel-centre bilinear taps along one axis: lower and upper source index, weight of upper."""
    src = (np.arange(out_size, dtype=np.float32) + _f32(0.5)) * (_f32(in_size) / _f32(out_size)) - _f32(0.5)
    floor = np.floor(src)
    lower = np.maximum(floor.astype(np.int64), 0)
    upper = np.minimum(np.ceil(src).astype(np.int64), in_size - 1)
    return lower, upper, src - floor


def resize_bilinear(pixels: np.ndarray, size: int) -> np.ndarray:
    """uint8 HxW(xC) → ``size x size`` uint8 as big_vision's ``resize(size)`` computes it:
    ``tf.image.resize(bilinear, antialias=False)`` (half-pixel centres, float32), clipped, truncated."""
    h, w = pixels.shape[:2]
    if (h, w) == (size, size):
        return pixels.copy()
    channels = pixels.shape[2] if pixels.ndim == 3 else 1
    y0, y1, fy = _taps(h, size)
    x0, x1, fx = _taps(w, size)
    # Rows of W * C values, column taps spread over the channels (TF does the same): fast flat gathers.
    left = (x0[:, None] * channels + np.arange(channels)).ravel()
    right = (x1[:, None] * channels + np.arange(channels)).ravel()
    rows = pixels[np.concatenate([y0, y1])].reshape(2 * size, w * channels)  # a copy: crops may be views
    rows_left, rows_right = rows[:, left].astype(np.float32), rows[:, right].astype(np.float32)
    across = rows_left + (rows_right - rows_left) * np.repeat(fx, channels)  # top rows, then bottom rows
    top, bottom = across[:size], across[size:]
    out = top + (bottom - top) * fy[:, None]
    return np.clip(out, 0, 255).astype(np.uint8).reshape((size, size) + pixels.shape[2:])


def torch_seeded_rng() -> np.random.Generator:
    """A NumPy generator seeded by one draw of torch's global RNG (which ``TransformedSplit`` seeds per
    example), so the box is a function of ``(index, seed)`` and both backends draw it at the same point."""
    import torch

    return np.random.default_rng(int(torch.randint(0, 2**62, (1,))))


class InceptionCrop:
    """big_vision's ``inception_crop(size)`` on a PIL image (the Pillow backend): TF's box sampler, then
    TF's bilinear resize without antialias → PIL image of ``size x size``."""

    def __init__(self, size: int, area_range=AREA_RANGE):
        self.size, self.area_range = size, tuple(area_range)

    def __call__(self, img):
        from PIL import Image

        top, left, h, w = sample_distorted_box(img.height, img.width, torch_seeded_rng(), self.area_range)
        arr = np.asarray(img)
        return Image.fromarray(resize_bilinear(arr[top : top + h, left : left + w], self.size))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, area_range={self.area_range})"


def resize_ops(size: int, *, squash: bool, resize=None) -> list:
    """The resize of a pipeline without inception crop (torchvision v2 ops on a PIL image).

    ``squash``: the whole frame to ``size x size``, aspect not kept (task_adaptation's ``preprocess_fn`` and
    big_vision's transfer configs, ``resize(S)``: a KITTI frame keeps its full width). Otherwise
    ``resize_small(resize or size) | central_crop(size)`` (big_vision's ImageNet evaluation; an integer
    ``resize`` scales the shorter side).
    """
    from torchvision.transforms import v2

    if squash:
        return [v2.Resize((size, size), antialias=True)]
    return [v2.Resize(size if resize is None else resize, antialias=True), v2.CenterCrop(size)]
