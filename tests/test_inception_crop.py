"""``input.crop_sampler: big_vision``: TF's ``sample_distorted_bounding_box`` and bilinear resize (data/crop.py)."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from test_fast_pipeline import cfg, jpeg, photo, seeded

from dpnrepro.data import crop, fast
from dpnrepro.data.loader import build_transform


def tf_box(height, width, rng, area_range=(0.05, 1.0), ratio_range=(0.75, 1.33), attempts=100):
    """The TF op restated line by line from sample_distorted_bounding_box_op.cc (float32 like the C++;
    ``Uniform(n)`` = ``rng.integers(n)``, ``RandFloat()`` = ``rng.random(dtype=float32)``)."""
    f = np.float32
    lrintf = lambda x: int(np.rint(x))  # noqa: E731 - round half to even
    min_area = f(area_range[0]) * f(width) * f(height)
    max_area = f(area_range[1]) * f(width) * f(height)
    for _ in range(attempts):
        ar = rng.random(dtype=np.float32) * (f(ratio_range[1]) - f(ratio_range[0])) + f(ratio_range[0])
        h = lrintf(np.sqrt(min_area / ar))
        max_h = lrintf(np.sqrt(max_area / ar))
        if lrintf(f(max_h) * ar) > width:
            max_h = int((width + 0.5 - float(f(1e-7))) / float(ar))
            if lrintf(f(max_h) * ar) > width:
                max_h -= 1
        max_h = min(max_h, height)
        h = min(h, max_h)
        if h < max_h:
            h += int(rng.integers(max_h - h + 1))
        w = lrintf(f(h) * ar)
        area = f(w * h)
        if area < min_area:
            h, w = h + 1, lrintf(f(h + 1) * ar)
            area = f(w * h)
        if area > max_area:
            h, w = h - 1, lrintf(f(h - 1) * ar)
            area = f(w * h)
        if min_area <= area <= max_area and 0 < w <= width and 0 < h <= height:
            y = int(rng.integers(height - h)) if h < height else 0
            x = int(rng.integers(width - w)) if w < width else 0
            return y, x, h, w
    return 0, 0, height, width


def draws(sampler, n, height, width, seed, **kw):
    rng = np.random.default_rng(seed)
    return np.array([sampler(height, width, rng, **kw) for _ in range(n)])


def ks_statistic(a, b) -> float:
    grid = np.union1d(a, b)
    return float(np.abs(np.searchsorted(np.sort(a), grid, "right") / len(a)
                        - np.searchsorted(np.sort(b), grid, "right") / len(b)).max())


# ------------------------------------------------------------------------------------------ the sampler
@pytest.mark.parametrize("hw", [(375, 500), (500, 375), (28, 28), (224, 224), (3, 7), (1, 1), (10, 1000), (333, 1000)])
def test_same_seeds_give_the_same_boxes_as_the_restated_op(hw):
    for seed in range(300):
        a = crop.sample_distorted_box(*hw, np.random.default_rng(seed))
        b = tf_box(*hw, np.random.default_rng(seed))
        assert a == b, (hw, seed)
        assert all(isinstance(v, int) for v in a)


def test_box_distribution_on_a_non_square_image():
    H, W, n = 375, 500, 20_000
    boxes = draws(crop.sample_distorted_box, n, H, W, 0)
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= H).all() and (left + w <= W).all()
    # TF's offset is Uniform(H - h): a box shorter than the image never reaches its bottom / right edge
    assert (top + h < H)[h < H].all() and (left + w < W)[w < W].all()
    frac = h * w / (H * W)
    assert frac.min() >= 0.05 - 1e-6 and frac.max() <= 1.0
    fallback = (h == H) & (w == W)
    # the width is round(h * ar) for an ar in [0.75, 1.33]: w / h is within half a pixel of that range
    assert ((w[~fallback] - 0.5) / h[~fallback] <= 1.33 + 1e-6).all()
    assert ((w[~fallback] + 0.5) / h[~fallback] >= 0.75 - 1e-6).all()
    # same distribution as the restated op drawn from other seeds (two-sample KS, n = 20k each: 0.02 ~ p 1e-3)
    ref = draws(tf_box, n, H, W, 1)
    assert ks_statistic(frac, ref[:, 2] * ref[:, 3] / (H * W)) < 0.02
    assert ks_statistic(w / h, ref[:, 3] / ref[:, 2]) < 0.02
    # ...and not torchvision's: TF draws the height, not the area, uniformly, so small crops are likelier
    torch.manual_seed(0)
    tv = np.array([fast.inception_crop_params(H, W) for _ in range(n)])
    assert np.median(frac) < np.median(tv[:, 2] * tv[:, 3] / (H * W)) - 0.05


def test_aspect_ratio_is_uniform_not_log_uniform():
    """Where no attempt fails (small areas of a big square), w / h follows the drawn ratio: uniform on
    [0.75, 1.33] (torchvision: log-uniform on [3/4, 4/3])."""
    boxes = draws(crop.sample_distorted_box, 20_000, 2000, 2000, 0, area_range=(0.05, 0.1))
    ratio = boxes[:, 3] / boxes[:, 2]
    assert np.quantile(ratio, [0.25, 0.5, 0.75]) == pytest.approx([0.895, 1.04, 1.185], abs=0.01)


@pytest.mark.parametrize("hw, kw", [
    ((10, 1000), {}),  # too elongated for any 0.75-1.33 box of >= 5 % of the area
    ((1000, 10), {}),
    ((300, 400), {"aspect_ratio_range": (5.0, 6.0), "area_range": (0.5, 1.0)}),  # tight ratio, big area
])
def test_whole_image_when_no_box_fits(hw, kw):
    for seed in range(50):
        assert crop.sample_distorted_box(*hw, np.random.default_rng(seed), **kw) == (0, 0, *hw)


def test_torch_seeded_rng_follows_torch_seed():
    torch.manual_seed(3)
    a = crop.sample_distorted_box(375, 500, crop.torch_seeded_rng())
    torch.manual_seed(3)
    assert crop.sample_distorted_box(375, 500, crop.torch_seeded_rng()) == a


# ------------------------------------------------------------------------------------------- the resize
def test_resize_upsamples_with_half_pixel_centres_and_truncates():
    img = np.array([[0, 100], [200, 40]], np.uint8)
    # source coordinates (x + .5) / 2 - .5 = -.25 (clamped), .25, .75, 1.25 (clamped), on both axes
    expected = np.array([[0, 25, 75, 100],
                         [50, 58, 76, 85],  # 58.75, 76.25: tf.cast truncates
                         [150, 126, 78, 55],  # 126.25, 78.75
                         [200, 160, 80, 40]], np.uint8)
    np.testing.assert_array_equal(crop.resize_bilinear(img, 4), expected)
    np.testing.assert_array_equal(crop.resize_bilinear(np.repeat(img[:, :, None], 3, 2), 4), np.dstack([expected] * 3))


def test_resize_downsamples_without_antialias():
    """Halving samples between pixel pairs 2j, 2j+1: stripes two pixels wide stay pure (an antialiased
    filter would blend in the neighbours: 25 / 175)."""
    stripes = np.tile(np.array([0, 0, 200, 200], np.uint8), (8, 2))
    out = crop.resize_bilinear(stripes, 4)
    np.testing.assert_array_equal(out, np.tile(np.array([0, 200, 0, 200], np.uint8), (4, 1)))
    img = np.arange(64, dtype=np.uint8).reshape(8, 8)
    assert crop.resize_bilinear(img, 8) is not img and np.array_equal(crop.resize_bilinear(img, 8), img)


def test_resize_agrees_with_torch_bilinear_without_antialias():
    rng = np.random.default_rng(0)
    for h, w, size in ((300, 400, 224), (57, 31, 64), (224, 100, 224)):
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        ref = torch.nn.functional.interpolate(torch.from_numpy(img).permute(2, 0, 1)[None].double(), size=(size, size),
                                              mode="bilinear", align_corners=False, antialias=False)
        ref = np.floor(ref[0].permute(1, 2, 0).numpy() + 1e-4)
        diff = np.abs(crop.resize_bilinear(img, size).astype(np.float64) - ref)
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99, (h, w)


# ------------------------------------------------------------------------------------------ both backends
def test_both_backends_use_the_same_box_and_pixels():
    data = jpeg(photo())  # 400 x 300
    for seed in range(16):
        torch.manual_seed(seed)
        pixels, box = fast.decode(data, "RGB", 224, sampler="big_vision")
        torch.manual_seed(seed)
        assert box == crop.sample_distorted_box(300, 400, crop.torch_seeded_rng())
        torch.manual_seed(seed)
        pil = np.asarray(crop.InceptionCrop(224)(Image.open(io.BytesIO(data)).convert("RGB")))
        t, l, h, w = box
        full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.array_equal(pil, crop.resize_bilinear(full[t : t + h, l : l + w], 224))
        got = fast.resized_crop(pixels, box, 224, antialias=False)
        assert np.abs(got.astype(int) - pil.astype(int)).mean() < 0.05  # decoders: libjpeg-turbo both


@pytest.mark.parametrize("randaug", ["", "rand-n2-m15-tbigvision"])
def test_transforms_agree_across_backends(randaug):
    data = jpeg(photo())
    settings = {"crop_sampler": "big_vision", "randaug": randaug}
    tp = build_transform({**cfg(3, size=224, backend="pil"), **settings}, train=True)
    tf = build_transform({**cfg(3, size=224), **settings}, train=True)
    assert tf.crop_sampler == "big_vision"
    diffs = [float((seeded(tp, Image.open(io.BytesIO(data)), s) - seeded(tf, data, s)).abs().mean()) * 127.5
             for s in range(16)]
    assert np.mean(diffs) < (0.05 if not randaug else 2.0), diffs


def test_fast_path_decodes_at_full_scale_for_big_vision(monkeypatch):
    big = jpeg(photo((1600, 1200)))
    calls = []
    real = fast._pil_pixels
    monkeypatch.setattr(fast, "_pil_pixels", lambda *a, **k: calls.append(a) or real(*a, **k))
    for seed in range(8):
        torch.manual_seed(seed)
        pixels, box = fast.decode(big, "RGB", 64, sampler="big_vision")
        assert tuple(pixels.shape) == (1200, 1600, 3) and all(isinstance(v, int) for v in box)
    assert not calls  # no reduced-scale (draft) decode
