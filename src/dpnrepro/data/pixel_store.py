"""A decoded uint8 pixel store of the train split: images decoded once at prepare time, not every step.

``data.pixel_store_side: N`` (N > 0) makes ``prepare`` write ``<prepared>/train_pixels/``: every train
image decoded to uint8 HxWxC (the dataset's channel count after ``input.channels`` conversion is left to
the transform, so the store keeps L or RGB as decoded), its shorter side resized down to at most N px
(antialiased bicubic, as Pillow does; smaller images are kept as they are), all concatenated in one
``pixels.u8`` file with an ``index.npy`` of (offset, height, width, channels) rows. FFCV stores ImageNet
the same way (there with max side 256-512). Training with ``input.backend: fast`` then memory-maps the
store, and the fast transform starts from pixels: no JPEG decode at train time (see
reports/input_pipeline.md for the per-core throughput against Pillow).

The inception crop of a stored image is sampled on the stored (possibly downscaled) image, so with
N smaller than the originals the crops are of a lower-resolution source than decoding the JPEG would
give; choose N >= the training resolution (e.g. 256-320 for 224-px training).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from dpnrepro.errors import DatasetError

STORE_DIR = "train_pixels"
PIXELS_FILE = "pixels.u8"
INDEX_FILE = "index.npy"


def _decode(item, side: int) -> np.ndarray:
    from PIL import Image

    if isinstance(item, bytes):
        data = item
    else:
        data = item["bytes"] if item.get("bytes") is not None else Path(item["path"]).read_bytes()
    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB") if im.mode not in ("L", "RGB") else im
        w, h = im.size
        if min(w, h) > side:
            f = side / min(w, h)
            im = im.resize((max(1, round(w * f)), max(1, round(h * f))), Image.Resampling.BICUBIC)
        arr = np.asarray(im, dtype=np.uint8)
    return arr[:, :, None] if arr.ndim == 2 else arr


def write_pixel_store(images, out_dir: str | Path, side: int) -> dict:
    """Decode ``images`` (encoded bytes, or ``datasets.Image(decode=False)`` dicts) into a store at
    ``out_dir``; returns its stats."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    offset = 0
    with open(out_dir / PIXELS_FILE, "wb") as f:
        for item in tqdm(images, desc="pixel store", unit="img", leave=False):
            arr = _decode(item, side)
            f.write(arr.tobytes())
            rows.append((offset, *arr.shape))
            offset += arr.size
    np.save(out_dir / INDEX_FILE, np.asarray(rows, dtype=np.int64).reshape(-1, 4))
    return {"examples": len(rows), "bytes": offset, "max_shorter_side": side}


def write_split_store(ds, out_dir: str | Path, side: int) -> dict:
    """The pixel store of a prepared split (its images in order)."""
    import datasets

    return write_pixel_store(ds.cast_column("image", datasets.Image(decode=False))["image"], out_dir, side)


class PixelStore:
    """The images of a store as read-only uint8 HxWxC arrays (memory-mapped)."""

    def __init__(self, store_dir: str | Path):
        store_dir = Path(store_dir)
        if not store_dir.is_dir():
            raise DatasetError(f"no pixel store at {store_dir}; set data.pixel_store_side and rerun `dvc repro prepare`")
        if not (store_dir / INDEX_FILE).exists():
            from dpnrepro.restore import restore_fix

            raise DatasetError(f"pixel store {store_dir} has no {INDEX_FILE} (deleted, or the prepared data is damaged); "
                               f"{restore_fix(store_dir / INDEX_FILE, 'prepare')}")
        self.index = np.load(store_dir / INDEX_FILE)
        need = int((self.index[:, 0] + self.index[:, 1:].prod(axis=1)).max(initial=0))
        have = (store_dir / PIXELS_FILE).stat().st_size if (store_dir / PIXELS_FILE).exists() else 0
        if have != need:
            from dpnrepro.restore import restore_fix

            raise DatasetError(f"pixel store {store_dir / PIXELS_FILE} holds {have} bytes, its index {need} (truncated "
                               f"or replaced); {restore_fix(store_dir / PIXELS_FILE, 'prepare')}")
        self.pixels = np.memmap(store_dir / PIXELS_FILE, dtype=np.uint8, mode="r")

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> np.ndarray:
        offset, h, w, c = self.index[i]
        return self.pixels[offset : offset + h * w * c].reshape(h, w, c)


class PixelStoreSplit:
    """A prepared split whose images come from its pixel store and whose labels come from the split
    itself; indexable like a ``datasets.Dataset`` row by row."""

    def __init__(self, ds, store_dir: str | Path):
        self.store = PixelStore(store_dir)
        if len(self.store) != len(ds):
            raise DatasetError(f"pixel store {store_dir} holds {len(self.store)} images, the split {len(ds)}; "
                               "rerun `dvc repro prepare`")
        self.column_names = [c for c in ds.column_names if c != "image"] + ["image"]
        self.labels = {c: list(ds[c]) for c in ("label", "labels") if c in ds.column_names}  # plain lists: O(1) rows
        # The run fingerprint sees the store's geometry (so pixel_store_side) as well as the split.
        self._fingerprint = f"{ds._fingerprint}:pixels:{hashlib.sha256(self.store.index.tobytes()).hexdigest()[:16]}"

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.store[i], **{c: v[i] for c, v in self.labels.items()}}
