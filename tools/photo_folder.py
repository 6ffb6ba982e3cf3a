"""A JPEG ``imagefolder`` of real photographs at ImageNet-like sizes, for the input-pipeline benchmarks.

Source photographs, all from installed wheels (none in git): the 20 ImageNet validation photos of the
``foolbox`` wheel (512 x 512, one 1024 x 683; class = their ImageNet id, 19 classes), scikit-image's
colour photos and matplotlib's ``grace_hopper.jpg`` (one class each): 27 photos, 26 classes. The CIFAR /
MNIST images of foolbox (32 px) are left out: upscaled to 450 px they would not look like ImageNet JPEGs.

Image ``k`` of the folder is photo ``k mod 27``, cropped at a seeded random box (40-100 % of its area,
aspect 3/4-4/3), mirrored with probability 1/2, resized (bicubic, antialiased) so its longer side is a
seeded integer in [400, 500] px, and encoded as baseline JPEG at quality 90 (ImageNet's median is ~400 x
350 px at quality ~90): a real-photograph stand-in with ImageNet's file sizes, not random tensors.
"""

from __future__ import annotations

import dpnrepro  # noqa: F401,I001  (first: its CPU pins must be in place before numpy and torch load)

import io
import os
from pathlib import Path

import numpy as np

from dpnrepro.cli import measurement
from dpnrepro.errors import UserError

AREA = (0.4, 1.0)
ASPECT = (3 / 4, 4 / 3)
LONG_SIDE = (400, 500)
QUALITY = 90


def source_photos() -> list[tuple[str, Path]]:
    """(class name, path) of every source photograph, in a fixed order."""
    from dpnrepro.benchmarks.input_pipeline import photo_paths
    from dpnrepro.lit.data import foolbox_dir

    try:
        imagenet = sorted(foolbox_dir().glob("imagenet_*.jpg"))
    except Exception as exc:  # DatasetError: the wheel is missing
        raise UserError(f"the photo folder reads the foolbox wheel's photos: {exc}") from exc
    if len(imagenet) != 20:
        raise UserError(f"expected foolbox's 20 ImageNet photos in {foolbox_dir()}, found {len(imagenet)}; "
                        "reinstall foolbox==3.3.4 (--no-deps)")
    out = [(f"imagenet_{int(p.stem.split('_')[-1]):04d}", p) for p in imagenet]
    return out + [(p.stem, p) for p in photo_paths()]


def _image(k: int, photo, seed: int) -> bytes:
    """JPEG bytes of image ``k`` (the module docstring's recipe) from the RGB PIL ``photo``."""
    from PIL import Image

    rng = np.random.default_rng([seed, k])
    w, h = photo.size
    area = rng.uniform(*AREA) * w * h
    aspect = np.exp(rng.uniform(*np.log(ASPECT)))
    cw, ch = min(w, round(np.sqrt(area * aspect))), min(h, round(np.sqrt(area / aspect)))
    left, top = int(rng.integers(w - cw + 1)), int(rng.integers(h - ch + 1))
    im = photo.crop((left, top, left + cw, top + ch))
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    side = int(rng.integers(LONG_SIDE[0], LONG_SIDE[1] + 1))
    f = side / max(cw, ch)
    im = im.resize((max(1, round(cw * f)), max(1, round(ch * f))), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=QUALITY)
    return buf.getvalue()


_PHOTOS: list = []


def _write_block(args) -> int:
    """Write images ``lo..hi-1`` of one split (a worker's share); returns the bytes written."""
    out, split, lo, hi, seed, names, paths = args
    from PIL import Image

    if not _PHOTOS:
        for p in paths:
            with Image.open(p) as src:
                _PHOTOS.append(src.convert("RGB"))
    written = 0
    for k in range(lo, hi):
        c = k % len(paths)
        data = _image(k, _PHOTOS[c], seed)
        (Path(out) / split / names[c] / f"{k:07d}.jpg").write_bytes(data)
        written += len(data)
    return written


def write_photo_folder(out: str | os.PathLike, n_train: int, n_val: int = 0, seed: int = 0,
                       workers: int = 1) -> dict:
    """Write ``<out>/{train,validation}/<class>/<k>.jpg`` (``n_train`` / ``n_val`` images, classes balanced to
    within one image) in ``workers`` processes; the same bytes for any ``workers``. Returns the counts,
    classes and JPEG bytes per split."""
    from tqdm.auto import tqdm

    photos = source_photos()
    names, paths = [n for n, _ in photos], [str(p) for _, p in photos]
    out = Path(out)
    stats = {"classes": len(set(names)), "photos": len(paths), "splits": {}}
    for split, n, split_seed in (("train", n_train, seed), ("validation", n_val, seed + 1)):
        if n <= 0:
            continue
        for name in names:
            (out / split / name).mkdir(parents=True, exist_ok=True)
        step = 500
        blocks = [(str(out), split, lo, min(n, lo + step), split_seed, names, paths) for lo in range(0, n, step)]
        bar = dict(total=len(blocks), desc=f"photo folder {split}", unit="block", leave=False)
        if workers > 1:
            import multiprocessing as mp

            with mp.get_context("fork").Pool(workers) as pool:
                sizes = list(tqdm(pool.imap(_write_block, blocks), **bar))
        else:
            sizes = [_write_block(b) for b in tqdm(blocks, **bar)]
        stats["splits"][split] = {"images": n, "jpeg_bytes": int(sum(sizes))}
    return stats


@measurement
def main(argv=None) -> None:
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the folder to write (<out>/{train,validation}/<class>/<k>.jpg)")
    ap.add_argument("--train", type=int, required=True, help="training images")
    ap.add_argument("--val", type=int, default=0, help="validation images")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    print(json.dumps(write_photo_folder(args.out, args.train, args.val, seed=args.seed, workers=args.workers)))


if __name__ == "__main__":
    main()
