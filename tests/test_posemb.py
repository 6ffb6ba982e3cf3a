"""Position-embedding resampling matches big_vision's scipy.ndimage.zoom(order=1)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage
import torch

from dpnrepro.models.posemb import resample_posemb, square_grid


def scipy_reference(posemb: np.ndarray, old: tuple[int, int], new: tuple[int, int]) -> np.ndarray:
    """big_vision's recipe (zoom of the (gh, gw, D) grid, order 1), generalised to non-square grids."""
    grid = posemb.reshape(old[0], old[1], -1).astype(np.float64)
    out = scipy.ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1)
    assert out.shape[:2] == tuple(new)
    return out.reshape(1, new[0] * new[1], -1)


def _posemb(old, dim=8, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, old[0] * old[1], dim, generator=g, dtype=torch.float64)


def test_identity_at_same_size():
    pe = _posemb((5, 5)).float()
    out = resample_posemb(pe, (5, 5))
    assert out.dtype == pe.dtype and out.shape == pe.shape
    assert torch.equal(out, pe)
    out[0, 0, 0] += 1  # a copy, not a view
    assert not torch.equal(out, pe)


@pytest.mark.parametrize("old,new", [
    ((4, 4), (6, 6)),      # Mu/7 at 28 -> 42
    ((14, 14), (24, 24)),  # B/16 at 224 -> 384 (appendix D)
    ((7, 7), (12, 12)),    # B/32 at 224 -> 384
    ((6, 6), (4, 4)),      # downsampling
    ((9, 9), (2, 2)),
    ((3, 3), (1, 1)),
    ((1, 1), (3, 3)),
    ((3, 5), (7, 4)),      # non-square, one axis up and one down
    ((4, 6), (8, 12)),
    ((5, 2), (5, 9)),      # one axis unchanged
])
def test_parity_with_scipy_zoom(old, new):
    pe = _posemb(old, dim=5, seed=sum(old) + sum(new))
    ref = scipy_reference(pe.numpy(), old, new)
    out = resample_posemb(pe, new, old_grid=None if old[0] == old[1] else old)
    assert out.shape == (1, new[0] * new[1], 5)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-12)


def test_parity_with_big_vision_float32():
    """float32 in and out, as a checkpoint's pos_embed; scipy on float32 computes in float64 too."""
    pe = _posemb((14, 14), dim=16, seed=3).float()
    grid = pe.numpy().reshape(14, 14, 16)
    ref = scipy.ndimage.zoom(grid, (24 / 14, 24 / 14, 1), order=1).reshape(1, 576, 16)
    out = resample_posemb(pe, (24, 24))
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-6)


def test_bilinear_ramp_is_reproduced_exactly():
    """f(r, c) = a + b*r + c*col sampled on a corner-aligned grid stays the same plane on any grid."""
    def ramp(gh, gw):
        r = np.linspace(0.0, 1.0, gh)[:, None, None]
        c = np.linspace(0.0, 1.0, gw)[None, :, None]
        coef = np.array([1.0, -2.0, 0.5])
        return (coef[0] * r + coef[1] * c + coef[2] + 3.0 * r * c).reshape(1, gh * gw, 1)

    pe = torch.from_numpy(ramp(4, 5))
    for new in [(7, 9), (2, 3), (11, 4)]:
        out = resample_posemb(pe, new, old_grid=(4, 5))
        np.testing.assert_allclose(out.numpy(), ramp(*new), rtol=0, atol=1e-12)


def test_corners_are_kept():
    pe = _posemb((5, 5), dim=3)
    out = resample_posemb(pe, (9, 9)).reshape(9, 9, 3)
    src = pe.reshape(5, 5, 3)
    for (i, j), (k, m) in {(0, 0): (0, 0), (0, 4): (0, 8), (4, 0): (8, 0), (4, 4): (8, 8)}.items():
        assert torch.equal(out[k, m], src[i, j])


def test_bad_inputs():
    with pytest.raises(ValueError, match="square grid"):
        resample_posemb(torch.zeros(1, 12, 4), (4, 4))
    with pytest.raises(ValueError, match="cells"):
        resample_posemb(torch.zeros(1, 12, 4), (4, 4), old_grid=(3, 3))
    with pytest.raises(ValueError, match="position embedding"):
        resample_posemb(torch.zeros(16, 4), (4, 4))
    assert square_grid(49) == (7, 7)
