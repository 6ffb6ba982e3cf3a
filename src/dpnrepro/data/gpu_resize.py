"""Crop + resize + flip of a whole batch of decoded images of different sizes, as gathers (``input.backend: gpu``).

The decoded images lie back to back in one flat uint8 buffer (``(C, H, W)`` each, at ``offset``); every output
pixel's source pixels are gathered from it by index, so the batch is a handful of kernels whatever the image
sizes, and no value goes back to the host (the sizes the host needs, the widest crop and the widest filter,
come from its own copy of the boxes). A flip reverses the output columns' taps.

* ``big_vision`` (:func:`tf_bilinear`): TF's ``resize(bilinear, antialias=False)`` with half-pixel centres,
  float32 taps, ``top = l + (r - l) fx``, ``out = top + (bottom - top) fy``, clipped, truncated: the operation
  order of :func:`dpnrepro.data.crop.resize_bilinear`, bit-exact against it.
* ``torchvision`` (:func:`antialiased`): separable antialiased bilinear with PIL / torch's weights (support
  ``max(scale, 1)``, triangle, normalised), horizontal pass then vertical in float32, rounded: within 1 grey
  level of torch's fixed-point uint8 kernel that the CPU path runs.
"""

from __future__ import annotations

import math

import torch

# a batch's head row per image (float64; integers): the decoded size, the crop box, the flip, where the
# decoded pixels start in the flat buffer
HEAD = ("H", "W", "top", "left", "h", "w", "flip", "offset")
_H = {name: k for k, name in enumerate(HEAD)}


def _col(head: torch.Tensor, name: str, dtype=torch.int64) -> torch.Tensor:
    return head[:, _H[name]].to(dtype).view(-1, 1)


def _tf_taps(size: torch.Tensor, out: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TF's half-pixel-centre taps of ``size`` (n, 1) → ``out``: lower and upper index (n, out), upper's weight."""
    src = (torch.arange(out, dtype=torch.float32, device=size.device) + 0.5) * (size.float() / out) - 0.5
    floor = src.floor()
    lower = floor.long().clamp(min=0)
    upper = torch.minimum(src.ceil().long(), size - 1)
    return lower, upper, src - floor


def _flip_cols(t: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """``t`` (n, S, ...) with its S axis reversed for the images that flip."""
    return torch.where(flip.view(-1, *([1] * (t.dim() - 1))), t.flip(1), t)


def _index(head: torch.Tensor, channels: int, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Flat-buffer index (n, C, R, K) of crop rows ``rows`` (n, R) x crop columns ``cols`` (n, K)."""
    H, W, off = _col(head, "H"), _col(head, "W"), _col(head, "offset")
    top, left = _col(head, "top"), _col(head, "left")
    c = torch.arange(channels, device=head.device).view(1, -1, 1, 1)
    plane = off.view(-1, 1, 1, 1) + c * (H * W).view(-1, 1, 1, 1)
    return plane + ((top + rows) * W)[:, None, :, None] + (left + cols)[:, None, None, :]


def tf_bilinear(flat: torch.Tensor, head: torch.Tensor, channels: int, size: int) -> torch.Tensor:
    """big_vision's crop + resize (+ flip) of every image: uint8 (n, C, S, S)."""
    y0, y1, fy = _tf_taps(_col(head, "h"), size)
    x0, x1, fx = _tf_taps(_col(head, "w"), size)
    flip = _col(head, "flip", torch.bool)
    x0, x1, fx = _flip_cols(x0, flip), _flip_cols(x1, flip), _flip_cols(fx, flip)

    i00 = _index(head, channels, y0, x0)  # the other three corners by a row / column step
    down, right = ((y1 - y0) * _col(head, "W"))[:, None, :, None], (x1 - x0)[:, None, None, :]

    def at(idx):
        return torch.take(flat, idx).float()

    fx, fy = fx[:, None, None, :], fy[:, None, :, None]
    top = at(i00)
    top = top + (at(i00 + right) - top) * fx
    i10 = i00 + down
    bottom = at(i10)
    bottom = bottom + (at(i10 + right) - bottom) * fx
    return (top + (bottom - top) * fy).clamp_(0, 255).to(torch.uint8)


def _aa_taps(size: torch.Tensor, out: int, taps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """PIL / torch's antialiased bilinear taps of ``size`` (n, 1) → ``out``: (n, out, taps) indices (clamped
    into the crop) and normalised weights (0 beyond each pixel's support)."""
    scale = size.double() / out
    support = scale.clamp(min=1.0)
    centre = scale.unsqueeze(-1) * (torch.arange(out, dtype=torch.float64, device=size.device).view(1, -1, 1) + 0.5)
    lo = (centre - support.unsqueeze(-1) + 0.5).trunc().clamp(min=0)
    hi = torch.minimum((centre + support.unsqueeze(-1) + 0.5).trunc(), size.double().unsqueeze(-1))
    j = torch.arange(taps, dtype=torch.float64, device=size.device).view(1, 1, -1)
    w = (1 - ((j + lo - centre + 0.5) / support.unsqueeze(-1)).abs()).clamp(min=0) * (j < hi - lo)
    w = (w / w.sum(-1, keepdim=True)).float()
    return torch.minimum(lo.long() + j.long(), size.unsqueeze(-1) - 1), w


def aa_taps_needed(boxes: torch.Tensor, size: int) -> int:
    """The most taps any crop of ``boxes`` (host, (n, 2): h, w) needs for an antialiased resize to ``size``."""
    return int(math.ceil(2 * max(1.0, float(boxes.max()) / size))) + 2


def antialiased(flat: torch.Tensor, head: torch.Tensor, channels: int, size: int, taps: int,
                max_h: int) -> torch.Tensor:
    """torchvision's crop + antialiased resize (+ flip) of every image: uint8 (n, C, S, S); ``taps`` from
    :func:`aa_taps_needed`, ``max_h`` the tallest crop (both from the host's copy of the boxes)."""
    n = head.shape[0]
    h = _col(head, "h")
    xi, xw = _aa_taps(_col(head, "w"), size, taps)
    flip = _col(head, "flip", torch.bool)
    xi, xw = _flip_cols(xi, flip), _flip_cols(xw, flip)
    rows = torch.arange(max_h, device=head.device).view(1, -1).expand(n, -1).minimum(h - 1)
    across = None  # horizontal pass: (n, C, max_h, S)
    for k in range(taps):
        t = torch.take(flat, _index(head, channels, rows, xi[:, :, k])).float() * xw[:, None, None, :, k]
        across = t if across is None else across + t
    yi, yw = _aa_taps(h, size, taps)
    out = None  # vertical pass: (n, C, S, S)
    for k in range(taps):
        idx = yi[:, :, k].view(n, 1, size, 1).expand(n, channels, size, size)
        t = across.gather(2, idx) * yw[:, None, :, k, None]
        out = t if out is None else out + t
    return out.round_().clamp_(0, 255).to(torch.uint8)
