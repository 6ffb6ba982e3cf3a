"""RandAugment on a batch of uint8 images on any device, one layer at a time (``input.backend: gpu``).

Every image of a batch has one op per layer (or none), with its arguments encoded by a worker in one float64
row (:func:`encode_op`, :data:`LAYER`), and the worker sorts the layer's images by op kind (:func:`order_layer`).
The device gathers the batch into that order once, runs each kind on its own run of images (bounds the host
reads from its copy of the rows: no value comes back from the device), and gathers the result back:

* **look-up-table ops**, all in one ``gather`` of a per-image-and-channel LUT (n, C, 256), each image's LUT
  picked by ``torch.where`` on its op code: Invert, Posterize, Solarize, SolarizeAdd, Brightness, Contrast
  (both spellings), Equalize, AutoContrast;
* **Color** and **Sharpness**, each on its run;
* **geometric ops and Cutout**, one affine sampling pass: each image's inverse matrix (the identity for
  Cutout) gives its source pixel, then the fill colour where the source is outside (Cutout: inside its
  square).

Arithmetic is the CPU path's (:func:`dpnrepro.data.randaugment.apply_op`:
PIL / timm / OpenCV) where PIL's is known:

================================  ====================================================================
Invert, Posterize, Solarize,      exact (integer LUT arithmetic)
SolarizeAdd, Cutout
Equalize, AutoContrast            exact: per-image-and-channel histogram, PIL's LUT (integers; float64
                                  for AutoContrast's scale, as Python computes it)
Brightness, Color, Contrast       PIL's ``Image.blend`` in float32 (sub, mul, add: separate roundings,
(both spellings)                  no fused multiply-add), truncated; Color's grey is PIL's
                                  ``L = (19595 R + 38470 G + 7471 B + 2^15) >> 16``; timm's Contrast
                                  blends towards ``int(mean(L) + .5)``, big_vision's towards a constant
Sharpness                         PIL's SMOOTH 3x3 (weights 1, centre 5, / 13) in integers, rounded
                                  (``(2 s + 13) // 26``: s / 13 is never a tie), borders kept, blended
Rotate, ShearX/Y, TranslateX/Y,   PIL's affine map: nearest neighbour in 16.16 fixed point (a pure shift in
TranslateX/YRel                   float64), as ``affine_fixed`` / ``ImagingScaleAffine``; bilinear / bicubic
                                  (timm's own specs) as ``bilinear_filter8`` / ``bicubic_filter8``: float64,
                                  clamped neighbours, PIL's a = -1 cubic, truncated; the fill colour where
                                  the source point is outside the image
================================  ====================================================================

No op runs a matrix product or a convolution (TF32 on CUDA would change the result) and none reads a value
back to the host (tests/test_gpu_input.py: bit-exact against PIL op by op; a CUDA test runs a batch under
``torch.cuda.set_sync_debug_mode("error")``).
"""

from __future__ import annotations

import math

import torch

from dpnrepro.errors import UserError

GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel")
LUT_OPS = ("Invert", "Posterize", "Solarize", "SolarizeAdd", "Brightness", "ContrastGrey", "ContrastMean",
           "Equalize", "AutoContrast")
CODES = {name: k for k, name in enumerate(("none", *LUT_OPS, "Color", "Sharpness", "Cutout", "Affine"))}
# one layer's float64 row: op code, level argument, filter, fill (3), Cutout's centre, the inverse matrix, the
# same in PIL's 16.16 fixed point, 1 where nearest neighbour takes the fixed-point path; then two columns of the
# batch as a whole (:func:`order_layer`): the images sorted by op kind, and the way back
LAYER = ("op", "arg", "resample", "fill0", "fill1", "fill2", "cy", "cx", "a", "b", "c", "d", "e", "f",
         "fa", "fb", "fc", "fd", "fe", "ff", "fixed", "order", "inverse")
_COL = {name: k for k, name in enumerate(LAYER)}
_IDENTITY = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)


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


# ------------------------------------------------------------------------------------------- the host half
def _matrix(name: str, args, h: int, w: int) -> tuple | None:
    """PIL's inverse affine matrix of a geometric op (None: the identity, the image returned unchanged)."""
    from dpnrepro.data.randaugment import rotate_matrix

    (v,) = args
    if name == "Rotate":
        return rotate_matrix(v, h, w)
    return {"ShearX": (1, v, 0, 0, 1, 0), "ShearY": (1, 0, 0, v, 1, 0), "TranslateX": (1, 0, v, 0, 1, 0),
            "TranslateY": (1, 0, 0, 0, 1, v), "TranslateXRel": (1, 0, v * w, 0, 1, 0),
            "TranslateYRel": (1, 0, 0, 0, 1, v * h)}[name]


def _fixed(m) -> tuple:
    """PIL's ``affine_fixed`` coefficients: each rounded once to 16.16, the half-pixel offset folded into the constant."""
    a, b, c, d, e, f = m

    def fix(v: float) -> int:
        return math.floor(v * 65536.0 + 0.5)

    return fix(a), fix(b), fix(c + a * 0.5 + b * 0.5), fix(d), fix(e), fix(f + d * 0.5 + e * 0.5)


def encode_op(op, size: int) -> list[float]:
    """One image's layer row (:data:`LAYER`) for ``op`` = (device op name, level args, extra draws) or None,
    on a ``size x size`` image."""
    row = [0.0] * len(LAYER)
    row[_COL["a"]:_COL["f"] + 1] = _IDENTITY
    if op is None:
        return row
    name, args, extra = op
    fill = tuple(extra.get("fill", (128,)))
    row[_COL["fill0"]:_COL["fill2"] + 1] = (fill * 3)[:3]
    row[_COL["resample"]] = float(extra.get("resample", 0))
    if name in GEOMETRIC:
        m = _matrix(name, args, size, size)
        if m is None:
            return row  # Rotate by 0 degrees: the image unchanged
        row[_COL["op"]] = CODES["Affine"]
        row[_COL["a"]:_COL["f"] + 1] = m
        row[_COL["fa"]:_COL["ff"] + 1] = _fixed(m)
        row[_COL["fixed"]] = float(m[1] != 0 or m[3] != 0)  # PIL: fixed point unless a pure scale / shift
        return row
    row[_COL["op"]] = CODES[name]
    row[_COL["arg"]] = float(args[0]) if args else 0.0
    if name == "Cutout":
        row[_COL["cy"]], row[_COL["cx"]] = extra["centre"]
    return row


# ----------------------------------------------------------------------------------------- the device half
def _col(p: torch.Tensor, name: str, dtype=torch.float32) -> torch.Tensor:
    """Column ``name`` of the layer rows ``p`` (n, len(LAYER)) as (n, 1, 1) of ``dtype``."""
    return p[:, _COL[name]].to(dtype).view(-1, 1, 1)


def _blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ``Image.blend(degenerate, x, factor)`` in float32: ``d + f (x - d)``, clipped, truncated (float)."""
    return (degenerate + factor * (x.float() - degenerate)).clamp_(0, 255).trunc_()


def _grey(x: torch.Tensor) -> torch.Tensor:
    """PIL's RGB → L (integer weights, rounded), as int64 (n, 1, H, W); grey images as they are."""
    if x.shape[1] == 1:
        return x.long()
    r, g, b = x.long().unbind(1)
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16)[:, None]


def _histogram(x: torch.Tensor) -> torch.Tensor:
    """(n, C, 256) int64 counts of every image and channel (a 1-D integer ``scatter_add_``: no host sync,
    order-independent)."""
    n, c = x.shape[:2]
    offsets = torch.arange(n * c, device=x.device).view(n, c, 1) * 256
    flat = (x.reshape(n, c, -1).long() + offsets).reshape(-1)
    counts = torch.zeros(n * c * 256, dtype=torch.int64, device=x.device)
    return counts.scatter_add_(0, flat, torch.ones_like(flat)).view(n, c, 256)


def _equalize_lut(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PIL's ``ImageOps.equalize``: ``(step // 2 + #pixels below v) // step``, ``step = (#pixels - #pixels in
    the highest used bin) // 255``; the identity when step is 0 or one bin is used."""
    hist = _histogram(x)
    used = hist > 0
    last = 255 - used.flip(-1).int().argmax(-1, keepdim=True)
    step = (hist.sum(-1, keepdim=True) - hist.gather(-1, last)) // 255
    lut = (step // 2 + hist.cumsum(-1) - hist) // step.clamp(min=1)
    keep = (used.sum(-1, keepdim=True) <= 1) | (step == 0)
    return torch.where(keep, v, lut.clamp(max=255))


def _autocontrast_lut(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PIL's ``ImageOps.autocontrast`` (no cutoff): ``int(v * 255 / (hi - lo) - lo * scale)`` clipped, in
    float64; the identity when hi <= lo."""
    lo = x.amin(dim=(2, 3)).double().unsqueeze(-1)
    hi = x.amax(dim=(2, 3)).double().unsqueeze(-1)
    scale = torch.full_like(lo, 255.0) / (hi - lo).clamp(min=1)  # a true division (255.0 / t multiplies by 1 / t)
    vd = v.double()
    lut = (vd * scale + (-lo * scale)).trunc().clamp(0, 255)
    return torch.where(hi <= lo, vd, lut).long()


def _lut_pass(x: torch.Tensor, p: torch.Tensor, code: torch.Tensor, present: set[str]) -> torch.Tensor:
    """Every look-up-table op of the layer as one gather (the identity LUT for other images)."""
    n, c, h, w = x.shape
    v = torch.arange(256, device=x.device).view(1, 1, 256)
    arg, f = _col(p, "arg", torch.int64), _col(p, "arg")
    vf = v.float()
    builders = {
        "Invert": lambda: 255 - v,
        "Posterize": lambda: v & torch.where(arg >= 8, 255, 256 - torch.pow(2, (8 - arg).clamp(0, 8))),
        "Solarize": lambda: torch.where(v < arg, v, 255 - v),
        "SolarizeAdd": lambda: torch.where(v < 128, (v + arg).clamp(max=255), v),
        "Brightness": lambda: _blend(torch.zeros((), device=x.device), vf, f).long(),
        "ContrastGrey": lambda: _blend(torch.full((), float(int(min(255.0, h * w / 256))), device=x.device),
                                       vf, f).long(),
        "ContrastMean": lambda: _blend(_mean_grey(x), vf, f).long(),
        "Equalize": lambda: _equalize_lut(x, v),
        "AutoContrast": lambda: _autocontrast_lut(x, v),
    }
    lut = v.expand(n, c, 256)
    for name in LUT_OPS:
        if name in present:
            lut = torch.where(code == CODES[name], builders[name](), lut)
    return lut.to(torch.uint8).expand(n, c, 256).gather(2, x.reshape(n, c, h * w).long()).view(n, c, h, w)


def _mean_grey(x: torch.Tensor) -> torch.Tensor:
    """timm / PIL's ``ImageEnhance.Contrast`` level ``int(mean(L) + 0.5)`` in integers, (n, 1, 1) float32 (the
    float rounding of PIL's mean is far below the 1 / (2 H W) that separates it from a .5 boundary)."""
    grey = _grey(x)
    count = grey[0].numel()
    level = torch.div(2 * grey.sum(dim=(1, 2, 3)) + count, 2 * count, rounding_mode="floor")
    return level.float().view(-1, 1, 1)


def _sharpness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """PIL's ``ImageEnhance.Sharpness``: blend(SMOOTH-filtered with border pixels kept, x, factor)."""
    xi = x.int()
    box = sum(xi[:, :, 1 + dy : xi.shape[2] - 1 + dy, 1 + dx : xi.shape[3] - 1 + dx]
              for dy in (-1, 0, 1) for dx in (-1, 0, 1))
    smooth = torch.div(2 * (box + 4 * xi[:, :, 1:-1, 1:-1]) + 13, 26, rounding_mode="floor")
    degenerate = x.float()
    degenerate[:, :, 1:-1, 1:-1] = smooth.float()
    return _blend(degenerate, x, f.view(-1, 1, 1, 1))


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


def _sample_pass(x: torch.Tensor, p: torch.Tensor, code: torch.Tensor, filters: set[int],
                 geometric: bool = True) -> torch.Tensor:
    """Geometric ops and Cutout in one pass: each image's source pixel through its inverse matrix (the identity
    for other ops), nearest in PIL's fixed point or float64 floor, ``filters`` (PIL codes other than nearest the
    layer uses) by their PIL filter; then the fill colour where the source is outside (Cutout: inside its square).
    Without ``geometric`` (a layer of Cutouts only) the source is ``x`` itself."""
    from PIL import Image

    n, c, h, w = x.shape
    d64 = torch.float64
    ys = torch.arange(h, dtype=d64, device=x.device).view(1, -1, 1)
    xs = torch.arange(w, dtype=d64, device=x.device).view(1, 1, -1)
    m = {k: _col(p, k, d64) for k in ("a", "b", "c", "d", "e", "f")}
    sx = m["a"] * (xs + 0.5) + m["b"] * (ys + 0.5) + m["c"]
    sy = m["d"] * (xs + 0.5) + m["e"] * (ys + 0.5) + m["f"]
    fx = {k: _col(p, k, torch.int64) for k in ("fa", "fb", "fc", "fd", "fe", "ff")}
    yi, xi = ys.long(), xs.long()
    fixed = _col(p, "fixed", torch.bool)
    ix = torch.where(fixed, torch.div(fx["fc"] + yi * fx["fb"] + xi * fx["fa"], 65536, rounding_mode="floor"),
                     sx.floor().long())
    iy = torch.where(fixed, torch.div(fx["ff"] + yi * fx["fe"] + xi * fx["fd"], 65536, rounding_mode="floor"),
                     sy.floor().long())
    outside = (ix < 0) | (ix >= w) | (iy < 0) | (iy >= h)
    idx = (iy.clamp(0, h - 1) * w + ix.clamp(0, w - 1)).view(n, 1, h * w).expand(-1, c, -1)
    picked = x.reshape(n, c, h * w).gather(2, idx).view(n, c, h, w) if geometric else x
    affine = code == CODES["Affine"]
    resample = _col(p, "resample", torch.int64)
    continuous = (sx < 0) | (sx >= w) | (sy < 0) | (sy >= h)  # PIL's filters test the point itself
    for flt in sorted(filters):
        use = (affine & (resample == flt)).view(n, 1, 1)
        picked = torch.where(use[:, None], _filtered(x, sx, sy, bicubic=flt == Image.Resampling.BICUBIC), picked)
        outside = torch.where(use, continuous, outside)
    pad, cy, cx = _col(p, "arg", torch.int64), _col(p, "cy", torch.int64), _col(p, "cx", torch.int64)
    square = (yi >= cy - pad) & (yi < cy + pad) & (xi >= cx - pad) & (xi < cx + pad) & (pad > 0)
    fill_here = (affine & outside) | ((code == CODES["Cutout"]) & square)
    fill = p[:, _COL["fill0"]:_COL["fill0"] + c].to(torch.uint8).view(n, c, 1, 1)
    return torch.where(fill_here[:, None], fill, picked)


def order_layer(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` (host, one layer) with its ``order`` column (the images sorted by op code, stably) and its
    ``inverse`` column (where each image went) filled in."""
    order = torch.argsort(rows[:, _COL["op"]], stable=True)
    rows[:, _COL["order"]] = order.to(rows.dtype)
    rows[order, _COL["inverse"]] = torch.arange(len(rows), dtype=rows.dtype)
    return rows


_RUNS = (("lut", LUT_OPS), ("Color", ("Color",)), ("Sharpness", ("Sharpness",)), ("sample", ("Cutout", "Affine")))


def augment_layer(x: torch.Tensor, p: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """One RandAugment layer on uint8 ``x`` (n, C, H, W): image k's op and arguments in row ``p[k]``
    (:data:`LAYER`, on ``x``'s device, ordered by :func:`order_layer`); ``rows`` is the host's copy, from which
    the host reads the runs' bounds and the filters the layer uses."""
    codes = rows[:, _COL["op"]].long()
    count = torch.bincount(codes, minlength=len(CODES)).tolist()
    if count[0] == len(codes):
        return x
    order, inverse = p[:, _COL["order"]].long(), p[:, _COL["inverse"]].long()
    xs, ps = x.index_select(0, order), p.index_select(0, order)
    pieces, a = [xs[: count[0]]], count[0]
    for kind, names in _RUNS:
        b = a + sum(count[CODES[name]] for name in names)
        if b > a:
            xr, pr = xs[a:b], ps[a:b]
            if kind == "lut":
                pieces.append(_lut_pass(xr, pr, _col(pr, "op", torch.int64), {m for m in names if count[CODES[m]]}))
            elif kind == "Color":
                pieces.append(_blend(_grey(xr).float(), xr, _col(pr, "arg").view(-1, 1, 1, 1)).to(torch.uint8))
            elif kind == "Sharpness":
                pieces.append(_sharpness(xr, _col(pr, "arg")).to(torch.uint8))
            else:
                affine = rows[codes == CODES["Affine"], _COL["resample"]]
                filters = {int(r) for r in affine.unique().tolist() if int(r) != 0}
                pieces.append(_sample_pass(xr, pr, _col(pr, "op", torch.int64), filters,
                                           geometric=bool(count[CODES["Affine"]])))
        a = b
    return torch.cat(pieces).index_select(0, inverse)


def apply_batched(name: str, x: torch.Tensor, params: list) -> torch.Tensor:
    """Device op ``name`` on uint8 ``x`` (n, C, H, W), ``params[k]`` = (level args, extra) of image k (op-by-op
    tests and tools; the loop encodes rows in its workers)."""
    if not math.prod(x.shape):
        return x
    rows = order_layer(torch.tensor([encode_op((name, args, extra), x.shape[-1]) for args, extra in params],
                                    dtype=torch.float64))
    return augment_layer(x, rows.to(x.device), rows)
