"""Position embeddings of the ViT-DPN family: big_vision's fixed 2-D sin-cos table, and resampling
learned ones to a new patch grid ("high-resolution fine-tuning").

:func:`posemb_sincos_2d` is the table of ``posemb='sincos2d'``, added to the patch tokens and not trained.

Fine-tuning at a higher resolution than pre-training (paper appendix D, 224 -> 384) keeps the patch
size, so the grid of patches grows and the learned position embeddings, one per patch, have to be
resized to the new grid. big_vision does this with ``scipy.ndimage.zoom(grid, zoom, order=1)`` on the
``(gh, gw, D)`` grid: linear interpolation along each grid axis, separately per embedding channel,
with the *corner samples aligned* (scipy's default ``grid_mode=False``): output index ``o`` of an axis
of ``n_out`` samples reads input coordinate ``o * (n_in - 1) / (n_out - 1)``, so the first and last
rows/columns of the new grid are exactly the first and last of the old one (PyTorch's
``align_corners=True``). No spline prefilter is involved for ``order=1``, and every coordinate lies
inside the input, so scipy's boundary mode never matters.

:func:`resample_posemb` implements the same interpolation in torch (computed in float64, returned in
the input's dtype and device), for the ``(1, gh*gw, D)`` position embedding of our timm-based ViT,
which covers the patch tokens only (``no_embed_class=True``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["posemb_sincos_2d", "resample_posemb", "square_grid"]


def posemb_sincos_2d(h: int, w: int, width: int, temperature: float = 10_000.) -> Tensor:
    """big_vision's fixed 2-D sin-cos position embedding, shape (1, h*w, width), row-major grid.

    Features are [sin(x ω), cos(x ω), sin(y ω), cos(y ω)] with ω_k = temperature^(-k / (width/4 - 1)).
    """
    if width % 4:
        raise ValueError(f'sincos2d position embeddings need a width divisible by 4, got {width}')
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing='ij')
    omega = 1.0 / temperature ** (torch.arange(width // 4, dtype=torch.float64) / (width // 4 - 1))
    x = x.flatten()[:, None] * omega[None]
    y = y.flatten()[:, None] * omega[None]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)[None].float()


def square_grid(num_tokens: int) -> tuple[int, int]:
    """``(g, g)`` with ``g * g == num_tokens``; ValueError when ``num_tokens`` is not a square."""
    g = math.isqrt(num_tokens) if num_tokens >= 0 else -1
    if g < 1 or g * g != num_tokens:
        raise ValueError(f"{num_tokens} position embeddings do not form a square grid; pass old_grid=(gh, gw)")
    return g, g


def _axis_weights(n_in: int, n_out: int) -> tuple[Tensor, Tensor, Tensor]:
    """Lower index, upper index and upper weight of each output sample along one axis (float64).

    Corner-aligned as scipy's zoom with ``grid_mode=False``: the step between output samples in input
    coordinates is ``(n_in - 1) / (n_out - 1)`` (taken as 1 when ``n_out == 1``, which reads sample 0).
    """
    step = (n_in - 1) / (n_out - 1) if n_out > 1 else 1.0
    coord = torch.arange(n_out, dtype=torch.float64) * step
    coord = coord.clamp(0.0, n_in - 1)  # guards against a last coordinate of n_in - 1 + rounding error
    lo = coord.floor().long().clamp(max=max(n_in - 2, 0))
    hi = (lo + 1).clamp(max=n_in - 1)
    return lo, hi, coord - lo.to(torch.float64)


def _resample_axis(x: Tensor, n_out: int, dim: int) -> Tensor:
    lo, hi, w = _axis_weights(x.shape[dim], n_out)
    shape = [1] * x.ndim
    shape[dim] = n_out
    w = w.reshape(shape)
    return x.index_select(dim, lo) * (1.0 - w) + x.index_select(dim, hi) * w


@torch.no_grad()
def resample_posemb(posemb: Tensor, new_grid: Sequence[int] | int,
                    old_grid: Sequence[int] | None = None) -> Tensor:
    """Bilinearly resize a ``(1, gh*gw, D)`` position embedding to ``(1, nh*nw, D)``.

    Numerically what big_vision's ``resample_posemb`` computes with ``scipy.ndimage.zoom(order=1)`` on
    the ``(gh, gw, D)`` grid (tokens in row-major order, row index first), but for any old and new
    grid, square or not. ``old_grid`` defaults to the square grid of the token count. A same-size grid
    returns an unchanged copy. The result has the dtype and device of ``posemb``.
    """
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise ValueError(f"expected a (1, tokens, dim) position embedding, got shape {tuple(posemb.shape)}")
    new = (int(new_grid), int(new_grid)) if isinstance(new_grid, int) else tuple(int(g) for g in new_grid)
    old = square_grid(posemb.shape[1]) if old_grid is None else tuple(int(g) for g in old_grid)
    if len(new) != 2 or min(new) < 1 or len(old) != 2 or min(old) < 1:
        raise ValueError(f"grids must be two positive sizes (rows, cols); got old {old}, new {new}")
    if old[0] * old[1] != posemb.shape[1]:
        raise ValueError(f"old grid {old} has {old[0] * old[1]} cells but the embedding has {posemb.shape[1]} tokens")
    if new == old:
        return posemb.detach().clone()
    dim = posemb.shape[-1]
    grid = posemb.detach().to("cpu", torch.float64).reshape(old[0], old[1], dim)
    grid = _resample_axis(_resample_axis(grid, new[0], 0), new[1], 1)
    return grid.reshape(1, new[0] * new[1], dim).to(device=posemb.device, dtype=posemb.dtype)
