"""Seeded RandAugment (the ``input.randaug`` transform) and its ops on uint8 arrays.

* :func:`randaugment` builds it from a spec, timm's syntax or big_vision's ``randaug(n, m)`` (its
  docstring lists big_vision's ops and arguments); :class:`SeededRandAugment` draws the op choice from
  Python's ``random``. The ``pil`` backend calls it on PIL images.
* :func:`apply_op` runs one chosen timm ``AugmentOp`` on a uint8 HxWxC array, drawing from Python's
  ``random`` exactly as ``op(img)`` does (:func:`op_args`: the level arguments). The ``fast`` backend
  (:mod:`dpnrepro.data.fast`) calls it.

Where :func:`apply_op` leaves PIL (:data:`FAST_OPS`): ``Rotate`` and ``ShearX/Y`` are one
``cv2.warpAffine`` with PIL's exact matrix, pixel-centre convention, clamped-edge sampling and fill rule (a
pixel whose source point lies outside the image gets the fill colour). Approximation: OpenCV's bicubic
kernel uses a = -0.75, PIL's transform uses a = -1, and rounding differs (mean abs diff ≲ 1 grey level, see
tests). ``Sharpness`` is PIL's 3x3 SMOOTH kernel (border pixels kept) blended with PIL's truncating blend;
Invert, Posterize, Solarize, SolarizeAdd and Brightness are exact NumPy. The rest (AutoContrast, Equalize,
Color, Contrast, the translations, Cutout) call the op's own PIL function, timm's or big_vision's swapped
in — cheap at 224 px.
"""

from __future__ import annotations

import math
import random

import numpy as np


class SeededRandAugment:
    """timm's ``RandAugment`` with the op choice drawn from Python's ``random`` instead of NumPy's global
    RNG (timm uses ``np.random.choice``, which ``TransformedSplit`` does not seed — the op choice was not a
    function of the per-example seed). Same distribution: uniform with replacement (timm's
    ``replace=choice_weights is None``), weighted without replacement when weights are given."""

    def __init__(self, ra):
        self.ops, self.num_layers, self.choice_weights = list(ra.ops), ra.num_layers, ra.choice_weights

    def choose(self) -> list:
        if self.choice_weights is None:
            return random.choices(self.ops, k=self.num_layers)
        rng = np.random.default_rng(random.getrandbits(64))
        idx = rng.choice(len(self.ops), self.num_layers, replace=False, p=self.choice_weights)
        return [self.ops[i] for i in idx]

    def __call__(self, img):
        for op in self.choose():
            img = op(img)
        return img

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.num_layers}, ops={[op.name for op in self.ops]})"


def randaugment(spec: str, size: int, channels: int) -> SeededRandAugment:
    """The ``input.randaug`` transform, with seeded op choice (:class:`SeededRandAugment`). Two spellings:

    **big_vision's** ``randaug(n, m)`` (AugReg, appendix C) is ``rand-n{n}-m{m}-tbigvision`` (only ``n`` and
    ``m``). It rebuilds ``distort_image_with_randaugment`` (big_vision ``pp/archive/autoaugment.py``, commit
    0127fb6) from timm ``AugmentOp`` objects: per layer one of big_vision's 16 ops, uniformly with
    replacement, **always applied** (big_vision draws a probability but never passes it on; timm's default
    is 0.5), at level ``m`` with **no cap** (timm clips at 10 without ``mmax``), random sign for Rotate /
    Shear / Translate, fill 128, nearest-neighbour resampling (the tensorflow_addons default big_vision's
    rotate / translate / transform use). Arguments at ``l = m / 10`` (effective values, after TF's uint8
    arithmetic):

    ===============================  =================================================================
    AutoContrast, Equalize, Invert   no argument
    Rotate / ShearX,Y                ±30 l degrees / ±0.3 l
    TranslateX,Y                     ±100 l px (timm's absolute ``TranslateX``, not ``TranslateXRel``)
    Cutout (not a timm op)           128-filled square ``[c - p, c + p)`` clipped to the image, centre
                                     uniform, ``p = int(40 l)``
    Posterize                        keep ``8 - min(7, (8 - int(4 l)) mod 256)`` bits: TF clamps the
                                     uint8 shift to 7, so m 0 keeps 1 bit (PIL's 0 bits: black)
    Solarize                         threshold ``int(256 l) mod 256``: the Python int is cast to uint8
                                     (big_vision issue #110), so m 10 inverts every pixel and m 15 is a
                                     solarize at 128 (timm: ``min(256, .)``, a no-op at m ≥ 10)
    SolarizeAdd                      ``+int(110 l)`` below 128 (timm caps it at 128: 165 at m 15)
    Color, Contrast, Brightness,     factor ``1.8 l + 0.1``; Contrast blends towards the constant grey
    Sharpness                        ``min(255, H W / 256)`` (196 at 224 px: big_vision's "mean" is the
                                     histogram's count / 256), not towards the image mean as PIL does
    ===============================  =================================================================

    Translate and Cutout constants are absolute pixels in big_vision (run at 224 px in AugReg); here they
    scale with ``size / 224``. Posterize, Solarize, SolarizeAdd (level functions), Contrast and Cutout
    (image functions) are timm ops with big_vision's function swapped in; :func:`apply_op` calls the same
    attributes, so the fast path runs them unchanged. Left as is (tests/test_randaug_bigvision.py): pixel
    rounding in Color (TF's grey is ``trunc(255.5 g)``, PIL's L rounds) and Sharpness (TF truncates the
    smoothed image, PIL rounds), ≤ 2 grey levels at m ≤ 15, and AutoContrast (float64 vs float32 LUT),
    ≤ 1; geometric ops sample PIL's pixel-centre grid, tfa's the integer grid (shears are offset by
    0.15 l px, rotations and translations agree up to rounding ties); big_vision handles RGB only.

    **Any other spec** is timm's own syntax (DeiT's ``rand-m9-mstd0.5-inc1``), with the hparams of timm's
    ``create_transform`` (``translate_const = int(0.45 size)``, fill 128).
    """
    import re

    from PIL import Image
    from timm.data.auto_augment import AugmentOp, RandAugment, rand_augment_transform

    sections = spec.split("-")
    if "tbigvision" not in sections[1:]:
        hparams = {"translate_const": int(size * 0.45), "img_mean": (128,) * channels}
        return SeededRandAugment(rand_augment_transform(spec, hparams))

    nm = {"n": 2, "m": 10}  # big_vision's get_randaug(num_layers=2, magnitude=10) defaults
    for s in sections[1:]:
        match = re.fullmatch(r"([nm])(\d+)", s)
        if match is not None:
            nm[match[1]] = int(match[2])
        elif s != "tbigvision" or sections[0] != "rand":
            raise ValueError(f"randaug {spec!r}: big_vision's randaug takes only n (layers) and m (magnitude), "
                             "spelled rand-n<N>-m<M>-tbigvision")
    scale = size / 224
    hparams = {"translate_const": 100 * scale, "cutout_const": 40 * scale, "img_mean": (128,) * channels,
               "interpolation": Image.Resampling.NEAREST, "magnitude_max": float("inf")}

    def posterize_level(level, _hparams):
        return (8 - min(7, (8 - int(level / 10 * 4)) % 256),)

    def solarize_level(level, _hparams):
        return (int(level / 10 * 256) % 256,)

    def solarize_add_level(level, _hparams):
        return (int(level / 10 * 110),)

    def cutout_level(level, hparams):
        return (int(level / 10 * hparams["cutout_const"]),)

    def contrast(img, factor, **_):
        grey = int(min(255.0, img.width * img.height / 256))
        return Image.blend(Image.new(img.mode, img.size, (grey,) * len(img.getbands())), img, factor)

    def cutout(img, pad, fillcolor=(128,), **_):
        cy, cx = random.randrange(img.height), random.randrange(img.width)
        if pad <= 0:
            return img
        img = img.copy()
        box = (max(0, cx - pad), max(0, cy - pad), min(img.width, cx + pad), min(img.height, cy + pad))
        img.paste(tuple(fillcolor)[: len(img.getbands())], box)
        return img

    swap = {"Posterize": ("level_fn", posterize_level), "Solarize": ("level_fn", solarize_level),
            "SolarizeAdd": ("level_fn", solarize_add_level), "Contrast": ("aug_fn", contrast)}
    ops = []
    for name in ["AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "Color", "Contrast",
                 "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateX", "TranslateY", "Cutout", "SolarizeAdd"]:
        op = AugmentOp("Invert" if name == "Cutout" else name, prob=1.0, magnitude=nm["m"], hparams=hparams)
        if name == "Cutout":
            op.name, op.aug_fn, op.level_fn = name, cutout, cutout_level
        elif name in swap:
            setattr(op, *swap[name])
        ops.append(op)
    return SeededRandAugment(RandAugment(ops, nm["n"]))


def resample_filter(kwargs) -> int:
    """timm's ``_interpolation``: one ``random.choice`` when the op has a tuple of filters."""
    from PIL import Image

    r = kwargs.get("resample", Image.Resampling.BICUBIC)
    return random.choice(r) if isinstance(r, (list, tuple)) else r


def _affine(arr: np.ndarray, matrix, resample: int, fill) -> np.ndarray:
    """PIL ``Image.transform(size, AFFINE, matrix, resample, fillcolor)`` on a uint8 HxW(xC) array.

    PIL samples output pixel (x, y) at input point ``A (x + .5, y + .5) + t`` (continuous coordinates),
    interpolates at that point minus .5 with clamped neighbours, and writes the fill colour where the
    point falls outside ``[0, W) x [0, H)``.
    """
    import cv2
    from PIL import Image

    a, b, c, d, e, f = matrix
    m = np.array([[a, b, c + 0.5 * (a + b) - 0.5], [d, e, f + 0.5 * (d + e) - 0.5]], dtype=np.float64)
    h, w = arr.shape[:2]
    interp = {Image.Resampling.NEAREST: cv2.INTER_NEAREST, Image.Resampling.BILINEAR: cv2.INTER_LINEAR}.get(
        resample, cv2.INTER_CUBIC)
    flags = cv2.WARP_INVERSE_MAP
    out = cv2.warpAffine(arr, m, (w, h), flags=interp | flags, borderMode=cv2.BORDER_REPLICATE)
    # Inside test on the continuous point: nearest-neighbour of (point - .5) lands in the image
    # iff the point is in [0, W) (ties at exactly .5 aside).
    inside = cv2.warpAffine(np.ones((h, w), np.uint8), m, (w, h), flags=cv2.INTER_NEAREST | flags,
                            borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    if out.ndim == 3 and arr.ndim == 3 and out.shape[2] != arr.shape[2]:  # pragma: no cover - cv2 quirk
        out = out.reshape(arr.shape)
    if arr.ndim == 3 and out.ndim == 2:
        out = out[:, :, None]
    outside = (inside == 0)[:, :, None] if out.ndim == 3 else inside == 0
    np.copyto(out, np.asarray(fill[: out.shape[2]] if out.ndim == 3 else fill[0], np.uint8), where=outside)
    return out


def rotate_matrix(degrees: float, height: int, width: int) -> tuple | None:
    """PIL ``Image.rotate``'s inverse affine matrix (a, b, c, d, e, f) about the image centre; None at 0 degrees."""
    angle = degrees % 360.0
    if angle == 0:
        return None
    cx, cy = width / 2.0, height / 2.0
    rad = -math.radians(angle)
    a, b = round(math.cos(rad), 15), round(math.sin(rad), 15)
    d, e = round(-math.sin(rad), 15), round(math.cos(rad), 15)
    return a, b, a * -cx + b * -cy + cx, d, e, d * -cx + e * -cy + cy


def _rotate(arr, degrees, **kw):
    resample = resample_filter(kw)
    matrix = rotate_matrix(degrees, *arr.shape[:2])
    return arr.copy() if matrix is None else _affine(arr, matrix, resample, kw["fillcolor"])


def _shear_x(arr, factor, **kw):
    return _affine(arr, (1, factor, 0, 0, 1, 0), resample_filter(kw), kw["fillcolor"])


def _shear_y(arr, factor, **kw):
    return _affine(arr, (1, 0, 0, factor, 1, 0), resample_filter(kw), kw["fillcolor"])


_SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32) / 13.0


def _sharpness(arr, factor, **_):
    """``ImageEnhance.Sharpness``: blend(SMOOTH-filtered, image, factor); PIL leaves border pixels unfiltered."""
    import cv2

    deg = cv2.filter2D(arr, -1, _SMOOTH, borderType=cv2.BORDER_REPLICATE)
    if deg.ndim < arr.ndim:
        deg = deg[:, :, None]
    deg[0], deg[-1], deg[:, 0], deg[:, -1] = arr[0], arr[-1], arr[:, 0], arr[:, -1]
    dg = deg.astype(np.float32)
    # PIL's Image.blend truncates toward zero (and clips when extrapolating).
    return np.clip(dg + np.float32(factor) * (arr.astype(np.float32) - dg), 0, 255).astype(np.uint8)


def _invert(arr, **_):
    return 255 - arr


def _posterize(arr, bits_to_keep, **_):
    if bits_to_keep >= 8:
        return arr
    return arr & np.uint8(~(2 ** (8 - bits_to_keep) - 1) & 0xFF)


def _solarize(arr, thresh, **_):
    return np.where(arr < thresh, arr, 255 - arr)


def _solarize_add(arr, add, thresh=128, **_):
    return np.where(arr < thresh, np.minimum(arr.astype(np.int16) + add, 255).astype(np.uint8), arr)


def _brightness(arr, factor, **_):
    # ImageEnhance.Brightness = blend(black, image, factor), truncating and clipping like PIL's blend.
    return np.clip(arr.astype(np.float32) * np.float32(factor), 0, 255).astype(np.uint8)


# Ops computed in OpenCV / NumPy (exact for the LUT ops, Sharpness and Brightness; see _affine for the
# geometric ones). The rest — AutoContrast, Equalize, Color, Contrast and the translations (PIL's
# pure-translation transform is as cheap as a warp here, and exact) — call timm's PIL functions.
FAST_OPS = {"Rotate": _rotate, "ShearX": _shear_x, "ShearY": _shear_y, "Sharpness": _sharpness,
            "Invert": _invert, "Posterize": _posterize, "Solarize": _solarize, "SolarizeAdd": _solarize_add,
            "Brightness": _brightness}


def op_args(op) -> tuple | None:
    """The level arguments of one timm ``AugmentOp`` call, drawn from Python ``random`` as ``op(img)`` draws
    them (probability, magnitude noise, random sign); None when the op is skipped. Draws made inside the
    op's image function (timm's filter choice, Cutout's centre) are not made here."""
    if op.prob < 1.0 and random.random() > op.prob:
        return None
    magnitude = op.magnitude
    if op.magnitude_std > 0:
        magnitude = random.uniform(0, magnitude) if op.magnitude_std == float("inf") else random.gauss(
            magnitude, op.magnitude_std)
    magnitude = max(0.0, min(magnitude, op.magnitude_max or 10.0))  # timm's _LEVEL_DENOM
    return op.level_fn(magnitude, op.hparams) if op.level_fn is not None else ()


def apply_op(op, arr: np.ndarray) -> np.ndarray:
    """One timm ``AugmentOp`` on a uint8 array, consuming Python ``random`` exactly as ``op(img)`` does."""
    args = op_args(op)
    if args is None:
        return arr
    fast = FAST_OPS.get(op.name)
    if fast is not None:
        return fast(arr, *args, **op.kwargs)
    from PIL import Image

    squeeze = arr.ndim == 3 and arr.shape[2] == 1
    img = Image.fromarray(arr[:, :, 0] if squeeze else arr)
    out = np.asarray(op.aug_fn(img, *args, **op.kwargs))
    return out[:, :, None] if squeeze else out
