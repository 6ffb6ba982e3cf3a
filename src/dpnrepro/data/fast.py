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
* **RandAugment on the uint8 array** (:func:`dpnrepro.data.randaugment.apply_op`): Rotate and ShearX/Y
  through OpenCV with PIL's matrix and fill rule (approximation: OpenCV's bicubic kernel, mean abs diff
  ≲ 1 grey level), Sharpness, Brightness and the LUT ops in NumPy, the rest through the op's PIL function;
  details in that module.

Inputs: a PIL image (then only the post-decode savings apply), raw bytes, a path, or a ``datasets``
``Image(decode=False)`` dict ``{"bytes": ..., "path": ...}`` (see :func:`undecoded`): only undecoded
inputs get the reduced-scale decode. Tiny images (e.g. 28 px Fashion-MNIST PNGs) take the same path;
there is simply nothing to gain from ``draft``.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from dpnrepro.data.crop import resize_bilinear, sample_distorted_box, torch_seeded_rng
from dpnrepro.data.randaugment import apply_op, randaugment
from dpnrepro.errors import DatasetError

MODES = {1: "L", 3: "RGB"}
INCEPTION_SCALE = (0.05, 1.0)
INCEPTION_RATIO = (3 / 4, 4 / 3)


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


def encoded_bytes(image) -> tuple[bytes | None, str, object]:
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

    data, where, image = encoded_bytes(image)
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
    data, where, image = encoded_bytes(image)
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
            if arr.shape[:2] != (self.size, self.size):  # of an S x S image both resizes are the image itself
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
