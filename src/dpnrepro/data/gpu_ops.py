"""RandAugment ops on a batch of uint8 images on any device (``input.backend: gpu``, :mod:`dpnrepro.data.gpu`).

Each op takes ``x`` uint8 (n, C, H, W) and, per image, the level arguments and extra draws a worker drew
(:func:`dpnrepro.data.gpu.draw_op`), and computes what the CPU path computes
(:func:`dpnrepro.data.randaugment.apply_op`, which calls PIL / timm / OpenCV), with the same integer and
float32 arithmetic where PIL's is known:

================================  ====================================================================
Invert, Posterize, Solarize,      exact (integer LUT arithmetic)
SolarizeAdd, Cutout
Equalize, AutoContrast            exact: per-image-and-channel histogram, PIL's LUT (integers; float64
                                  for AutoContrast's scale, as Python computes it)
Brightness, Color, Contrast       PIL's ``Image.blend`` in float32, truncated; Color's grey is PIL's
(both spellings)                  ``L = (19595 R + 38470 G + 7471 B + 2^15) >> 16``; timm's Contrast
                                  blends towards ``int(mean(L) + .5)``, big_vision's towards a constant
Sharpness                         PIL's SMOOTH 3x3 (weights 1, centre 5, / 13) rounded, borders kept,
                                  blended as above; the filter's float sum order differs from OpenCV's
Rotate, ShearX/Y, TranslateX/Y,   PIL's affine map: nearest neighbour in 16.16 fixed point (a pure shift in
TranslateX/YRel                   float64), as ``affine_fixed`` / ``ImagingScaleAffine``; bilinear / bicubic
                                  (timm's own specs) as ``bilinear_filter8`` / ``bicubic_filter8``: float64,
                                  clamped neighbours, PIL's a = -1 cubic, truncated; the fill colour where
                                  the source point is outside the image
================================  ====================================================================

Measured on the same uint8 inputs (tests/test_gpu_input.py, real photos, 12 draws per op): every op of
big_vision's RandAugment (``rand-n2-m15-tbigvision``) and of timm's own specs (DeiT's ``rand-m9-mstd0.5-inc1``,
bilinear / bicubic geometric ops) is **bit-exact against PIL** (timm's op on a PIL image). Against the ``fast``
CPU path, whose geometric ops are OpenCV approximations of PIL's, Rotate differs on ~0.1 % of the pixels
(nearest neighbour) and Rotate / Shear by <= 6 grey levels on ~40 % of them (bilinear / bicubic); every other
op is exact there too.
"""

from __future__ import annotations

import math

import torch

from dpnrepro.errors import UserError

GEOMETRIC = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"}

def device_op_name(op) -> str:
    """The device op computing timm ``AugmentOp`` ``op`` (by its image function: timm's or one of
    :func:`dpnrepro.data.randaugment.randaugment`'s big_vision functions); a one-line error for others."""
    import timm.data.auto_augment as aa

    qualname = getattr(op.aug_fn, "__qualname__", "")
    if qualname == "randaugment.<locals>.contrast":
        return "ContrastGrey"
    if qualname == "randaugment.<locals>.cutout":
        return "Cutout"
    by_fn = {aa.auto_contrast: "AutoContrast", aa.equalize: "Equalize", aa.invert: "Invert", aa.rotate: "Rotate",
             aa.posterize: "Posterize", aa.solarize: "Solarize", aa.solarize_add: "SolarizeAdd",
             aa.color: "Color", aa.contrast: "ContrastMean", aa.brightness: "Brightness",
             aa.sharpness: "Sharpness", aa.shear_x: "ShearX", aa.shear_y: "ShearY",
             aa.translate_x_abs: "TranslateX", aa.translate_y_abs: "TranslateY",
             aa.translate_x_rel: "TranslateXRel", aa.translate_y_rel: "TranslateYRel"}
    name = by_fn.get(op.aug_fn)
    if name is None:
        raise UserError(f"RandAugment op {op.name} has no device implementation (input.backend gpu); "
                        "use input.backend fast for this recipe")
    return name


def _per_image(values, x: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """A (n, 1, 1, 1) tensor of per-image scalars on ``x``'s device."""
    return torch.tensor(values, dtype=dtype, device=x.device).view(-1, 1, 1, 1)


def _lut(x: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Per-image-and-channel look-up: ``lut`` (n, C, 256) applied to uint8 ``x`` (n, C, H, W)."""
    n, c, h, w = x.shape
    return lut.to(torch.uint8).gather(2, x.reshape(n, c, h * w).long()).view(n, c, h, w)


def _blend(degenerate: torch.Tensor, x: torch.Tensor, factors) -> torch.Tensor:
    """PIL's ``Image.blend(degenerate, x, factor)``: float32 ``d + f (x - d)``, clipped, truncated."""
    f = _per_image(factors, x)
    return (degenerate + f * (x.float() - degenerate)).clamp_(0, 255).trunc_().to(torch.uint8)


def _grey(x: torch.Tensor) -> torch.Tensor:
    """PIL's RGB → L (integer weights, rounded), as int64 (n, 1, H, W); grey images as they are."""
    if x.shape[1] == 1:
        return x.long()
    r, g, b = x.long().unbind(1)
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16)[:, None]


def _histogram(x: torch.Tensor) -> torch.Tensor:
    """(n, C, 256) int64 counts of every image and channel (``bincount``: deterministic on CUDA)."""
    n, c = x.shape[:2]
    offsets = torch.arange(n * c, device=x.device).view(n, c, 1) * 256
    flat = (x.reshape(n, c, -1).long() + offsets).reshape(-1)
    return torch.bincount(flat, minlength=n * c * 256).view(n, c, 256)


def invert(x, params):
    return 255 - x


def posterize(x, params):
    masks = [0xFF if bits >= 8 else ~(2 ** (8 - bits) - 1) & 0xFF for (bits,), _ in params]
    return x & _per_image(masks, x, torch.uint8)


def solarize(x, params):
    thresh = _per_image([t for (t,), _ in params], x, torch.int32)
    return torch.where(x.int() < thresh, x, 255 - x)


def solarize_add(x, params):
    add = _per_image([a for (a,), _ in params], x, torch.int32)
    return torch.where(x < 128, (x.int() + add).clamp_(max=255).to(torch.uint8), x)


def brightness(x, params):
    return _blend(torch.zeros((), device=x.device), x, [f for (f,), _ in params])


def color(x, params):
    return _blend(_grey(x).float(), x, [f for (f,), _ in params])


def contrast_grey(x, params):
    """big_vision's Contrast: towards the constant ``min(255, H W / 256)`` (randaugment.py's randaugment)."""
    grey = float(int(min(255.0, x.shape[2] * x.shape[3] / 256)))
    return _blend(torch.full((), grey, device=x.device), x, [f for (f,), _ in params])


def contrast_mean(x, params):
    """timm / PIL's ``ImageEnhance.Contrast``: towards ``int(mean(L) + 0.5)`` (in integers: the float
    rounding of PIL's mean is far below the 1 / (2 H W) that separates it from a .5 boundary)."""
    grey = _grey(x)
    count = grey[0].numel()
    level = torch.div(2 * grey.sum(dim=(1, 2, 3)) + count, 2 * count, rounding_mode="floor")
    degenerate = level.float().view(-1, 1, 1, 1)
    return _blend(degenerate, x, [f for (f,), _ in params])


def sharpness(x, params):
    """PIL's ``ImageEnhance.Sharpness``: blend(SMOOTH-filtered with border pixels kept, x, factor)."""
    n, c, h, w = x.shape
    kernel = torch.tensor([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=torch.float32, device=x.device) / 13.0
    smooth = torch.nn.functional.conv2d(x.float().reshape(n * c, 1, h, w), kernel.view(1, 1, 3, 3))
    degenerate = x.float()
    degenerate[:, :, 1:-1, 1:-1] = smooth.round_().clamp_(0, 255).view(n, c, h - 2, w - 2)
    return _blend(degenerate, x, [f for (f,), _ in params])


def equalize(x, params):
    """PIL's ``ImageOps.equalize``: LUT ``(step // 2 + #pixels below v) // step``,
    ``step = (#pixels - #pixels in the highest used bin) // 255``; the identity when step is 0 or one bin is used."""
    hist = _histogram(x)
    used = hist > 0
    last = 255 - used.flip(-1).int().argmax(-1, keepdim=True)
    step = (hist.sum(-1, keepdim=True) - hist.gather(-1, last)) // 255
    below = hist.cumsum(-1) - hist
    lut = (step // 2 + below) // step.clamp(min=1)
    identity = torch.arange(256, device=x.device).expand_as(lut)
    keep = (used.sum(-1, keepdim=True) <= 1) | (step == 0)
    return _lut(x, torch.where(keep, identity, lut.clamp(max=255)))


def auto_contrast(x, params):
    """PIL's ``ImageOps.autocontrast`` (no cutoff): LUT ``int(v * 255 / (hi - lo) - lo * scale)`` clipped,
    in float64; the identity when hi <= lo."""
    lo = x.amin(dim=(2, 3)).double().unsqueeze(-1)
    hi = x.amax(dim=(2, 3)).double().unsqueeze(-1)
    scale = torch.full_like(lo, 255.0) / (hi - lo).clamp(min=1)  # a true division (255.0 / t multiplies by 1 / t)
    v = torch.arange(256, dtype=torch.float64, device=x.device)
    lut = (v * scale + (-lo * scale)).trunc().clamp(0, 255)
    return _lut(x, torch.where(hi <= lo, v.expand_as(lut), lut).long())


def cutout(x, params):
    """big_vision's Cutout: a ``fill`` square ``[c - pad, c + pad)`` clipped to the image; pad <= 0: none."""
    n, c, h, w = x.shape
    pads = _per_image([p for (p,), _ in params], x, torch.int64).view(-1, 1, 1)
    cy = _per_image([e["centre"][0] for _, e in params], x, torch.int64).view(-1, 1, 1)
    cx = _per_image([e["centre"][1] for _, e in params], x, torch.int64).view(-1, 1, 1)
    ys = torch.arange(h, device=x.device).view(1, -1, 1)
    xs = torch.arange(w, device=x.device).view(1, 1, -1)
    inside = (ys >= cy - pads) & (ys < cy + pads) & (xs >= cx - pads) & (xs < cx + pads) & (pads > 0)
    return _fill(x, inside[:, None], params)


def _fill(x: torch.Tensor, where: torch.Tensor, params) -> torch.Tensor:
    """``x`` with each image's fill colour (``extra["fill"]``, one value per channel) where ``where`` holds."""
    c = x.shape[1]
    fill = torch.tensor([(tuple(e["fill"]) * c)[:c] for _, e in params], dtype=torch.uint8,
                        device=x.device).view(-1, c, 1, 1)
    return torch.where(where, fill, x)


def _matrix(name: str, args, h: int, w: int) -> tuple | None:
    """PIL's inverse affine matrix of a geometric op (None: the identity, returned unchanged)."""
    from dpnrepro.data.randaugment import rotate_matrix

    (v,) = args
    if name == "Rotate":
        return rotate_matrix(v, h, w)
    return {"ShearX": (1, v, 0, 0, 1, 0), "ShearY": (1, 0, 0, v, 1, 0), "TranslateX": (1, 0, v, 0, 1, 0),
            "TranslateY": (1, 0, 0, 0, 1, v), "TranslateXRel": (1, 0, v * w, 0, 1, 0),
            "TranslateYRel": (1, 0, 0, 0, 1, v * h)}[name]


def _fixed_point_coords(mats, h: int, w: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """PIL's ``affine_fixed``: the source pixel of every output pixel in 16.16 fixed point, each
    coefficient rounded once (``floor(v * 65536 + .5)``), the half-pixel offset folded into the constant."""

    def fix(v: float) -> int:
        return math.floor(v * 65536.0 + 0.5)

    coef = torch.tensor([[fix(a), fix(b), fix(c + a * 0.5 + b * 0.5), fix(d), fix(e), fix(f + d * 0.5 + e * 0.5)]
                         for a, b, c, d, e, f in mats], dtype=torch.int64, device=device).view(-1, 6, 1, 1)
    ys = torch.arange(h, dtype=torch.int64, device=device).view(1, -1, 1)
    xs = torch.arange(w, dtype=torch.int64, device=device).view(1, 1, -1)
    xx = coef[:, 2] + ys * coef[:, 1] + xs * coef[:, 0]
    yy = coef[:, 5] + ys * coef[:, 4] + xs * coef[:, 3]
    return torch.div(xx, 65536, rounding_mode="floor"), torch.div(yy, 65536, rounding_mode="floor")


def _cubic(v1, v2, v3, v4, d):
    """PIL's ``BICUBIC`` macro (a = -1), its operation order in float64."""
    p2 = -v1 + v3
    p3 = 2 * (v1 - v2) + v3 - v4
    p4 = -v1 + v2 - v3 + v4
    return v2 + d * (p2 + d * (p3 + d * p4))


def _filtered(src: torch.Tensor, sx: torch.Tensor, sy: torch.Tensor, bicubic: bool) -> torch.Tensor:
    """PIL's ``bilinear_filter8`` / ``bicubic_filter8`` of uint8 ``src`` (n, C, H, W) at the source points
    ``(sx, sy)`` (n, H, W): at the point minus .5, neighbours clamped to the image, float64, truncated."""
    n, c, h, w = src.shape
    px, py = sx - 0.5, sy - 0.5
    fx, fy = px.floor(), py.floor()
    dx, dy = (px - fx)[:, None], (py - fy)[:, None]
    ix, iy = fx.long(), fy.long()
    flat = src.reshape(n, c, h * w)

    def at(oy: int, ox: int) -> torch.Tensor:
        idx = (iy + oy).clamp(0, h - 1) * w + (ix + ox).clamp(0, w - 1)
        return flat.gather(2, idx.view(n, 1, h * w).expand(-1, c, -1)).view(n, c, h, w).double()

    if not bicubic:
        top, bottom = at(0, 0), at(1, 0)
        top = top + (at(0, 1) - top) * dx
        bottom = bottom + (at(1, 1) - bottom) * dx
        return (top + (bottom - top) * dy).trunc().to(torch.uint8)
    rows = [_cubic(*(at(oy, ox) for ox in (-1, 0, 1, 2)), dx) for oy in (-1, 0, 1, 2)]
    return _cubic(*rows, dy).clamp(0, 255).trunc().to(torch.uint8)


def affine(name: str):
    """The batched op of geometric op ``name``: output pixel (x, y) samples the input at ``A (x + .5, y + .5) + t``."""

    def op(x, params):
        from PIL import Image

        n, c, h, w = x.shape
        out = x.clone()
        mats = [_matrix(name, args, h, w) for args, _ in params]
        todo = [k for k, m in enumerate(mats) if m is not None]
        if not todo:
            return out
        m = torch.tensor([mats[k] for k in todo], dtype=torch.float64, device=x.device).view(-1, 6, 1, 1)
        ys = torch.arange(h, dtype=torch.float64, device=x.device).view(1, -1, 1) + 0.5
        xs = torch.arange(w, dtype=torch.float64, device=x.device).view(1, 1, -1) + 0.5
        sx = m[:, 0] * xs + m[:, 1] * ys + m[:, 2]
        sy = m[:, 3] * xs + m[:, 4] * ys + m[:, 5]
        inside = ((sx >= 0) & (sx < w) & (sy >= 0) & (sy < h))[:, None]
        src = x[todo]
        resample = [params[k][1]["resample"] for k in todo]
        nearest = torch.tensor([r == Image.Resampling.NEAREST for r in resample], device=x.device)
        picked = src
        if nearest.any():  # PIL: the pixel the source point falls in
            ix, iy = sx.floor().long(), sy.floor().long()
            fixed = [j for j, k in enumerate(todo) if mats[k][1] != 0 or mats[k][3] != 0]
            if fixed:  # PIL's ImagingTransformAffine: 16.16 fixed point unless the map is a pure scale/shift
                ix[fixed], iy[fixed] = _fixed_point_coords([mats[todo[j]] for j in fixed], h, w, x.device)
            inside = ((ix >= 0) & (ix < w) & (iy >= 0) & (iy < h))[:, None]
            flat = (iy.clamp(0, h - 1) * w + ix.clamp(0, w - 1)).view(len(todo), 1, h * w).expand(-1, c, -1)
            picked = src.reshape(len(todo), c, h * w).gather(2, flat).view(len(todo), c, h, w)
        for code in (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC):
            sel = [j for j, r in enumerate(resample) if r == code]
            if sel:
                picked[sel] = _filtered(src[sel], sx[sel], sy[sel], bicubic=code == Image.Resampling.BICUBIC)
        out[todo] = _fill(picked, ~inside, [params[k] for k in todo])
        return out

    return op


DEVICE_OPS = {"Invert": invert, "Posterize": posterize, "Solarize": solarize, "SolarizeAdd": solarize_add,
              "Brightness": brightness, "Color": color, "ContrastGrey": contrast_grey, "ContrastMean": contrast_mean,
              "Sharpness": sharpness, "Equalize": equalize, "AutoContrast": auto_contrast, "Cutout": cutout,
              **{name: affine(name) for name in sorted(GEOMETRIC)}}


def apply_batched(name: str, x: torch.Tensor, params: list) -> torch.Tensor:
    """Device op ``name`` on uint8 ``x`` (n, C, H, W), ``params[k]`` = (level args, extra) of image k."""
    if not math.prod(x.shape):
        return x
    return DEVICE_OPS[name](x, params)
