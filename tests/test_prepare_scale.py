"""`data.storage: source`: prepare indexes an image folder (parallel check, no copy of the images) and the
splits read their images from the source folder."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from conftest import data_cfg, make_image_folder
from dpnrepro.data.loader import build_transform, load_split
from dpnrepro.data.prepare import load_manifest, prepare_dataset
from dpnrepro.data.source_index import SourceSplit
from dpnrepro.errors import DatasetError

pytestmark = pytest.mark.usefixtures("hf_cache_in_tmp")


def _cfg(root, **over):
    return data_cfg(root, format="imagefolder", num_classes=2, minival_fraction=0.25, **over)


def test_source_storage_keeps_the_manifest_of_copy_storage(tmp_path):
    root = make_image_folder(tmp_path / "src", per_class=8)
    copy = prepare_dataset(_cfg(root), tmp_path / "copy")
    indexed = prepare_dataset(_cfg(root, storage="source"), tmp_path / "index", workers=1)
    assert indexed.pop("storage") == "source"
    assert indexed == copy  # same counts, class balance and content hash per split
    ds = load_split(tmp_path / "index", "train")
    assert isinstance(ds, SourceSplit) and ds.index.column_names == ["path", "label", "sha256"]
    for i in range(len(ds)):
        row = ds.index[i]
        data = (root / row["path"]).read_bytes()
        assert row["sha256"] == hashlib.sha256(data).digest()
        assert row["path"].startswith("train/") and not row["path"].startswith("/")
    assert ds["label"] == load_split(tmp_path / "copy", "train")["label"]


def test_source_split_rows_are_the_source_images(tmp_path):
    from PIL import Image

    root = make_image_folder(tmp_path / "src", per_class=8)
    prepare_dataset(_cfg(root, storage="source"), tmp_path / "index", workers=1)
    ds = load_split(tmp_path / "index", "val")
    ex = ds[3]
    with Image.open(root / ds.index[3]["path"]) as ref:
        assert np.array_equal(np.asarray(ex["image"]), np.asarray(ref))
    assert ex["label"] == ds.index[3]["label"]
    raw = ds.undecoded()[3]["image"]
    assert raw["bytes"] is None and raw["path"] == str(root / ds.index[3]["path"])
    sub = ds.select([1, 0])
    assert len(sub) == 2 and sub["label"] == [ds["label"][1], ds["label"][0]]
    cfg = {"image_size": 8, "channels": 3, "inception_crop": True, "flip": True, "randaug": "", "backend": "fast"}
    assert build_transform(cfg, train=True)(raw).shape == (3, 8, 8)


def test_parallel_check_writes_the_same_bytes(tmp_path):
    root = make_image_folder(tmp_path / "src", per_class=10)
    prepare_dataset(_cfg(root, storage="source"), tmp_path / "one", workers=1)
    prepare_dataset(_cfg(root, storage="source"), tmp_path / "two", workers=2)
    files = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "two") for p in (tmp_path / "two").rglob("*") if p.is_file())
    for f in files:
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f


def test_corrupt_file_is_one_line_with_its_path_and_nothing_is_written(tmp_path):
    root = make_image_folder(tmp_path / "src", per_class=6, corrupt="bad.jpg")
    out = tmp_path / "prepared"
    with pytest.raises(DatasetError) as err:
        prepare_dataset(_cfg(root, storage="source"), out, workers=2)
    msg = str(err.value)
    assert "\n" not in msg and str(root / "train" / "a" / "bad.jpg") in msg
    assert not out.exists() and not list(tmp_path.glob("prepared*"))
    m = prepare_dataset(_cfg(root, storage="source", skip_corrupt=True), out, workers=2)
    assert sum(s["skipped_corrupt"] for s in m["splits"].values()) == 1
    assert "train/a/bad.jpg" not in [*load_split(out, "train").index["path"], *load_split(out, "minival").index["path"]]


def test_unknown_class_folder_in_val_is_an_error(tmp_path):
    root = make_image_folder(tmp_path / "src", per_class=6)
    (root / "test" / "a").rename(root / "test" / "zz")
    with pytest.raises(DatasetError, match="class folder 'zz'"):
        prepare_dataset(_cfg(root, storage="source"), tmp_path / "out", workers=1)


@pytest.mark.parametrize("over", [dict(format="idx"), dict(format="imagefolder", pixel_store_side=28)])
def test_source_storage_refuses_what_it_cannot_index(tmp_path, over):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="storage: source"):
        data_cfg(tmp_path, storage="source", **over)


def test_copy_storage_manifest_has_no_storage_key(tmp_path):
    """The default storage writes what it wrote before (the smoke outputs stay byte-identical)."""
    root = make_image_folder(tmp_path / "src", per_class=8)
    prepare_dataset(_cfg(root), tmp_path / "copy")
    manifest = load_manifest(tmp_path / "copy")
    assert "storage" not in manifest
    assert "image" in load_split(tmp_path / "copy", "train").column_names
    assert json.loads((tmp_path / "copy" / "manifest.json").read_text()) == manifest


def test_photo_folder_is_real_imagenet_sized_jpegs_the_same_for_any_workers(tmp_path):
    from PIL import Image

    from photo_folder import LONG_SIDE, source_photos, write_photo_folder

    one = write_photo_folder(tmp_path / "one", n_train=54, n_val=27, workers=1)
    two = write_photo_folder(tmp_path / "two", n_train=54, n_val=27, workers=2)
    assert one == two and one["photos"] == 27 and one["classes"] == 26
    files = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*.jpg"))
    assert len(files) == 81
    photos = dict((name, path) for name, path in source_photos())
    for f in files:
        data = (tmp_path / "one" / f).read_bytes()
        assert data == (tmp_path / "two" / f).read_bytes()
        with Image.open(tmp_path / "one" / f) as im:
            assert im.format == "JPEG" and LONG_SIDE[0] <= max(im.size) <= LONG_SIDE[1] and im.mode == "RGB"
            assert f.parts[1] in photos
    # distinct crops, not copies: no two files of a class are the same bytes
    assert len({(tmp_path / "one" / f).read_bytes() for f in files}) == len(files)
    m = prepare_dataset(data_cfg(tmp_path / "one", format="imagefolder", num_classes=26, eval_split="validation",
                                 minival_fraction=0.1, storage="source"), tmp_path / "prep", workers=2)
    assert m["splits"]["train"]["examples"] + m["splits"]["minival"]["examples"] == 54


def test_folder_report_labels_the_100k_column_an_extrapolation():
    from bench_folder import render_markdown

    path = {"backend": "pil", "crop_sampler": "big_vision", "img_per_s_per_core": 250.0,
            "img_per_s_per_core_ci": [240.0, 260.0], "wall_img_per_s": 200.0, "cores_for_b16": 13.2}
    prep = {"copy": {"storage": "copy", "workers": 1, "wall_s": 12.3, "cpu_s": 11.0, "bytes_written": 600_000_000,
                     "bytes_datasets_cache": 1_000_000, "sha256": {"train": "x"}},
            "source_1_worker": {"storage": "source", "workers": 1, "wall_s": 8.0, "cpu_s": 7.5,
                                "bytes_written": 1_000_000, "bytes_datasets_cache": 0, "sha256": {"train": "y"}}}
    res = {"command": "python tools/bench_folder.py", "hardware": "CPU x", "load_before": [1.0], "load_after": [2.0],
           "folder": {"classes": 26, "photos": 27, "wall_s": 5.0,
                      "splits": {"train": {"images": 9_000, "jpeg_bytes": 450_000_000},
                                 "validation": {"images": 1_000, "jpeg_bytes": 50_000_000}}},
           "input": {"image_size": 224, "randaug": "r", "rounds": 10, "n_per_round": 100, "paths": {"p": path}},
           "prepare": prep}
    md = render_markdown(res)
    assert "| `pil` | `big_vision` (full profile) | 250 [240, 260] | 200 | 13.2 |" in md
    assert "**extrapolation** (x10" in md
    assert "| copy | 1 | 12.3 | 11.0 | 600.0 MB | 1.0 MB | 123 s, 6,000.0 MB |" in md
    assert "10,000 images" in md and "differ" in md
    # a folder of 100k images is the measurement itself: no extrapolated column
    res["folder"]["splits"]["train"]["images"] = 99_000
    md = render_markdown(res)
    assert "extrapolat" not in md and "100,000 images" in md
    assert "| copy | 1 | 12.3 | 11.0 | 600.0 MB | 1.0 MB |\n" in md


def test_committed_folder_report_is_rendered_from_its_measurements():
    from pathlib import Path

    from bench_folder import render_markdown

    root = Path(__file__).resolve().parents[1]
    res = json.loads((root / "benchmarks/measured/input_folder.json").read_text())
    assert (root / "reports/input_folder.md").read_text() == render_markdown(res)


@pytest.mark.parametrize("backend", ["pil", "fast"])
def test_training_reads_the_same_tensors_from_source_as_from_the_copy(tmp_path, backend):
    """The trainer's view (undecoded for `fast`, seeded per example) of a source split = of a copy split."""
    import torch

    from dpnrepro.data.fast import undecoded
    from dpnrepro.data.loader import TransformedSplit

    root = make_image_folder(tmp_path / "src", per_class=8)
    prepare_dataset(_cfg(root), tmp_path / "copy")
    prepare_dataset(_cfg(root, storage="source"), tmp_path / "index", workers=1)
    cfg = {"image_size": 8, "channels": 3, "inception_crop": True, "flip": True, "randaug": "rand-n2-m10",
           "backend": backend, "crop_min_area": 0.3}
    views = []
    for where in ("copy", "index"):
        ds = load_split(tmp_path / where, "train")
        views.append(TransformedSplit(undecoded(ds) if backend == "fast" else ds,
                                      build_transform(cfg, train=True, uint8=True)))
    for i in range(len(views[0])):
        (a, ya), (b, yb) = views[0][(i, 100 + i)], views[1][(i, 100 + i)]
        assert torch.equal(a, b) and ya == yb


def _jft_folder(root, label_sets, order_seed=1):
    """A JFT-style folder: ``train/`` images (one in a subfolder, one unlisted) and a metadata.jsonl whose
    lines are in another order than the file names sort in."""
    import random

    from PIL import Image

    rng = np.random.default_rng(0)
    (root / "train" / "sub").mkdir(parents=True)
    lines = []
    for i, ids in enumerate(label_sets):
        name = f"sub/{i}.jpg" if i == 3 else f"{i}.jpg"
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(root / "train" / name, quality=90)
        lines.append(json.dumps({"file_name": name, "labels": ids, "note": f"x{i}"}))
    Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(root / "train" / "unlisted.jpg")
    random.Random(order_seed).shuffle(lines)
    (root / "train" / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return root


JFT_SETS = [[0], [1, 3], [2], [0, 2, 4], [4], [1], [3, 0], [2, 1], [4, 2], [0], [1], [3]]


def _jft_cfg(root, **over):
    return data_cfg(root, format="imagefolder", eval_split=None, num_classes=5, multi_label=True,
                    minival_fraction=0.25, **over)


def test_source_storage_reads_label_lists_from_metadata_as_copy_storage_does(tmp_path):
    # datasets' imagefolder builder (copy storage) keeps the metadata's line order and skips unlisted files;
    # the index must give the same examples in the same order, so the same manifest (counts, class balance,
    # content hash) and the same label sets per split.
    root = _jft_folder(tmp_path / "jft", JFT_SETS)
    copy = prepare_dataset(_jft_cfg(root), tmp_path / "copy")
    indexed = prepare_dataset(_jft_cfg(root, storage="source"), tmp_path / "index", workers=2)
    assert indexed.pop("storage") == "source"
    assert indexed == copy and copy["splits"]["train"]["examples"] + copy["splits"]["minival"]["examples"] == 12
    for split in ("train", "minival"):
        ds = load_split(tmp_path / "index", split)
        assert isinstance(ds, SourceSplit) and ds.column_names == ["image", "labels"]
        assert [list(x) for x in ds["labels"]] == [list(x) for x in load_split(tmp_path / "copy", split)["labels"]]
    ds = load_split(tmp_path / "index", "train")
    assert "train/sub/3.jpg" in [*ds.index["path"], *load_split(tmp_path / "index", "minival").index["path"]]
    assert "train/unlisted.jpg" not in ds.index["path"]
    row = ds[0]
    with __import__("PIL.Image").Image.open(root / ds.index[0]["path"]) as ref:
        assert np.array_equal(np.asarray(row["image"]), np.asarray(ref)) and row["labels"] == ds.index[0]["labels"]


@pytest.mark.parametrize("line, message", [
    ('{"file_name": "0.jpg", "labels": [0]', "metadata.jsonl:2: not a JSON object"),
    ('{"labels": [0]}', 'metadata.jsonl:2: needs "file_name"'),
    ('{"file_name": "../x.jpg", "labels": [0]}', 'metadata.jsonl:2: needs "file_name"'),
    ('{"file_name": "0.jpg", "labels": ["cat"]}', 'metadata.jsonl:2: "labels" must be a list of class ids'),
    ('{"file_name": "0.jpg", "label": 2}', "metadata.jsonl:2: has label fields \\['label'\\]"),
    ('{"file_name": "missing.jpg", "labels": [0]}', "corrupt image .*missing.jpg: FileNotFoundError"),
])
def test_a_bad_metadata_line_is_one_line_naming_it_and_nothing_is_written(tmp_path, line, message):
    root = _jft_folder(tmp_path / "jft", JFT_SETS[:4])
    meta = root / "train" / "metadata.jsonl"
    first = meta.read_text().splitlines()[0]
    meta.write_text(first + "\n" + line + "\n")
    out = tmp_path / "prepared"
    with pytest.raises(DatasetError, match=message) as err:
        prepare_dataset(_jft_cfg(root, storage="source"), out, workers=1)
    assert "\n" not in str(err.value) and not out.exists() and not list(tmp_path.glob("prepared*"))


def test_metadata_forms_the_index_does_not_read_are_one_clear_error(tmp_path):
    root = _jft_folder(tmp_path / "jft", JFT_SETS[:4])
    (root / "train" / "sub" / "metadata.jsonl").write_text('{"file_name": "3.jpg", "labels": [1]}\n')
    with pytest.raises(DatasetError, match="sub/metadata.jsonl: data.storage: source reads one metadata.jsonl"):
        prepare_dataset(_jft_cfg(root, storage="source"), tmp_path / "out", workers=1)


@pytest.mark.parametrize("extra, message", [
    ("a/metadata.jsonl", "train/a/metadata.jsonl: data.storage: source reads one metadata.jsonl at a split's root"),
    ("a/deeper/x.jpg", "train/a/deeper: data.storage: source lists <split>/<class>/<image> files only"),
])
def test_class_folders_hold_images_only(tmp_path, extra, message):
    # What the listing would skip but `datasets` (copy storage) would read is an error, found in the one scan.
    root = make_image_folder(tmp_path / "src", per_class=6)
    image = next(iter(sorted((root / "train" / "a").iterdir())))
    (root / "train" / extra).parent.mkdir(parents=True, exist_ok=True)
    (root / "train" / extra).write_bytes(image.read_bytes())
    with pytest.raises(DatasetError, match=message):
        prepare_dataset(_cfg(root, storage="source"), tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()
