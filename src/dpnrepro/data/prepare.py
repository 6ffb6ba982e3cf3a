"""Turn a raw source into the prepared splits every stage reads: ``train``, ``minival`` and ``val``.

The split protocol is the paper's (appendix C): train on ``train[:99%]``, select on the minival
``train[99%:]`` (a stratified random 1 %, as big_vision's slice of shuffled records; see
:func:`stratified_holdout`), report the official validation split. Pretraining datasets
(``eval_split: null``) get no validation split. The result is a ``save_to_disk`` directory per
split plus ``manifest.json`` (counts, class balance, content hash), written atomically. With
``data.storage: source`` (large image folders) a split directory holds an index of the source's files
(relative path, label, sha256) instead of a copy of the images (data/source_index.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from dpnrepro.data.pixel_store import STORE_DIR, write_split_store
from dpnrepro.data.sources import idx_as_dataset, load_idx_checked, load_source
from dpnrepro.errors import DatasetError
from dpnrepro.io import atomic_dir, read_json, write_json_atomic

SPLITS = ("train", "minival", "val")
PREPARED = Path("data/prepared")
UPSTREAM = Path("data/upstream")


def prepared_dir(dataset: str = "data") -> Path:
    """Where the params section ``dataset`` is prepared: ``data`` in data/prepared, the pretraining
    datasets (``data_i21k``, ``data_jft``) in data/upstream/<section>."""
    return PREPARED if dataset == "data" else UPSTREAM / dataset


def _subsample(n_total: int, n_keep: int, seed: int) -> np.ndarray:
    """Sorted indices of a seeded random subset of size n_keep (all if n_keep <= 0 or >= n_total)."""
    if n_keep <= 0 or n_keep >= n_total:
        return np.arange(n_total)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_total, size=n_keep, replace=False))


def primary_labels(ds) -> np.ndarray:
    """The class each example is stratified by: its ``label``, or the first of its ``labels``."""
    if "label" in ds.column_names:
        return np.asarray(ds["label"], dtype=np.int64)
    return np.asarray([ids[0] if len(ids) else -1 for ids in ds["labels"]], dtype=np.int64)


def stratified_holdout(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split example indices into (kept, held out) with ``fraction`` of *every class* held out.

    big_vision's ``train[99%:]`` slices TFDS's shuffled records, so its minival is a random 1 % that
    covers every class. Slicing the source's own order instead breaks on class-sorted sources (an
    ImageNet ``imagefolder`` lists its files class by class: the last ~10 classes would all go to
    minival and never to training). Stratifying makes both splits cover every class in proportion,
    whatever order the source returns: each class's examples are permuted with ``seed`` and the first
    ones held out; the per-class counts are apportioned by largest remainder so that the total is
    exactly ``round(fraction * n)`` (at least 1). Both index arrays are sorted (source order).
    """
    n = len(labels)
    n_hold = max(1, int(round(n * fraction)))
    classes, counts = np.unique(labels, return_counts=True)
    quota = counts * (n_hold / n)
    take = np.floor(quota).astype(np.int64)
    for c in np.argsort(-(quota - take), kind="stable")[: n_hold - int(take.sum())]:
        take[c] += 1
    rng = np.random.default_rng(seed)
    held = [rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take)]
    held = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    kept = np.setdiff1d(np.arange(n), held, assume_unique=True)
    return kept, held


def split_rows(train_labels: np.ndarray, n_val: int | None, cfg: dict) -> dict[str, tuple[str, np.ndarray]]:
    """``{prepared split: (raw split, its rows)}``: train[:99%] / train[99%:] as a stratified random split
    (:func:`stratified_holdout`), the official held-out split as ``val`` (none when ``n_val`` is None: no
    ``eval_split``), then the configured seeded subsampling."""
    seed = cfg["seed"]
    kept, held = stratified_holdout(train_labels, cfg["minival_fraction"], seed)
    rows = {"train": ("train", kept[_subsample(len(kept), cfg["train_examples"], seed)]),
            "minival": ("train", held[_subsample(len(held), cfg["minival_examples"], seed + 1)])}
    if n_val is not None:
        rows["val"] = ("val", _subsample(n_val, cfg["val_examples"], seed + 2))
    return rows


def split_protocol(raw: dict, cfg: dict) -> dict:
    """The prepared splits of the raw ``datasets`` splits (:func:`split_rows`)."""
    rows = split_rows(primary_labels(raw["train"]), len(raw["val"]) if "val" in raw else None, cfg)
    return {name: raw[src].select(idx) for name, (src, idx) in rows.items()}


def idx_split_protocol(source: str, wanted: dict[str, str], cfg: dict) -> dict:
    """:func:`split_protocol` of an idx source, PNG-encoding only the rows it keeps (the same datasets: a
    smoke JFT-style split keeps 8,000 of Fashion-MNIST's 60,000 train images, and encoding is most of
    ``prepare``'s time)."""
    arrays = {name: load_idx_checked(source, split) for name, split in wanted.items()}
    rows = split_rows(arrays["train"][1], len(arrays["val"][1]) if "val" in arrays else None, cfg)
    return {name: idx_as_dataset(*arrays[src], rows=idx) for name, (src, idx) in rows.items()}


def warn_if_unbalanced(name: str, counts: list[int], ratio: float = 0.5) -> str | None:
    """A one-line warning when a split misses a class or its rarest class has < ``ratio`` x the
    examples of its most common one (returned, and printed); None when balanced."""
    counts = np.asarray(counts)
    lo, hi = int(counts.argmin()), int(counts.argmax())
    if counts[lo] >= ratio * counts[hi] and counts[lo] > 0:
        return None
    msg = (f"warning: split {name!r} is not class-balanced: class {lo} has {counts[lo]} examples, class {hi} "
           f"has {counts[hi]} ({len(counts)} classes, {int((counts == 0).sum())} empty)")
    print(msg)
    return msg


def attach_label_sets(ds, cfg: dict):
    """A multi-label split (``cfg['multi_label']``): ``labels`` lists from the source, or ``[label,
    parent]`` from ``cfg['label_parents']`` (a class hierarchy, as JFT's). Single-label splits pass through."""
    if not cfg.get("multi_label"):
        if "label" not in ds.column_names:
            raise DatasetError(f"dataset {cfg['source']!r} has no 'label' column (it has {ds.column_names}); "
                               "for label lists set data.multi_label: true")
        return ds
    parents = cfg.get("label_parents")
    if parents is not None:
        labels = np.asarray(ds["label"], dtype=np.int64)
        bad = np.flatnonzero((labels < 0) | (labels >= len(parents)))
        if len(bad):
            raise DatasetError(f"example {bad[0]} has label {labels[bad[0]]} but data.label_parents covers "
                               f"{len(parents)} classes; fix data.label_parents")
        sets = [[int(c), parents[c]] for c in labels]
        return ds.remove_columns("label").add_column("labels", sets)
    if "labels" not in ds.column_names:
        raise DatasetError(f"data.multi_label: dataset {cfg['source']!r} has no 'labels' column of class-id "
                           "lists (imagefolder: a metadata.jsonl with a \"labels\" field); or set data.label_parents")
    return ds.remove_columns("label") if "label" in ds.column_names else ds


def _label_sets(raw, name: str, num_classes: int) -> list[list[int]]:
    """Every example's label ids (a ``label`` id or a ``labels`` list), each checked against ``num_classes``."""
    multi = "labels" in raw.column_names
    label_sets = [list(x) for x in raw["labels"]] if multi else [[x] for x in raw["label"]]
    if len(label_sets) == 0:
        raise DatasetError(f"split {name!r} is empty; check data.source and the subsample sizes")
    for i, ids in enumerate(label_sets):
        if not ids:
            raise DatasetError(f"split {name!r} example {i} has no labels; label it or drop it from the data")
        bad = [c for c in ids if c is None or not 0 <= c < num_classes]
        if bad:
            raise DatasetError(
                f"split {name!r} example {i} has label {bad[0]} outside [0, {num_classes}); "
                "fix the labels or data.num_classes"
            )
    return label_sets


def _corrupt(where: str, error: str) -> DatasetError:
    return DatasetError(f"corrupt image {where}: {error}; remove or replace it, "
                        "or set data.skip_corrupt: true to drop such files with a warning")


def _split_stats(name: str, label_sets: list, file_digests: list, where: list, num_classes: int,
                 skip_corrupt: bool) -> tuple[list[int], list[bytes], dict]:
    """Kept example indices, their file digests, and the split's stats from per-example ``file_digests``
    (sha256 of the file, or the error text of a corrupt one; ``where`` names each file for errors)."""
    keep, corrupt = [], []
    digest = hashlib.sha256()
    for i, d in enumerate(file_digests):
        if isinstance(d, str):
            if not skip_corrupt:
                raise _corrupt(where[i], d)
            corrupt.append(str(where[i]))
            continue
        keep.append(i)
        digest.update(d)
        digest.update(np.asarray(label_sets[i], dtype="<i4").tobytes())
    if corrupt:
        print(f"warning: skipped {len(corrupt)} corrupt image(s) in split {name!r}, e.g. {corrupt[0]}")
    counts = np.bincount(np.concatenate([np.asarray(label_sets[i], dtype=np.int64) for i in keep]),
                         minlength=num_classes)
    return keep, [file_digests[i] for i in keep], {
        "examples": len(keep),
        "class_counts": counts.tolist(),
        "skipped_corrupt": len(corrupt),
        "sha256": digest.hexdigest(),
    }


def check_split(ds, name: str, num_classes: int, skip_corrupt: bool = False):
    """Decode every image and check every label; return the dataset (minus skipped images).

    Labels are a ``label`` id or, for multi-label splits, a non-empty ``labels`` list of ids. A corrupt
    image is an error naming the file, unless ``skip_corrupt`` (then it is counted and dropped, and the
    count is returned in the manifest).
    """
    import datasets
    from PIL import Image

    raw = ds.cast_column("image", datasets.Image(decode=False))
    label_sets = _label_sets(raw, name, num_classes)
    digests, where = [], []
    for i, item in enumerate(tqdm(raw["image"], desc=f"check {name}", unit="img", leave=False)):
        where.append(item.get("path") or f"{name}[{i}]")
        try:
            data = item["bytes"] if item.get("bytes") is not None else Path(item["path"]).read_bytes()
            with Image.open(io.BytesIO(data)) as im:
                im.load()
        except Exception as exc:
            if not skip_corrupt:
                raise _corrupt(where[i], f"{type(exc).__name__}: {exc}") from exc
            digests.append(f"{type(exc).__name__}: {exc}")
            continue
        digests.append(hashlib.sha256(data).digest())
    keep, _, stats = _split_stats(name, label_sets, digests, where, num_classes, skip_corrupt)
    return (ds.select(keep) if stats["skipped_corrupt"] else ds), stats


def check_indexed_split(ds, name: str, num_classes: int, root: str | Path, workers: int = 0,
                        skip_corrupt: bool = False):
    """:func:`check_split` of a ``source``-storage index (``path`` relative to ``root``): the files are
    read and decoded in ``workers`` processes, and each kept row gets its file's ``sha256``."""
    import datasets

    from dpnrepro.data.source_index import check_files

    label_sets = _label_sets(ds, name, num_classes)
    where = [str(Path(root) / p) for p in ds["path"]]
    results = check_files(where, workers, desc=f"check {name}")
    digests = [d if d is not None else err for d, err in results]
    keep, kept_digests, stats = _split_stats(name, label_sets, digests, where, num_classes, skip_corrupt)
    if stats["skipped_corrupt"]:
        ds = ds.select(keep)
    return ds.add_column("sha256", kept_digests, feature=datasets.Value("binary")), stats


def prepare_dataset(cfg: dict, out_dir: str | Path, workers: int = 0) -> dict:
    """Prepare the configured dataset into ``out_dir``; returns the manifest. ``workers``: processes that
    check the files of a ``storage: source`` dataset (0 = one per CPU; an execution setting)."""
    out_dir = Path(out_dir)
    wanted = {"train": cfg["train_split"]}
    if cfg.get("eval_split") is not None:
        wanted["val"] = cfg["eval_split"]
    indexed = cfg.get("storage", "copy") == "source"
    if cfg["format"] == "imagefolder":
        from dpnrepro.data.source_index import skipped_entries

        note = skipped_entries(cfg["source"], wanted)
        if note:
            print(f"note: {note}", file=sys.stderr)
    if indexed:  # an index of the files, read from the source at training time (data/source_index.py)
        from dpnrepro.data.source_index import index_image_folder

        selected = split_protocol(index_image_folder(cfg["source"], wanted), cfg)
    elif cfg["format"] == "idx":
        selected = idx_split_protocol(cfg["source"], wanted, cfg)
    else:
        selected = split_protocol(load_source(cfg["format"], cfg["source"], wanted), cfg)
    found = selected["train"].features.get("label")
    n_found = getattr(found, "num_classes", None)
    parents = cfg.get("label_parents")
    if parents is not None:  # the source's classes are the hierarchy's leaves
        key, says = "label_parents", f"lists {len(parents)}"
    elif not cfg.get("multi_label"):
        key, says = "num_classes", f"is {cfg['num_classes']}"
    else:  # label lists: checked id by id against num_classes (check_split)
        n_found = None
    if n_found is not None and n_found < (len(parents) if parents is not None else cfg["num_classes"]):
        raise DatasetError(f"dataset {cfg['source']} has {n_found} classes but data.{key} {says}; fix data.{key}")
    splits = {name: attach_label_sets(ds, cfg) for name, ds in selected.items()}
    manifest = {"dataset": cfg["name"], "source": str(cfg["source"]), "format": cfg["format"], "splits": {}}
    if cfg.get("multi_label"):
        manifest["multi_label"] = True
    if indexed:
        manifest["storage"] = "source"
    with atomic_dir(out_dir) as tmp:
        for name in (s for s in SPLITS if s in splits):
            if indexed:
                ds, stats = check_indexed_split(splits[name], name, cfg["num_classes"], cfg["source"], workers,
                                                cfg.get("skip_corrupt", False))
            else:
                ds, stats = check_split(splits[name], name, cfg["num_classes"], cfg.get("skip_corrupt", False))
            warn_if_unbalanced(name, stats["class_counts"][: len(parents) if parents is not None else None])
            # A content-derived fingerprint: `datasets` fingerprints an imagefolder by its files' paths and
            # mtimes, which would make the saved state.json (so the DVC hash) differ on every machine.
            ds = ds.flatten_indices(new_fingerprint=stats["sha256"][:16])
            ds.save_to_disk(str(tmp / name))
            _drop_source_sizes(tmp / name / "dataset_info.json")
            manifest["splits"][name] = stats
            if name == "train" and cfg.get("pixel_store_side", 0) > 0:
                manifest["pixel_store"] = write_split_store(ds, tmp / STORE_DIR, cfg["pixel_store_side"])
        if found is not None and hasattr(found, "names"):
            manifest["class_names"] = list(found.names)
        write_json_atomic(tmp / "manifest.json", manifest)
    return manifest


# What `datasets` records about the *source* it read (byte sizes that include the image files' absolute
# paths, checksums): machine-dependent, and nothing reads it back. Dropped so that data/prepared hashes
# the same wherever the project lives.
SOURCE_INFO_KEYS = ("dataset_size", "size_in_bytes", "download_size", "download_checksums", "splits")


def _drop_source_sizes(info_path: Path) -> None:
    info = json.loads(info_path.read_text())
    write_json_atomic(info_path, {k: v for k, v in info.items() if k not in SOURCE_INFO_KEYS})


def load_manifest(prepared_dir: str | Path) -> dict:
    from dpnrepro.restore import restore_fix

    path = Path(prepared_dir) / "manifest.json"
    return read_json(path, error=DatasetError, fix=lambda: restore_fix(path, "prepare"))
