"""The ``input.backend: fast`` train-time pipeline: the same augmentation as the PIL path, cheaper per core.

Op chain (both backends): inception crop to ``S x S`` (``input.crop_sampler``: torchvision's
``RandomResizedCrop``, area 5-100 %, aspect 3/4-4/3, antialiased resize; or ``big_vision``: TF's box sampler
and bilinear resize without antialias, :mod:`dpnrepro.data.crop`) → left-right flip → timm RandAugment →
``value_range(-1, 1)``. The fast path draws every random number from the same generators, in the same
order, with the same samplers as the PIL path (:func:`dpnrepro.data.loader.build_transform`), so for one
``(index, seed)`` both pick the same crop box, flip and RandAugment ops/magnitudes/interpolations. What
differs is how pixels are computed:

* **Crop first, decode small.** The crop box is sampled from the image header (``Image.open`` is lazy).
  For a JPEG whose crop is at least ``2 S`` / ``4 S`` / ``8 S`` pixels on both sides, libjpeg decodes at
  1/2, 1/4 or 1/8 scale in the DCT domain (``Image.draft``), so the cropped region still has ≥ ``S`` px
  and is only ever *down*-sampled afterwards; the (now fractional) box is resampled exactly by PIL's
  ``resize(box=...)``. Approximation: the DCT-domain reduction replaces the first factor of the
  antialiased bilinear downscale (and PIL's draft mode decodes with libjpeg's fast IDCT): ~1-2 grey
  levels mean abs difference on a detailed photo, about what an exact box ``reduce()`` first would give.
  For ImageNet-sized photos (~500x375) this never triggers at S = 224 (no crop side reaches 448 px);
  it pays off on larger images. Not with ``crop_sampler: big_vision``: its resize does not antialias, so
  the window is decoded at full scale, as TF's ``decode_and_crop_jpeg`` does.
* **uint8 until the end.** Crop + antialiased bilinear resize run in torch's uint8 channels-last kernel,
  which reproduces PIL's ``resize(BILINEAR)`` to within rounding (mean abs diff ~0.01 grey levels;
  ``big_vision``: :func:`dpnrepro.data.crop.resize_bilinear`, TF's arithmetic, the same in both backends);
  flip and RandAugment operate on the 224 px uint8 image; one fused conversion to float in [-1, 1].
* **RandAugment's geometric ops and Sharpness via OpenCV.** ``Rotate``, ``ShearX/Y``,
  ``TranslateX/YRel`` are one ``cv2.warpAffine`` with PIL's exact matrix, pixel-centre convention,
  clamped-edge sampling and fill rule (a pixel whose source point lies outside the image gets the fill
  colour). Approximation: OpenCV's bicubic kernel uses a = -0.75, PIL's transform uses a = -1, and
  rounding differs (mean abs diff ≲ 1 grey level, see tests). ``Sharpness`` is PIL's 3x3 SMOOTH kernel
  (border pixels kept) blended with PIL's truncating blend. The photometric ops (AutoContrast,
  Equalize, Invert, Posterize, Solarize, SolarizeAdd, Color, Contrast, Brightness) call timm's PIL
  functions unchanged — they are already cheap at 224 px.

Inputs: a PIL image (then only the post-decode savings apply), raw bytes, a path, or a ``datasets``
``Image(decode=False)`` dict ``{"bytes": ..., "path": ...}`` (see :func:`undecoded`): only undecoded
inputs get the reduced-scale decode. Tiny images (e.g. 28 px Fashion-MNIST PNGs) take the same path;
there is simply nothing to gain from ``draft``.
"""

from __future__ import annotations

import io
import math
import random
from pathlib import Path

import numpy as np
import torch

from dpnrepro.data.crop import resize_bilinear, sample_distorted_box, torch_seeded_rng
from dpnrepro.errors import DatasetError

MODES = {1: "L", 3: "RGB"}
INCEPTION_SCALE = (0.05, 1.0)
INCEPTION_RATIO = (3 / 4, 4 / 3)


# --------------------------------------------------------------------------------------------- RandAugment
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


def _resample(kwargs) -> int:
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
    resample = _resample(kw)
    matrix = rotate_matrix(degrees, *arr.shape[:2])
    return arr.copy() if matrix is None else _affine(arr, matrix, resample, kw["fillcolor"])


def _shear_x(arr, factor, **kw):
    return _affine(arr, (1, factor, 0, 0, 1, 0), _resample(kw), kw["fillcolor"])


def _shear_y(arr, factor, **kw):
    return _affine(arr, (1, 0, 0, factor, 1, 0), _resample(kw), kw["fillcolor"])


def _translate_x_rel(arr, pct, **kw):
    return _affine(arr, (1, 0, pct * arr.shape[1], 0, 1, 0), _resample(kw), kw["fillcolor"])


def _translate_y_rel(arr, pct, **kw):
    return _affine(arr, (1, 0, 0, 0, 1, pct * arr.shape[0]), _resample(kw), kw["fillcolor"])


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


# ------------------------------------------------------------------------------------------ decode + crop
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's SOF marker without decoding; None if ``data`` is not a parsable JPEG."""
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    i, n = 2, len(data)
    while i + 9 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in _SOF:
            h, w = int.from_bytes(data[i + 5 : i + 7], "big"), int.from_bytes(data[i + 7 : i + 9], "big")
            return (w, h) if w > 0 and h > 0 else None
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return None


def inception_crop_params(height: int, width: int, scale=INCEPTION_SCALE, ratio=INCEPTION_RATIO,
                          sampler: str = "torchvision"):
    """(top, left, height, width) from torchvision's own ``RandomResizedCrop`` sampler, given only the
    image size (read from the JPEG header): the same torch RNG draws in the same order as the PIL path,
    so the same seed gives the same box (tested). ``sampler="big_vision"``: TF's sampler
    (:func:`dpnrepro.data.crop.sample_distorted_box`, its own aspect range 0.75-1.33; ``ratio`` unused)
    from a generator seeded by one torch draw, as :class:`dpnrepro.data.crop.InceptionCrop` does."""
    from torchvision.transforms import RandomResizedCrop

    if sampler == "big_vision":
        return sample_distorted_box(height, width, torch_seeded_rng(), area_range=scale)

    shape_only = torch.empty(1, 1, 1).expand(1, height, width)  # no pixels: the sampler reads the size
    return tuple(RandomResizedCrop.get_params(shape_only, list(scale), list(ratio)))


def _encoded(image) -> tuple[bytes | None, str, object]:
    """(bytes or None, name for errors, the input) for bytes / paths / ``datasets`` dicts / PIL images."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return None, getattr(image, "filename", "") or "<PIL image>", image
    where = "<bytes>"
    if isinstance(image, dict):
        where = image.get("path") or where
        image = image["bytes"] if image.get("bytes") is not None else image.get("path")
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image), where, image
    try:
        return Path(image).read_bytes(), str(image), image
    except OSError as exc:
        raise DatasetError(f"cannot read image {image}: {type(exc).__name__}: {exc}") from exc


def open_image(image):
    """A lazily opened PIL image from bytes, a path, a ``datasets`` dict, or a PIL image (returned as is)."""
    from PIL import Image, UnidentifiedImageError

    data, where, image = _encoded(image)
    if data is None:
        return image
    try:
        return Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError) as exc:
        raise DatasetError(f"cannot decode image {where}: {type(exc).__name__}: {exc}") from exc


def draft_scale(width: int, height: int, size: int) -> int:
    """The largest JPEG DCT scale (1, 2, 4, 8) at which a ``width x height`` crop still has >= ``size`` px
    on both sides."""
    for s in (8, 4, 2):
        if width >= size * s and height >= size * s:
            return s
    return 1


def _pil_pixels(im, mode: str, where: str, draft_box=None, size: int = 0) -> tuple[torch.Tensor, int]:
    """Decode a PIL image (at a reduced JPEG scale when ``draft_box`` allows) → uint8 HxWxC tensor, scale."""
    scale = 1
    try:
        if draft_box is not None and getattr(im, "format", None) == "JPEG":
            scale = draft_scale(draft_box[3], draft_box[2], size)
            if scale > 1:  # a no-op (returns None) when the image was already decoded
                w0 = im.size[0]
                im.draft(mode, (im.size[0] // scale, im.size[1] // scale))
                scale = max(1, round(w0 / im.size[0]))
        if im.mode != mode:
            im = im.convert(mode)
        arr = np.array(im)  # writable copy
    except (OSError, SyntaxError, ValueError) as exc:
        raise DatasetError(f"cannot decode image {where}: {type(exc).__name__}: {exc}") from exc
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return torch.from_numpy(arr), scale


def _convert_channels(pixels: torch.Tensor, channels: int) -> torch.Tensor:
    """Grey <-> RGB as PIL's ``convert`` does it (a stored grey JPEG in an RGB run, or the reverse)."""
    from PIL import Image

    if pixels.shape[2] == 1 and channels == 3:
        return pixels.expand(-1, -1, 3).contiguous()
    if pixels.shape[2] == 3 and channels == 1:
        return torch.from_numpy(np.asarray(Image.fromarray(pixels.numpy()).convert("L"))[:, :, None].copy())
    return pixels


def decode(image, mode: str, size: int, crop: bool = True, scale=INCEPTION_SCALE,
           sampler: str = "torchvision") -> tuple[torch.Tensor, tuple | None]:
    """Sample the inception crop (``sampler``: see :func:`inception_crop_params`) from the header, then
    decode as little as needed (never at reduced scale for ``big_vision``, whose resize does not antialias).

    Returns a uint8 HxWxC tensor and the crop box (top, left, height, width) in its pixel coordinates
    (fractional after a reduced-scale decode; None when ``crop`` is False). JPEG bytes at full scale go through ``torchvision.io.decode_jpeg``
    (libjpeg-turbo, same pixels as PIL, decoded straight into the tensor); JPEGs whose crop allows a
    1/2-1/8 DCT scale through PIL's ``draft``; everything else (PNG, PIL images) through PIL.
    """
    channels = 1 if mode == "L" else 3
    draft = sampler != "big_vision"
    if isinstance(image, (np.ndarray, torch.Tensor)):  # pre-decoded uint8 HxW(xC) pixels
        arr = np.asarray(image)
        pixels = torch.from_numpy(arr if arr.flags.writeable else arr.copy())  # memory-mapped stores are read-only
        pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
        if pixels.ndim == 3 and pixels.shape[2] != channels and pixels.dtype == torch.uint8:
            pixels = _convert_channels(pixels, channels)
        if pixels.dtype != torch.uint8 or pixels.ndim != 3 or pixels.shape[2] != channels:
            raise DatasetError(f"pre-decoded image must be uint8 HxWx{channels}, got {tuple(pixels.shape)} "
                               f"{pixels.dtype}")
        box = inception_crop_params(pixels.shape[0], pixels.shape[1], scale, sampler=sampler) if crop else None
        return pixels, box
    data, where, image = _encoded(image)
    wh = jpeg_size(data) if data is not None else None
    if wh is None:  # PIL input, or not a (parsable) JPEG
        im = image if data is None else open_image(data)
        box = inception_crop_params(im.size[1], im.size[0], scale, sampler=sampler) if crop else None
        pixels, scale = _pil_pixels(im, mode, where, box if draft else None, size)
    else:
        box = inception_crop_params(wh[1], wh[0], scale, sampler=sampler) if crop else None
        if box is not None and draft and draft_scale(box[3], box[2], size) > 1:
            pixels, scale = _pil_pixels(open_image(data), mode, where, box, size)
        else:
            from torchvision.io import ImageReadMode, decode_jpeg

            try:
                chw = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                  mode=ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB)
            except RuntimeError as exc:
                raise DatasetError(f"cannot decode image {where}: corrupt JPEG: {exc}") from exc
            pixels, scale = chw.permute(1, 2, 0), 1
            if tuple(pixels.shape[:2]) != (wh[1], wh[0]):
                raise DatasetError(f"cannot decode image {where}: header says {wh[0]}x{wh[1]}, "
                                   f"decoded {pixels.shape[1]}x{pixels.shape[0]}")
    if box is not None and scale > 1:  # the box in reduced-scale pixels: fractional, resampled exactly
        box = tuple(v / scale for v in box)
    return pixels, box


def resized_crop(pixels: torch.Tensor, box: tuple[int, int, int, int], size: int,
                 antialias: bool = True) -> np.ndarray:
    """Crop ``box`` = (top, left, height, width) of a uint8 HxWxC tensor and resize to ``size x size`` with
    antialiased bilinear (torch's uint8 channels-last kernel; matches PIL ``resize(BILINEAR)`` up to
    rounding) → contiguous uint8 HxWxC array. A fractional box (after a reduced-scale decode) goes
    through PIL's ``resize(box=...)``, which resamples sub-pixel boxes exactly. ``antialias=False``:
    TF's bilinear resize (:func:`dpnrepro.data.crop.resize_bilinear`, integer boxes only)."""
    t, l, h, w = box
    if not antialias:
        return resize_bilinear(pixels[t : t + h, l : l + w].numpy(), size)
    if not all(isinstance(v, int) for v in box):
        from PIL import Image

        arr = pixels.numpy()
        img = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
        out = np.asarray(img.resize((size, size), Image.Resampling.BILINEAR, box=(l, t, l + w, t + h)))
        return out[:, :, None] if out.ndim == 2 else out
    crop = pixels[t : t + h, l : l + w]
    if (h, w) == (size, size):
        return crop.contiguous().numpy()
    x = crop.permute(2, 0, 1)[None].contiguous(memory_format=torch.channels_last)
    y = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return np.ascontiguousarray(y[0].permute(1, 2, 0).numpy())


def to_tensor(arr: np.ndarray) -> torch.Tensor:
    """uint8 HxWxC → float32 CxHxW in [-1, 1] (``x / 255 * 2 - 1``, i.e. ToDtype(scale) + Normalize(.5, .5))."""
    x = np.ascontiguousarray(arr.transpose(2, 0, 1)).astype(np.float32)
    x *= np.float32(2.0 / 255.0)
    x -= np.float32(1.0)
    return torch.from_numpy(x)


# -------------------------------------------------------------------------------------------- the transform
class FastTrainTransform:
    """Train-time transform of ``input.backend: fast``: image (PIL, bytes, path or ``datasets`` dict) →
    float tensor (C, S, S) in [-1, 1]. Randomness: torch's global RNG for crop + flip, Python's ``random``
    for RandAugment — exactly the generators (and the order) of the PIL path, so
    ``TransformedSplit``'s per-example seeding makes it deterministic per ``(index, seed)``.
    ``crop_sampler``: ``torchvision`` or ``big_vision`` (``input.crop_sampler``). Without inception crop,
    ``resize_small | central_crop`` or, with ``squash`` (``input.squash``), the whole frame resized to ``S x S``."""

    def __init__(self, size: int, channels: int, *, inception_crop: bool = True, flip: bool = True,
                 randaug: str = "", crop_min_area: float = INCEPTION_SCALE[0], crop_sampler: str = "torchvision",
                 squash: bool = False, uint8: bool = False):
        from torchvision.transforms import v2

        from dpnrepro.data.crop import resize_ops

        self.size, self.channels, self.mode = size, channels, MODES[channels]
        self.flip = flip
        self.crop = inception_crop or None
        self.scale = (crop_min_area, 1.0)
        self.crop_sampler = crop_sampler
        self.resize_center = None if inception_crop else v2.Compose(resize_ops(size, squash=squash))
        self.randaug = randaugment(randaug, size, channels) if randaug else None
        self.uint8 = uint8

    def __call__(self, image) -> torch.Tensor:
        import cv2

        if self.crop is not None:
            pixels, box = decode(image, self.mode, self.size, scale=self.scale, sampler=self.crop_sampler)
            arr = resized_crop(pixels, box, self.size, antialias=self.crop_sampler != "big_vision")
        else:
            from PIL import Image

            pixels, _ = decode(image, self.mode, self.size, crop=False)
            arr = pixels.numpy()
            img = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr)
            arr = np.asarray(self.resize_center(img))
            arr = arr[:, :, None] if arr.ndim == 2 else arr
        if self.flip and torch.rand(1) < 0.5:  # v2.RandomHorizontalFlip's draw
            arr = cv2.flip(arr, 1)
            arr = arr[:, :, None] if arr.ndim == 2 else arr
        if self.randaug is not None:
            for op in self.randaug.choose():
                arr = apply_op(op, arr)
        if self.uint8:  # scaled on the device by dpnrepro.training.step.unit_range
            return torch.from_numpy(arr.transpose(2, 0, 1).copy())
        return to_tensor(arr)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(size={self.size}, channels={self.channels}, "
                f"inception_crop={self.crop is not None}, crop_sampler={self.crop_sampler}, flip={self.flip}, "
                f"randaug={self.randaug})")


def undecoded(ds):
    """``ds`` with its ``image`` column left as encoded bytes (``datasets.Image(decode=False)``), so the fast
    transform sees the JPEG and can decode at reduced scale; PIL images work too, just without that.
    A :class:`~dpnrepro.data.source_index.SourceSplit` gives file paths; anything else (a
    :class:`~dpnrepro.data.pixel_store.PixelStoreSplit`) is returned as it is."""
    import datasets

    if hasattr(ds, "undecoded"):
        return ds.undecoded()
    return ds.cast_column("image", datasets.Image(decode=False)) if isinstance(ds, datasets.Dataset) else ds
