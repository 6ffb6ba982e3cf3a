"""``rand-n{n}-m{m}-tbigvision`` (data/randaugment.py ``randaugment``) against big_vision's ``randaug(n, m)``.

Reference: ``big_vision/pp/archive/autoaugment.py`` (``distort_image_with_randaugment``, ``level_to_arg``
and the op functions it calls) at google-research/big_vision commit
0127fb6b337ee2a27bf4e54dea79cff176527356, transcribed below as data and as NumPy versions of its TF ops.
Three TF behaviours that code depends on are transcribed too: a Python int compared with a uint8 tensor
is cast to uint8 (big_vision issue #110: ``solarize`` at threshold 256 inverts every pixel); TF's bitwise
shifts clamp the shift to [0, 7] for uint8 (``tensorflow/core/kernels/cwise_ops.h``); tensorflow_addons'
``rotate`` / ``translate`` / ``transform`` default to nearest-neighbour interpolation.

The tests drive timm's own objects (``AugmentOp.__call__``, its level functions and image functions) and
the fast path's :func:`dpnrepro.data.randaugment.apply_op`, so a changed spec, hparam or timm version fails here.
"""
from __future__ import annotations

import copy
import io
import random
from collections import Counter

import numpy as np
import pytest
import torch
import yaml
from helpers import REPO
from PIL import Image

from dpnrepro.data.loader import build_transform
from dpnrepro.data.randaugment import apply_op, randaugment

# ----------------------------------------------------------------------------- big_vision @ 0127fb6, as data
BV_OPS = ["AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "Color", "Contrast",
          "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateX", "TranslateY", "Cutout", "SolarizeAdd"]
MAX_LEVEL = 10.0
TRANSLATE_CONST, CUTOUT_CONST = 100, 40  # HParams(cutout_const=40, translate_const=100)
REPLACE = 128  # replace_value = [128] * 3
SIGNED = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"}  # _randomly_negate_tensor: p 0.5
BV_SIZE = 224  # AugReg: decode_jpeg_and_inception_crop(224)|flip_lr|randaug(2, m)
PROFILE_SETTINGS = [0, 10, 15]  # light1 randaug(2,0), light2 randaug(2,10), medium randaug(2,15)


def bv_level_to_arg(name: str, level: float) -> tuple:
    """big_vision's ``level_to_arg(hparams)[name](level)``, without the random sign."""
    r = level / MAX_LEVEL
    enhance = (r * 1.8 + 0.1,)
    return {
        "AutoContrast": (), "Equalize": (), "Invert": (),
        "Rotate": (r * 30.0,),
        "Posterize": (int(r * 4),),
        "Solarize": (int(r * 256),),
        "SolarizeAdd": (int(r * 110),),
        "Color": enhance, "Contrast": enhance, "Brightness": enhance, "Sharpness": enhance,
        "ShearX": (r * 0.3,), "ShearY": (r * 0.3,),
        "Cutout": (int(r * CUTOUT_CONST),),
        "TranslateX": (r * float(TRANSLATE_CONST),), "TranslateY": (r * float(TRANSLATE_CONST),),
    }[name]


def tf_effective(name: str, args: tuple) -> tuple:
    """What big_vision's TF op does with that argument on a uint8 image."""
    if name == "Solarize":  # `image < threshold`: the threshold becomes a uint8 (big_vision issue #110)
        return (args[0] % 256,)
    if name == "Posterize":  # shift = 8 - bits, cast to uint8, clamped to 7 by TF's shift kernels
        return (8 - min(7, (8 - args[0]) % 256),)
    return args


# NumPy transcriptions of big_vision's TF image ops (uint8 HxWx3 in, uint8 out; float32 like TF).
def tf_blend(image1, image2, factor):
    if factor == 0.0:
        return image1
    if factor == 1.0:
        return image2
    a, b = image1.astype(np.float32), image2.astype(np.float32)
    temp = a + np.float32(factor) * (b - a)
    return temp.astype(np.uint8) if 0.0 < factor < 1.0 else np.clip(temp, 0, 255).astype(np.uint8)


def tf_grey(image):  # tf.image.rgb_to_grayscale on uint8: float in [0, 1], weights, back via x 255.5
    g = (image.astype(np.float32) * np.float32(1 / 255)) @ np.array([0.2989, 0.5870, 0.1140], np.float32)
    return (g * np.float32(255.5)).astype(np.uint8)[:, :, None].repeat(3, axis=2)


def tf_autocontrast(image):
    out = image.copy()
    for c in range(3):
        ch = image[:, :, c]
        lo, hi = np.float32(ch.min()), np.float32(ch.max())
        if hi > lo:
            scale = np.float32(255.0) / (hi - lo)
            out[:, :, c] = np.clip(ch.astype(np.float32) * scale - lo * scale, 0, 255).astype(np.uint8)
    return out


def tf_equalize(image):
    out = image.copy()
    for c in range(3):
        ch = image[:, :, c].astype(np.int64)
        histo = np.bincount(ch.ravel(), minlength=256)  # histogram_fixed_width([0, 255], 256) of uint8
        nonzero = histo[histo != 0]
        step = (nonzero.sum() - nonzero[-1]) // 255
        if step:
            lut = np.clip(np.concatenate([[0], ((np.cumsum(histo) + step // 2) // step)[:-1]]), 0, 255)
            out[:, :, c] = lut[ch]
    return out


def tf_sharpness(image, factor):
    x = image.astype(np.float32)
    k = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32) / np.float32(13)
    h, w = image.shape[:2]
    conv = sum(k[i, j] * x[i:h - 2 + i, j:w - 2 + j] for i in range(3) for j in range(3))
    result = image.copy()
    result[1:-1, 1:-1] = np.clip(conv, 0, 255).astype(np.uint8)
    return tf_blend(result, image, factor)


def tf_posterize(image, bits):
    shift = min(7, max(0, (8 - bits) % 256))
    return (image >> shift) << shift


def tf_solarize(image, threshold):
    return np.where(image < np.uint8(threshold % 256), image, 255 - image)


def tf_solarize_add(image, addition):
    added = np.clip(image.astype(np.int64) + addition, 0, 255).astype(np.uint8)
    return np.where(image < 128, added, image)


def tf_contrast(image, factor):
    h, w = image.shape[:2]
    mean = np.float32(h * w) / np.float32(256.0)  # reduce_sum(histogram) / 256: the pixel count / 256
    return tf_blend(np.full_like(image, np.uint8(np.clip(mean, 0, 255))), image, factor)


TF_PIXEL_OPS = {
    "AutoContrast": lambda im: tf_autocontrast(im),
    "Equalize": lambda im: tf_equalize(im),
    "Invert": lambda im: 255 - im,
    "Posterize": tf_posterize,
    "Solarize": tf_solarize,
    "SolarizeAdd": tf_solarize_add,
    "Color": lambda im, f: tf_blend(tf_grey(im), im, f),
    "Contrast": tf_contrast,
    "Brightness": lambda im, f: tf_blend(np.zeros_like(im), im, f),
    "Sharpness": tf_sharpness,
}
# (max, mean) abs difference in grey levels allowed against the transcription; the rest must be exact.
# Expected differences: Color: TF's grey is trunc(255.5 g), PIL's L rounds; Sharpness: TF truncates the
# smoothed image, PIL rounds (both amplified by the extrapolating blend, factor 2.8 at m 15);
# AutoContrast: PIL's LUT in float64, TF in float32 (a few values one level apart).
PIXEL_TOLERANCE = {"Color": (2, 1.0), "Sharpness": (2, 1.0), "AutoContrast": (1, 0.01)}


# ------------------------------------------------------------------------------------------------- helpers
def photo(size=BV_SIZE) -> Image.Image:
    import matplotlib

    with Image.open(f"{matplotlib.get_data_path()}/sample_data/grace_hopper.jpg") as im:
        return im.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)


@pytest.fixture(scope="module")
def img() -> Image.Image:
    return photo()


def bigvision(m: int, n: int = 2, size: int = BV_SIZE, channels: int = 3):
    return randaugment(f"rand-n{n}-m{m}-tbigvision", size, channels)


def op_named(ra, name):
    (op,) = [op for op in ra.ops if op.name == name]
    return op


def drawn_args(op, draws: int = 64) -> tuple[set, int]:
    """The arguments timm's ``AugmentOp.__call__`` hands to the image function (after its probability
    check, magnitude clip, level function and random sign) over ``draws`` seeded calls, and how many
    calls applied the op at all."""
    seen, probe = [], copy.copy(op)
    probe.aug_fn = lambda image, *args, **kwargs: seen.append(tuple(round(float(a), 9) for a in args)) or image
    for seed in range(draws):
        random.seed(seed)
        probe(Image.new("RGB", (BV_SIZE, BV_SIZE)))
    return set(seen), len(seen)


# --------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("m", PROFILE_SETTINGS)
def test_op_list_and_sampling_match_big_vision(m):
    """16 ops in big_vision's order, ``n`` layers, each drawn uniformly with replacement
    (``tf.random_uniform([], maxval=len(available_ops))`` per layer)."""
    ra = bigvision(m, n=2)
    assert [op.name for op in ra.ops] == BV_OPS
    assert ra.num_layers == 2 and ra.choice_weights is None
    assert bigvision(m, n=3).num_layers == 3
    random.seed(0)
    draws = [op.name for _ in range(8000) for op in ra.choose()]
    counts = Counter(draws)
    assert set(counts) == set(BV_OPS)
    assert all(abs(c / len(draws) - 1 / 16) < 0.012 for c in counts.values()), counts
    random.seed(1)
    assert any(len({op.name for op in ra.choose()}) == 1 for _ in range(500))  # with replacement


@pytest.mark.parametrize("m", PROFILE_SETTINGS + [20])
def test_every_op_always_applied_at_fixed_uncapped_magnitude(m):
    """big_vision applies the chosen op unconditionally (the ``prob`` it draws goes nowhere: no op takes
    a ``prob`` argument), at ``float(magnitude)``: no noise, no clip at ``_MAX_LEVEL``."""
    for op in bigvision(m).ops:
        assert op.prob == 1.0 and op.magnitude == m and op.magnitude_std == 0, op
        assert (op.magnitude_max or MAX_LEVEL) >= m, op  # timm clips at 10 unless told otherwise
        _, applied = drawn_args(op, draws=32)
        assert applied == 32, op.name


@pytest.mark.parametrize("name", BV_OPS)
@pytest.mark.parametrize("m", PROFILE_SETTINGS + [20])
def test_op_arguments_match_big_vision(m, name):
    """The argument each op receives equals big_vision's level_to_arg (after TF's uint8 semantics), with
    a random sign exactly for Rotate / Shear / Translate."""
    op = op_named(bigvision(m), name)
    seen, _ = drawn_args(op)
    expected = tuple(round(float(a), 9) for a in tf_effective(name, bv_level_to_arg(name, m)))
    if name in SIGNED and expected[0] != 0:
        assert seen == {expected, (-expected[0],)}, (name, m, seen)
    else:
        assert {tuple(abs(a) for a in s) for s in seen} == {expected}, (name, m, seen)


@pytest.mark.parametrize("m, table", [
    # (op: big_vision value) at the profile's magnitudes, spelled out; l = m / 10.
    (0, {"Rotate": 0.0, "Posterize": 1, "Solarize": 0, "SolarizeAdd": 0, "Color": 0.1, "ShearX": 0.0,
         "TranslateX": 0.0, "Cutout": 0}),
    (10, {"Rotate": 30.0, "Posterize": 4, "Solarize": 0, "SolarizeAdd": 110, "Color": 1.9, "ShearX": 0.3,
          "TranslateX": 100.0, "Cutout": 40}),
    (15, {"Rotate": 45.0, "Posterize": 6, "Solarize": 128, "SolarizeAdd": 165, "Color": 2.8,
          "ShearX": 0.45, "TranslateX": 150.0, "Cutout": 60}),
])
def test_level_table_at_profile_magnitudes(m, table):
    """The same numbers written out: m 15 gives 1.5x the m-10 ranges (no timm cap at 10); Solarize at
    m 10 inverts everything (threshold 256 → uint8 0) and at m 15 solarizes at 128 (384 → 128);
    SolarizeAdd 165 at m 15 (timm would cap it at 128); Posterize keeps 1 bit at m 0 (TF's shift clamp)."""
    ra = bigvision(m)
    for name, value in table.items():
        seen, _ = drawn_args(op_named(ra, name))
        assert {abs(s[0]) for s in seen} == {round(value, 9)}, (name, seen)


def test_fill_and_interpolation_are_big_vision_s():
    """replace_value 128 for every op that fills; tfa's rotate / translate / transform sample nearest."""
    for op in bigvision(15).ops:
        assert op.kwargs["fillcolor"] == (REPLACE,) * 3, op.name
        assert op.kwargs["resample"] == Image.Resampling.NEAREST, op.name
    assert op_named(bigvision(15, channels=1), "Rotate").kwargs["fillcolor"] == (REPLACE,)


@pytest.mark.parametrize("name", list(TF_PIXEL_OPS))
@pytest.mark.parametrize("m", PROFILE_SETTINGS)
def test_pixel_ops_match_big_vision_tf_code(img, m, name):
    """Both backends (timm's PIL function via ``op(img)``, the fast path via ``apply_op``) against the NumPy
    transcription of big_vision's TF op with big_vision's argument."""
    op = op_named(bigvision(m), name)
    arr = np.array(img)
    ref = TF_PIXEL_OPS[name](arr, *tf_effective(name, bv_level_to_arg(name, m))).astype(np.int16)
    max_tol, mean_tol = PIXEL_TOLERANCE.get(name, (0, 0.0))
    for got in (np.asarray(op(img)), apply_op(op, arr)):
        diff = np.abs(got.astype(np.int16) - ref)
        assert diff.max() <= max_tol and diff.mean() <= mean_tol, (name, m, int(diff.max()), float(diff.mean()))


def test_contrast_blends_towards_pixel_count_over_256(img):
    """big_vision's Contrast "mean" is sum(histogram) / 256 = H·W / 256 (196 at 224 px), not the mean
    pixel that PIL's ImageEnhance.Contrast uses: a real difference the reproduction keeps."""
    from PIL import ImageEnhance

    op = op_named(bigvision(10), "Contrast")
    arr = np.array(img)
    ours = np.asarray(op(img)).astype(np.int16)
    assert np.array_equal(ours, tf_contrast(arr, 1.9))
    pil = np.asarray(ImageEnhance.Contrast(img).enhance(1.9)).astype(np.int16)
    assert np.abs(ours - pil).mean() > 10
    flat = Image.new("RGB", (224, 224), (196,) * 3)
    assert np.all(np.asarray(op(flat)) == 196)


@pytest.mark.parametrize("m", PROFILE_SETTINGS)
def test_cutout_is_big_vision_s(m):
    """A 128-filled square [c - p, c + p) clipped to the image, centre uniform over the image,
    p = int(40 m / 10) (no change at m 0); same pixels on both backends."""
    op = op_named(bigvision(m), "Cutout")
    pad = int(m / MAX_LEVEL * CUTOUT_CONST)
    base = np.array(photo())
    base[base == REPLACE] = REPLACE - 1  # so the 128s in the output are exactly the cut-out pixels
    im = Image.fromarray(base)
    centres, full = [], 0
    for seed in range(200):
        random.seed(seed)
        out = np.asarray(op(im))
        random.seed(seed)
        assert np.array_equal(apply_op(op, base), out)
        mask = (out == REPLACE).all(axis=2)
        assert np.array_equal(out[~mask], base[~mask])
        if pad == 0:
            assert not mask.any()
            continue
        rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
        assert mask.sum() == len(rows) * len(cols)  # a rectangle
        assert len(rows) <= 2 * pad and len(cols) <= 2 * pad
        assert (rows[0] == 0 or rows[-1] == BV_SIZE - 1 or len(rows) == 2 * pad)
        assert (cols[0] == 0 or cols[-1] == BV_SIZE - 1 or len(cols) == 2 * pad)
        full += len(rows) == len(cols) == 2 * pad
        centres.append((rows[0] + len(rows) / 2, cols[0] + len(cols) / 2))
    if pad:
        inner = ((BV_SIZE - 2 * pad) / BV_SIZE) ** 2  # P(centre at least pad from every border)
        assert abs(full / 200 - inner) < 0.1, (full, inner)
        c = np.array(centres)
        assert c.min() < 0.25 * BV_SIZE and c.max() > 0.75 * BV_SIZE  # centre anywhere, border included


def tfa_nearest(arr, a, b, c, d, e, f):
    """tfa's projective transform (nearest, integer pixel grid) on HxWx3: output (x, y) reads input
    (round(a x + b y + c), round(d x + e y + f)); outside → big_vision's unwrap fills 128."""
    h, w = arr.shape[:2]
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    xi, yi = np.round(a * x + b * y + c).astype(int), np.round(d * x + e * y + f).astype(int)
    inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
    out = np.full_like(arr, REPLACE)
    out[inside] = arr[yi[inside], xi[inside]]
    return out


@pytest.mark.parametrize("m", [10, 15])
def test_geometric_ops_match_tfa_nearest(img, m):
    """Rotate / Shear / Translate with big_vision's argument (both signs) against tfa's nearest-neighbour
    transforms. Translations by whole pixels are exact; rotations share the centre and differ only where
    rounding ties differ; shears differ by PIL's pixel-centre offset (0.5 · shear px): an expected,
    sub-pixel difference."""
    arr = np.array(img)
    h, w = arr.shape[:2]
    ra = bigvision(m)
    for name in ["TranslateX", "TranslateY", "Rotate", "ShearX", "ShearY"]:
        op = op_named(ra, name)
        (v,) = bv_level_to_arg(name, m)
        for s in (v, -v):
            got = np.asarray(op.aug_fn(img, s, **op.kwargs)).astype(np.int16)
            if name == "TranslateX":  # translate_x: contrib_image.translate(wrap(image), [-pixels, 0])
                ref, limit = tfa_nearest(arr, 1, 0, s, 0, 1, 0), (0, 0)
            elif name == "TranslateY":
                ref, limit = tfa_nearest(arr, 1, 0, 0, 0, 1, s), (0, 0)
            elif name == "Rotate":  # tfa.image.rotate: counter-clockwise about ((w - 1) / 2, (h - 1) / 2)
                t = np.deg2rad(s)
                cos, sin = np.cos(t), np.sin(t)
                ref = tfa_nearest(arr, cos, -sin, ((w - 1) - (cos * (w - 1) - sin * (h - 1))) / 2,
                                  sin, cos, ((h - 1) - (sin * (w - 1) + cos * (h - 1))) / 2)
                limit = (0.01, 0.05)
            elif name == "ShearX":  # transform [1, level, 0, 0, 1, 0, 0, 0]
                ref, limit = tfa_nearest(arr, 1, s, 0, 0, 1, 0), (0.3, 3.0)
                shifted = tfa_nearest(arr, 1, s, s / 2, 0, 1, 0)  # PIL samples at pixel centres
            else:
                ref, limit = tfa_nearest(arr, 1, 0, 0, s, 1, 0), (0.3, 3.0)
                shifted = tfa_nearest(arr, 1, 0, 0, s, 1, s / 2)
            if name.startswith("Shear"):  # the whole difference is that half-pixel offset
                assert (np.abs(got - shifted) > 0).mean() <= 0.005, (name, s)
            diff = np.abs(got - ref)
            assert (diff > 0).mean() <= limit[0] and diff.mean() <= limit[1], (name, s, (diff > 0).mean(),
                                                                                diff.mean())


def test_translate_and_cutout_scale_with_image_size():
    """Expected difference: big_vision's 100 px / 40 px are absolute (AugReg runs randaug at 224 px);
    at other sizes ours scale by size / 224, so a 28 px image is not translated entirely out of view."""
    for size in (112, 448):
        ra = bigvision(10, size=size)
        seen, _ = drawn_args(op_named(ra, "TranslateX"))
        assert {abs(s[0]) for s in seen} == {round(100 * size / BV_SIZE, 9)}
        seen, _ = drawn_args(op_named(ra, "Cutout"))
        assert seen == {(int(40 * size / BV_SIZE),)}


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("m", [0, 15])
def test_fast_path_runs_the_same_ops(img, m, channels):
    """apply_op (fast path) on every op gives timm's PIL result and consumes ``random`` identically.
    Nearest-neighbour warps agree exactly except for rounding ties in ±45° rotations."""
    im = img if channels == 3 else img.convert("L")
    arr = np.array(im).reshape(BV_SIZE, BV_SIZE, channels)
    for op in bigvision(m, channels=channels).ops:
        for seed in range(4):
            random.seed(seed)
            ref = np.asarray(op(im)).reshape(arr.shape).astype(np.int16)
            state = random.getstate()
            random.seed(seed)
            got = apply_op(op, arr).astype(np.int16)
            assert random.getstate() == state, op.name
            diff = np.abs(got - ref)
            assert (diff > 0).mean() <= (0.005 if op.name == "Rotate" else 0.0), (op.name, (diff > 0).mean())


def test_whole_pipeline_pil_and_fast_agree():
    """The train transform with the big_vision spelling: both backends, same seed, near-identical."""
    buf = io.BytesIO()
    photo(300).resize((400, 300)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    cfg = dict(image_size=224, channels=3, eval_resize=224, inception_crop=True, flip=True,
               randaug="rand-n2-m15-tbigvision")
    tp = build_transform({**cfg, "backend": "pil"}, train=True)
    tf = build_transform({**cfg, "backend": "fast"}, train=True)
    diffs = []
    for seed in range(12):
        torch.manual_seed(seed)
        random.seed(seed)
        a = tp(Image.open(io.BytesIO(data)))
        torch.manual_seed(seed)
        random.seed(seed)
        b = tf(data)
        diffs.append(float((a - b).abs().mean()) * 127.5)
    assert np.mean(diffs) < 0.5, diffs


@pytest.mark.parametrize("spec", ["rand-n2-m15-mmax15-tbigvision", "rand-n2-m15-p0.5-tbigvision",
                                  "rand-n2-m9-mstd0.5-tbigvision", "rand-n2-m15-inc1-tbigvision",
                                  "augmix-n2-m15-tbigvision"])
def test_big_vision_spelling_takes_only_n_and_m(spec):
    with pytest.raises(ValueError, match="only n"):
        randaugment(spec, 224, 3)


def test_timm_spellings_keep_timm_semantics():
    """DeiT's spec stays timm's RandAugment with create_transform's hparams."""
    from timm.data.auto_augment import _RAND_INCREASING_TRANSFORMS, _RAND_TRANSFORMS

    deit = randaugment("rand-m9-mstd0.5-inc1", 224, 3)
    assert [op.name for op in deit.ops] == _RAND_INCREASING_TRANSFORMS
    assert all(op.prob == 0.5 and op.magnitude == 9 and op.magnitude_std == 0.5 for op in deit.ops)
    assert deit.ops[0].hparams["translate_const"] == int(224 * 0.45)
    plain = randaugment("rand-n2-m15-mmax15", 224, 3)
    assert [op.name for op in plain.ops] == _RAND_TRANSFORMS and plain.ops[0].prob == 0.5


def randaug_values(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "randaug" and value:
                yield value
            yield from randaug_values(value)
    elif isinstance(node, list):
        for value in node:
            yield from randaug_values(value)


def test_full_profile_spells_big_vision_randaug_with_its_own_op():
    """Every AugReg / S/16+ / i21k randaug of profiles/full.yaml is big_vision's op (tbigvision) at a
    magnitude big_vision configs use; only DeiT's row is timm's."""
    values = list(randaug_values(yaml.safe_load((REPO / "profiles" / "full.yaml").read_text())))
    timm_specs = [v for v in values if "tbigvision" not in v.split("-")]
    assert timm_specs == ["rand-m9-mstd0.5-inc1"]
    bv = [v for v in values if v not in timm_specs]
    assert {v for v in bv} == {"rand-n2-m0-tbigvision", "rand-n2-m10-tbigvision", "rand-n2-m15-tbigvision"}
    for v in bv:
        assert [op.name for op in randaugment(v, 224, 3).ops] == BV_OPS
