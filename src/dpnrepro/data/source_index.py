"""``data.storage: source``: prepare a large image folder without a second copy of its images.

``prepare`` in the default ``copy`` storage decodes every image in one process and saves the splits
with their image bytes (Arrow, ``save_to_disk``): for ImageNet-21k a second copy of ~1.3 TB that DVC
hashes and caches. With ``storage: source`` it lists the ``<source>/<split>/<class>/<file>`` tree itself,
checks every file in ``runtime.prepare_workers`` processes (read, sha256, full decode), and saves per
split an *index*: the file's path relative to ``data.source``, its label(s) and its sha256. A split whose
directory holds a ``metadata.jsonl`` (the JFT-style multi-label layout: lines ``{"file_name": "x.jpg",
"labels": [3, 17]}``) is indexed from it instead, as ``datasets``' imagefolder builder reads it: the
listed files in the file's line order, with their ``labels`` (and/or ``label``); files it does not list
are not part of the split. Counts, class
balance and the split's content hash in ``manifest.json`` are computed as in ``copy`` storage. Training
and evaluation then read each image from the source folder (:class:`SourceSplit`), so moving the folder
means editing ``data.source`` only.

Streaming shards (webdataset-style tar files) were the other option; they also write every encoded byte
a second time (the measured disk cost is in reports/input_folder.md), which is what this mode avoids.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from dpnrepro.errors import DatasetError

# The file types `datasets`' imagefolder builder reads that Pillow decodes (lower-case suffixes).
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})


def _listing(split_dir: Path) -> dict[str, list[str]]:
    """``{class folder: sorted image file names}`` of one split directory. Found in the same scan (the tree
    is not walked twice): a metadata file in a class folder, or a folder below one (``datasets`` would read
    what it holds, this listing would not), is an error."""
    out = {}
    with os.scandir(split_dir) as entries:
        classes = sorted(e.name for e in entries if e.is_dir())
    for c in classes:
        with os.scandir(split_dir / c) as entries:
            found = sorted((e.name, e.is_dir()) for e in entries if e.is_file() or e.is_dir())
        meta = next((f for f, is_dir in found if not is_dir and f.startswith("metadata.")), None)
        if meta is not None:
            raise _unread_metadata(split_dir / c / meta)
        sub = next((f for f, is_dir in found if is_dir), None)
        if sub is not None:
            raise DatasetError(f"{split_dir / c / sub}: data.storage: source lists <split>/<class>/<image> "
                               "files only; move its images up, or use data.storage: copy")
        out[c] = [f for f, _ in found if Path(f).suffix.lower() in IMAGE_SUFFIXES]
    return out


def skipped_entries(source: str | os.PathLike, splits: dict[str, str]) -> str | None:
    """What a class-folder image folder holds that no split will read, as one note (``None`` if nothing): files
    that are not images (a stray README.txt) and empty class folders, each counted, the first of each named."""
    root = Path(source)
    strays, empty = [], []
    for src in splits.values():
        if not (root / src).is_dir():
            continue
        with os.scandir(root / src) as entries:
            classes = sorted(e.name for e in entries if e.is_dir())
        for c in classes:
            with os.scandir(root / src / c) as entries:
                files = [e.name for e in entries if e.is_file()]
            if not files:
                empty.append(f"{src}/{c}")
            strays += [f"{src}/{c}/{f}" for f in sorted(files)
                       if Path(f).suffix.lower() not in IMAGE_SUFFIXES and not f.startswith("metadata.")]
    parts = [f"{len(found)} {one if len(found) == 1 else many} ({found[0]}{', ...' if len(found) > 1 else ''})"
             for found, one, many in ((strays, "file that is not an image", "files that are not images"),
                                      (empty, "empty class folder", "empty class folders")) if found]
    if not parts:
        return None
    return f"image folder {root}: skipped " + " and ".join(parts)


METADATA = "metadata.jsonl"  # datasets' imagefolder metadata file, the form this index reads
OTHER_METADATA = ("metadata.csv", "metadata.parquet")  # datasets reads these too; this index does not


def _unread_metadata(path: Path) -> DatasetError:
    return DatasetError(f"{path}: data.storage: source reads one metadata.jsonl at a split's root; "
                        "convert it, or use data.storage: copy")


def _metadata_rows(split_dir: Path, src: str) -> dict[str, list]:
    """``{"path": [...], "labels" and/or "label": [...]}`` of a split's ``metadata.jsonl``, in line order;
    every line must carry a relative ``file_name`` and the same label fields, of class ids."""
    meta = split_dir / METADATA
    rows: dict[str, list] = {"path": []}
    fields = None
    with open(meta, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{meta}:{n}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not a JSON object ({exc.msg}); fix the line") from None
            name = rec.get("file_name") if isinstance(rec, dict) else None
            if not isinstance(name, str) or not name or name.startswith("/") or ".." in Path(name).parts:
                raise DatasetError(f"{where}: needs \"file_name\", a path relative to {split_dir}")
            found = tuple(k for k in ("label", "labels") if k in rec)
            if fields is None:
                fields = found
                rows.update({k: [] for k in fields})
            elif found != fields:
                raise DatasetError(f"{where}: has label fields {list(found)}, the lines before {list(fields)}; "
                                   "every line must carry the same ones")
            if "label" in rec and not (isinstance(rec["label"], int) and not isinstance(rec["label"], bool)):
                raise DatasetError(f"{where}: \"label\" must be a class id, not {rec['label']!r}")
            if "labels" in rec and not (isinstance(rec["labels"], list)
                                        and all(isinstance(c, int) and not isinstance(c, bool) for c in rec["labels"])):
                raise DatasetError(f"{where}: \"labels\" must be a list of class ids, not {rec['labels']!r}")
            rows["path"].append(f"{src}/{name}")
            for k in fields:
                rows[k].append(rec[k])
    if not rows["path"]:
        raise DatasetError(f"{meta} lists no files; list the split's images or remove it")
    return rows


def _nested_metadata(split_dir: Path) -> Path | None:
    """A metadata file below the root of a ``metadata.jsonl`` split (a walk of its tree: such splits are
    flat folders whose every file the check reads anyway)."""
    return next(iter(sorted(split_dir.glob("*/**/metadata.*"))), None)


def index_image_folder(source: str | os.PathLike, splits: dict[str, str]) -> dict:
    """The index of an imagefolder tree as ``datasets.Dataset``s with ``path`` (relative to ``source``) and
    ``label`` (``ClassLabel`` of the train split's class folders, sorted) for each of ``splits``
    ({our name: source split}); the first split names the classes. Splits with a ``metadata.jsonl`` are
    indexed from it (``path`` and its label fields); all splits must be of one kind."""
    import datasets

    root = Path(source)
    if not root.is_dir():
        raise DatasetError(f"dataset path {source} does not exist; fix data.source in params.yaml")
    for src in splits.values():
        if not (root / src).is_dir():
            raise DatasetError(f"image folder {root} has no split directory {src!r}; fix data.train_split / eval_split")
        other = next((root / src / f for f in OTHER_METADATA if (root / src / f).exists()), None)
        if other is not None:
            raise _unread_metadata(other)
    with_meta = {name: (root / src / METADATA).is_file() for name, src in splits.items()}
    if len(set(with_meta.values())) > 1:
        raise DatasetError(f"image folder {root}: splits {sorted(k for k, v in with_meta.items() if v)} have a "
                           f"{METADATA} and {sorted(k for k, v in with_meta.items() if not v)} class folders; "
                           "use one layout for every split")
    if all(with_meta.values()):
        out = {}
        for name, src in splits.items():
            nested = _nested_metadata(root / src)
            if nested is not None:
                raise _unread_metadata(nested)
            rows = _metadata_rows(root / src, src)
            features = datasets.Features({"path": datasets.Value("string"),
                                          **({"label": datasets.Value("int64")} if "label" in rows else {}),
                                          **({"labels": datasets.List(datasets.Value("int64"))} if "labels" in rows else {})})
            out[name] = datasets.Dataset.from_dict(rows, features=features)
        return out
    listings = {name: (src, _listing(root / src)) for name, src in splits.items()}
    classes = list(next(iter(listings.values()))[1])
    ids = {c: i for i, c in enumerate(classes)}
    features = datasets.Features({"path": datasets.Value("string"), "label": datasets.ClassLabel(names=classes)})
    out = {}
    for name, (src, listing) in listings.items():
        unknown = sorted(set(listing) - set(ids))
        if unknown:
            raise DatasetError(f"split {src!r} of {root} has class folder {unknown[0]!r}, which the first split "
                               "lacks; every split must use the same class folders")
        paths = [f"{src}/{c}/{f}" for c, files in listing.items() for f in files]
        labels = [ids[c] for c, files in listing.items() for _ in files]
        out[name] = datasets.Dataset.from_dict({"path": paths, "label": labels}, features=features)
    return out


def check_file(path: str) -> tuple[bytes | None, str | None]:
    """(sha256 digest, None) of a readable, fully decodable image file, else (None, the error)."""
    import io

    from PIL import Image

    try:
        data = Path(path).read_bytes()
        with Image.open(io.BytesIO(data)) as im:
            im.load()
    except Exception as exc:  # any failure to read or decode is a corrupt file
        return None, f"{type(exc).__name__}: {exc}"
    return hashlib.sha256(data).digest(), None


def check_files(paths: list[str], workers: int, desc: str) -> list[tuple[bytes | None, str | None]]:
    """:func:`check_file` of every path, in order, in ``workers`` processes (0 = one per CPU, 1 = this one)."""
    from tqdm.auto import tqdm

    workers = workers or os.cpu_count() or 1
    bar = dict(desc=desc, unit="img", total=len(paths), leave=False)
    if workers == 1 or len(paths) < 2:
        return [check_file(p) for p in tqdm(paths, **bar)]
    import multiprocessing as mp

    chunk = max(1, min(256, len(paths) // (4 * workers)))
    # fork where there is one: the children run Pillow and hashlib only, and start in milliseconds
    # (a spawned child re-imports the parent's modules, seconds each)
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with mp.get_context(method).Pool(workers) as pool:
        return list(tqdm(pool.imap(check_file, paths, chunksize=chunk), **bar))


class SourceSplit:
    """A prepared ``source``-storage split: rows ``{"image", "label" | "labels"}`` whose image is read from
    the source folder (a PIL image, or with :meth:`undecoded` a ``datasets``-style ``{"bytes", "path"}``
    dict the fast transform decodes itself). Indexable and selectable like a ``datasets.Dataset``."""

    def __init__(self, index, root: str | os.PathLike, decode: bool = True):
        self.index, self.root, self.decode = index, Path(root), decode
        self.label_columns = [c for c in ("label", "labels") if c in index.column_names]
        self.column_names = ["image", *self.label_columns]
        self.features = index.features
        self._fingerprint = index._fingerprint

    def __len__(self) -> int:
        return len(self.index)

    def _image(self, rel: str):
        path = self.root / rel
        if not self.decode:
            return {"bytes": None, "path": str(path)}
        from PIL import Image

        try:
            im = Image.open(path)
            im.load()
        except Exception as exc:
            raise DatasetError(f"cannot read image {path}: {type(exc).__name__}: {exc}; "
                               "the source folder changed since `dvc repro prepare`") from exc
        return im

    def __getitem__(self, key):
        if isinstance(key, str):
            if key == "image":
                return [self._image(p) for p in self.index["path"]]
            return self.index[key]
        row = self.index[int(key)]
        return {"image": self._image(row["path"]), **{c: row[c] for c in self.label_columns}}

    def select(self, indices) -> "SourceSplit":
        return SourceSplit(self.index.select(indices), self.root, self.decode)

    def undecoded(self) -> "SourceSplit":
        return SourceSplit(self.index, self.root, decode=False)
