"""Data: idx reader validation, the train[:99%]/train[99%:]/val protocol, atomic prepare, step-indexed batches."""
from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pytest
import torch

from conftest import (
    IDX_TEST,
    IDX_TRAIN,
    TEST_OFFSET,
    data_cfg,
    idx_images,
    make_idx_dataset,
    make_image_folder,
    write_idx,
)
from dpnrepro.data.loader import StepBatchSampler, TransformedSplit, build_transform, load_split
from dpnrepro.data.prepare import load_manifest, prepare_dataset, stratified_holdout, warn_if_unbalanced
from dpnrepro.data.sources import load_idx, read_idx
from dpnrepro.errors import DatasetError

pytestmark = pytest.mark.usefixtures("hf_cache_in_tmp")

# --- idx reader --------------------------------------------------------------------------------------


def test_read_idx_roundtrip(tmp_path):
    imgs = idx_images(5)
    assert np.array_equal(read_idx(write_idx(tmp_path / "a", imgs).with_suffix("")), imgs)  # via .gz
    assert np.array_equal(read_idx(write_idx(tmp_path / "b", imgs, gz=False)), imgs)  # plain file


def test_read_idx_truncated(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    write_idx(path, idx_images(4), gz=False)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DatasetError, match="truncated") as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_truncated_gz(tmp_path):
    path = tmp_path / "train-labels-idx1-ubyte"
    gz = write_idx(path, np.arange(10))
    blob = gzip.decompress(gz.read_bytes())[:-3]
    gz.write_bytes(gzip.compress(blob))
    with pytest.raises(DatasetError) as info:
        read_idx(path)
    assert str(path) in str(info.value) and "7 of 10 bytes" in str(info.value)


@pytest.mark.parametrize("header", [b"\x00\x00\x0d\x01", b"\x08\x03\x00\x00", b"PK\x03\x04"])
def test_read_idx_bad_magic(tmp_path, header):
    path = tmp_path / "t10k-labels-idx1-ubyte"
    path.write_bytes(header + b"\x00\x00\x00\x02" + b"\x01\x02")
    with pytest.raises(DatasetError, match="bad magic") as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_tiny_file(tmp_path):
    path = tmp_path / "x-idx1-ubyte"
    path.write_bytes(b"\x00\x00")
    with pytest.raises(DatasetError, match="corrupt idx file") as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_load_idx_missing_dir_hints_apt_get(tmp_path):
    with pytest.raises(DatasetError) as info:
        load_idx(tmp_path / "nowhere", "train")
    msg = str(info.value)
    assert str(tmp_path / "nowhere") in msg and "apt-get install dataset-fashion-mnist" in msg


def test_load_idx_missing_file_hints_apt_get(tmp_path):
    root = make_idx_dataset(tmp_path / "idx")
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetError, match="apt-get install dataset-fashion-mnist") as info:
        load_idx(root, "test")
    assert "t10k-labels-idx1-ubyte" in str(info.value)


def test_load_idx_inconsistent_lengths(tmp_path):
    root = make_idx_dataset(tmp_path / "idx")
    write_idx(root / "train-labels-idx1-ubyte", np.zeros(IDX_TRAIN - 1, np.uint8))
    with pytest.raises(DatasetError, match="inconsistent"):
        load_idx(root, "train")


# --- prepare ---------------------------------------------------------------------------------------


def _ids(prepared, split) -> list[int]:
    """The raw example ids (pixel (0, 0)) of a prepared split, in order."""
    return [int(np.asarray(im)[0, 0]) for im in load_split(prepared, split)["image"]]


def test_prepare_split_protocol_and_manifest(idx_dataset, tmp_path):
    out = tmp_path / "prepared"
    cfg = data_cfg(idx_dataset, train_examples=20)
    manifest = prepare_dataset(cfg, out)
    assert manifest == load_manifest(out) == json.loads((out / "manifest.json").read_text())

    n_minival = round(IDX_TRAIN * 0.1)  # train[90%:] here (minival_fraction 0.1): a stratified random 10 %
    minival_ids = _ids(out, "minival")
    assert len(minival_ids) == n_minival and minival_ids == sorted(minival_ids)
    # train is a sorted, seeded subsample of the rest only: never a minival example
    train_ids = _ids(out, "train")
    assert len(train_ids) == 20 and train_ids == sorted(set(train_ids))
    assert not set(train_ids) & set(minival_ids)
    # val is the whole official test split
    assert _ids(out, "val") == [TEST_OFFSET + i for i in range(IDX_TEST)]
    # labels travel with their images
    ds = load_split(out, "train")
    assert [int(y) for y in ds["label"]] == [i % 10 for i in train_ids]

    splits = manifest["splits"]
    assert set(splits) == {"train", "minival", "val"}
    assert {k: v["examples"] for k, v in splits.items()} == {"train": 20, "minival": n_minival, "val": IDX_TEST}
    assert sorted(splits["minival"]["class_counts"]) == [0] * 4 + [1] * 6  # 6 of 10 equal classes, 1 each
    assert splits["val"]["class_counts"] == [3] * 10
    for stats in splits.values():
        assert sum(stats["class_counts"]) == stats["examples"] and len(stats["class_counts"]) == 10
        assert len(stats["sha256"]) == 64 and stats["skipped_corrupt"] == 0
    assert manifest["class_names"][0] == "T-shirt/top" and len(manifest["class_names"]) == 10
    assert manifest["format"] == "idx" and manifest["source"] == str(idx_dataset)
    assert not list(tmp_path.glob(".prepared.*"))  # no temp directories left behind


def test_prepare_is_deterministic_and_seeded(idx_dataset, tmp_path):
    cfg = data_cfg(idx_dataset, train_examples=20, val_examples=10)
    a = prepare_dataset(cfg, tmp_path / "a")
    b = prepare_dataset(cfg, tmp_path / "b")
    assert a["splits"] == b["splits"]
    assert _ids(tmp_path / "a", "train") == _ids(tmp_path / "b", "train")

    c = prepare_dataset(data_cfg(idx_dataset, train_examples=20, val_examples=10, seed=1), tmp_path / "c")
    assert _ids(tmp_path / "c", "train") != _ids(tmp_path / "a", "train")
    assert c["splits"]["train"]["sha256"] != a["splits"]["train"]["sha256"]
    assert c["splits"]["val"]["sha256"] != a["splits"]["val"]["sha256"]
    # the seed also draws the stratified minival
    assert c["splits"]["minival"]["sha256"] != a["splits"]["minival"]["sha256"]


def test_minival_of_a_class_sorted_image_folder_covers_every_class(tmp_path, hf_cache_in_tmp, capsys):
    """An ImageNet-style image folder lists its files class by class. A tail slice (the old protocol)
    put the last classes wholly into minival and none into training; the stratified split holds out
    the same fraction of every class and trains on every class."""
    classes = tuple(f"n{i:08d}" for i in range(8))
    root = make_image_folder(tmp_path / "folder", classes=classes, per_class=10)
    manifest = prepare_dataset(data_cfg(root, format="imagefolder", num_classes=8, minival_fraction=0.2),
                               tmp_path / "prepared")
    counts = {k: v["class_counts"] for k, v in manifest["splits"].items()}
    assert counts["minival"] == [2] * 8, counts  # 20 % of each class, not the last 2 classes whole
    assert counts["train"] == [8] * 8, counts    # every class is trained on
    assert "not class-balanced" not in capsys.readouterr().out


@pytest.mark.parametrize("examples", [{"train_examples": 20, "val_examples": 12}, {}])
def test_an_idx_source_is_split_as_any_source_encoding_only_the_rows_kept(idx_dataset, monkeypatch, examples):
    """prepare's idx path gives the datasets split_protocol makes of load_source's splits, row for row and byte
    for byte, but PNG-encodes only the rows it keeps (Fashion-MNIST's 60,000 train images: ~20 s per section)."""
    from dpnrepro.data import prepare, sources

    cfg = data_cfg(idx_dataset, **examples)
    wanted = {"train": "train", "val": "test"}
    generic = prepare.split_protocol(sources.load_source("idx", str(idx_dataset), wanted), cfg)
    encoded = []
    real = sources.idx_as_dataset

    def counting(images, labels, rows=None):
        ds = real(images, labels, rows)
        encoded.append(len(ds))
        return ds

    monkeypatch.setattr(prepare, "idx_as_dataset", counting)
    kept = prepare.idx_split_protocol(str(idx_dataset), wanted, cfg)
    assert list(kept) == list(generic) == ["train", "minival", "val"]
    for name, ds in kept.items():
        assert ds.features == generic[name].features
        assert ds.flatten_indices().data.table.equals(generic[name].flatten_indices().data.table), name
    assert sorted(encoded) == sorted(len(ds) for ds in generic.values())  # nothing encoded but the kept rows
    if examples:
        assert sum(encoded) < IDX_TRAIN + IDX_TEST


def test_stratified_holdout_apportions_exactly_and_is_seeded():
    labels = np.repeat(np.arange(3), [50, 30, 20])
    kept, held = stratified_holdout(labels, 0.05, seed=0)
    assert len(held) == 5 and len(kept) == 95 and not set(kept) & set(held)
    # quotas 2.5 / 1.5 / 1.0: floors 2 + 1 + 1, the one left over goes to the largest remainder (class 0 first)
    assert np.bincount(labels[held], minlength=3).tolist() == [3, 1, 1]
    again, _ = stratified_holdout(labels, 0.05, seed=0)
    other, _ = stratified_holdout(labels, 0.05, seed=1)
    assert np.array_equal(kept, again) and not np.array_equal(kept, other)


def test_unbalanced_split_gets_a_one_line_warning_with_counts(capsys):
    assert warn_if_unbalanced("train", [10, 10, 10]) is None
    msg = warn_if_unbalanced("minival", [10, 0, 3])
    assert msg == capsys.readouterr().out.strip()
    assert "\n" not in msg and "split 'minival' is not class-balanced: class 1 has 0 examples, class 0 has 10" in msg


def test_pretraining_data_without_eval_split_stores_no_val(idx_dataset, tmp_path):
    manifest = prepare_dataset(data_cfg(idx_dataset, eval_split=None), tmp_path / "prepared")
    assert set(manifest["splits"]) == {"train", "minival"}
    assert not (tmp_path / "prepared" / "val").exists()


def test_prepare_replaces_previous_output(idx_dataset, tmp_path):
    out = tmp_path / "prepared"
    prepare_dataset(data_cfg(idx_dataset, train_examples=20), out)
    m = prepare_dataset(data_cfg(idx_dataset, train_examples=10), out)
    assert load_manifest(out) == m and len(_ids(out, "train")) == 10


def test_prepare_label_outside_num_classes(idx_dataset, tmp_path):
    # the idx source has 10 class names and labels 0..9; telling prepare there are 5 classes must fail
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match=r"label \d+ outside \[0, 5\)"):
        prepare_dataset(data_cfg(idx_dataset, num_classes=5), out)
    assert not out.exists()


def test_prepare_idx_label_out_of_range_is_dataset_error(tmp_path):
    labels = np.arange(IDX_TRAIN) % 10
    labels[7] = 12
    root = make_idx_dataset(tmp_path / "idx", train_labels=labels)
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match="12"):
        prepare_dataset(data_cfg(root), out)
    assert not out.exists()


def test_prepare_fewer_classes_than_configured(tmp_path):
    root = make_image_folder(tmp_path / "folder", classes=("a", "b"))
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match="has 2 classes but data.num_classes is 3"):
        prepare_dataset(data_cfg(root, format="imagefolder", num_classes=3), out)
    assert not out.exists()


def test_prepare_imagefolder(tmp_path):
    root = make_image_folder(tmp_path / "folder", classes=("a", "b"), per_class=6)
    m = prepare_dataset(data_cfg(root, format="imagefolder", num_classes=2, minival_fraction=0.25),
                        tmp_path / "out")
    assert {k: v["examples"] for k, v in m["splits"].items()} == {"train": 9, "minival": 3, "val": 6}
    assert m["class_names"] == ["a", "b"] and m["splits"]["val"]["class_counts"] == [3, 3]


def test_prepare_corrupt_image_is_named_and_nothing_is_written(tmp_path):
    root = make_image_folder(tmp_path / "folder", corrupt="bad.jpg")
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match="skip_corrupt") as info:
        prepare_dataset(data_cfg(root, format="imagefolder", num_classes=2), out)
    assert "bad.jpg" in str(info.value) and "corrupt image" in str(info.value)
    assert not out.exists()
    assert not list(tmp_path.glob(".out.*")), "temporary output left behind"


def test_prepare_corrupt_image_skipped(tmp_path):
    root = make_image_folder(tmp_path / "folder", corrupt="bad.jpg", per_class=6)
    out = tmp_path / "out"
    m = prepare_dataset(data_cfg(root, format="imagefolder", num_classes=2, skip_corrupt=True), out)
    splits = m["splits"]
    assert sum(s["skipped_corrupt"] for s in splits.values()) == 1
    assert splits["train"]["examples"] + splits["minival"]["examples"] == 12  # 13 files, 1 dropped
    for name, s in splits.items():
        ds = load_split(out, name)
        assert len(ds) == s["examples"]
        for im in ds["image"]:
            im.load()  # every kept image decodes


def test_prepare_failure_keeps_previous_output(idx_dataset, tmp_path):
    out = tmp_path / "out"
    good = prepare_dataset(data_cfg(idx_dataset), out)
    with pytest.raises(DatasetError):
        prepare_dataset(data_cfg(idx_dataset, num_classes=5), out)
    assert load_manifest(out) == good and len(_ids(out, "val")) == IDX_TEST
    assert not list(tmp_path.glob(".out.*"))


# --- step-indexed batches --------------------------------------------------------------------------


def test_sampler_resume_gives_the_same_batches():
    kw = dict(seed=3, total_steps=40)
    full = StepBatchSampler(64, 8, start_step=0, **kw)
    batches = list(full)
    assert len(batches) == 40
    for s in (0, 5, 8, 17, 39):
        resumed = StepBatchSampler(64, 8, start_step=s, **kw)
        assert len(resumed) == 40 - s
        assert list(resumed) == batches[s:]
        assert resumed.batch_for_step(s) == full.batch_for_step(s) == batches[s]


def test_sampler_covers_each_index_once_per_epoch():
    sampler = StepBatchSampler(64, 8, seed=0, start_step=0, total_steps=24)
    epochs = [[i for s in range(e * 8, (e + 1) * 8) for i, _ in sampler.batch_for_step(s)] for e in range(3)]
    for ids in epochs:
        assert sorted(ids) == list(range(64))
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled every epoch
    # every example of every step gets its own augmentation seed
    seeds = [k for s in range(24) for _, k in sampler.batch_for_step(s)]
    assert len(set(seeds)) == len(seeds)


def test_sampler_drops_the_remainder_without_repeats():
    sampler = StepBatchSampler(70, 8, seed=0, start_step=0, total_steps=8)
    ids = [i for b in sampler for i, _ in b]
    assert len(ids) == 64 == len(set(ids)) and all(0 <= i < 70 for i in ids)


def test_sampler_ranks_slice_the_global_batch():
    kw = dict(seed=1, start_step=0, total_steps=12)
    single = StepBatchSampler(64, 8, **kw)
    r0 = StepBatchSampler(64, 8, rank=0, world_size=2, **kw)
    r1 = StepBatchSampler(64, 8, rank=1, world_size=2, **kw)
    for s in range(12):
        a, b = r0.batch_for_step(s), r1.batch_for_step(s)
        assert len(a) == len(b) == 4
        assert a + b == single.batch_for_step(s)  # same indices AND same per-example seeds


def test_sampler_seed_changes_order():
    a = StepBatchSampler(64, 8, seed=0, start_step=0, total_steps=1).batch_for_step(0)
    b = StepBatchSampler(64, 8, seed=1, start_step=0, total_steps=1).batch_for_step(0)
    assert [i for i, _ in a] != [i for i, _ in b]


def test_sampler_refuses_too_small_split():
    with pytest.raises(DatasetError, match="fewer than one batch"):
        StepBatchSampler(5, 8, seed=0, start_step=0, total_steps=1)


def test_transformed_split_is_seeded_and_isolated(idx_dataset, tmp_path):
    prepare_dataset(data_cfg(idx_dataset), tmp_path / "p")
    ds = load_split(tmp_path / "p", "train")
    cfg = dict(image_size=28, channels=1, eval_resize=28, inception_crop=True, flip=True, randaug="")
    split = TransformedSplit(ds, build_transform(cfg, train=True))

    torch.manual_seed(123)
    random.seed(123)
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    x1, y1 = split[(3, 77)]
    x2, y2 = split[(3, 77)]
    x3, _ = split[(3, 78)]
    assert torch.equal(torch.get_rng_state(), torch_state), "global torch RNG was advanced"
    assert random.getstate() == py_state, "global Python RNG was advanced"
    assert torch.equal(x1, x2) and y1 == y2 == 3
    assert not torch.equal(x1, x3)  # the per-example seed does drive the augmentation
    assert x1.shape == (1, 28, 28) and x1.dtype == torch.float32
    assert -1.0 <= float(x1.min()) and float(x1.max()) <= 1.0


def test_randaug_on_grayscale(idx_dataset, tmp_path):
    prepare_dataset(data_cfg(idx_dataset), tmp_path / "p")
    ds = load_split(tmp_path / "p", "train")
    cfg = dict(image_size=28, channels=1, eval_resize=28, inception_crop=False, flip=False, randaug="rand-m9-n2")
    split = TransformedSplit(ds, build_transform(cfg, train=True))
    outs = [split[(i % len(ds), seed)][0] for i, seed in enumerate(range(16))]
    assert all(x.shape == (1, 28, 28) for x in outs)
    assert torch.equal(split[(0, 0)][0], outs[0])


def test_eval_transform_is_deterministic(idx_dataset, tmp_path):
    prepare_dataset(data_cfg(idx_dataset), tmp_path / "p")
    ds = load_split(tmp_path / "p", "val")
    cfg = dict(image_size=28, channels=1, eval_resize=28)
    split = TransformedSplit(ds, build_transform(cfg, train=False))
    x, y = split[0]
    raw = np.asarray(ds[0]["image"], dtype=np.float32)
    assert torch.allclose(x[0], torch.from_numpy(raw / 255.0 * 2 - 1), atol=1e-6)  # value_range(-1, 1)
    assert y == 0


def test_load_split_missing(tmp_path):
    with pytest.raises(DatasetError, match="dvc repro prepare"):
        load_split(tmp_path, "train")
    with pytest.raises(DatasetError, match="manifest.json"):
        load_manifest(tmp_path)


def test_repeated_augmentation_batches_hold_copies_with_distinct_seeds():
    from dpnrepro.data.loader import StepBatchSampler

    s = StepBatchSampler(50, 12, seed=0, start_step=0, total_steps=5, repeats=3)
    batch = s.batch_for_step(1)
    idx = [i for i, _ in batch]
    assert len(batch) == 12 and len(set(idx)) == 4 and all(idx.count(i) == 3 for i in set(idx))
    assert len({seed for _, seed in batch}) == 12  # every copy is augmented differently
    assert s.steps_per_epoch == 50 // 4
    odd = [i for i, _ in StepBatchSampler(50, 10, seed=0, start_step=0, total_steps=5, repeats=3).batch_for_step(0)]
    assert len(odd) == 10 and len(set(odd)) == 4 and odd[:9] == [i for i in odd[:9:3] for _ in range(3)]


def test_hub_name_offline_is_one_clear_line(monkeypatch, tmp_path):
    """A hub dataset name with HF_*_OFFLINE=1 and an empty cache: a DatasetError that says what to do."""
    from dpnrepro.data.sources import load_source

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    with pytest.raises(DatasetError) as err:
        load_source("hub", "some-org/some-dataset-that-is-not-cached", {"train": "train", "val": "test"})
    msg = str(err.value)
    assert "\n" not in msg and "some-org/some-dataset-that-is-not-cached" in msg
    assert "offline" in msg and "save_to_disk" in msg
    assert "OfflineModeIsEnabled" in msg, msg  # refused by datasets' offline mode, not after trying the network


# --- multi-label (JFT-style) data ---------------------------------------------------------------------

PARENTS = [10, 11, 10, 11, 10, 12, 10, 12, 13, 12]  # the smoke profile's Fashion-MNIST hierarchy


def test_prepare_label_parents_gives_class_and_parent(idx_dataset, tmp_path):
    out = tmp_path / "prepared"
    m = prepare_dataset(data_cfg(idx_dataset, num_classes=14, multi_label=True, label_parents=PARENTS), out)
    ds = load_split(out, "train")
    assert "label" not in ds.column_names
    ids = _ids(out, "train")
    assert [list(x) for x in ds["labels"]] == [[i % 10, PARENTS[i % 10]] for i in ids]
    assert m["multi_label"] is True
    for stats in m["splits"].values():
        counts = stats["class_counts"]
        assert len(counts) == 14 and sum(counts) == 2 * stats["examples"]
        assert sum(counts[10:]) == sum(counts[:10]) == stats["examples"]


def test_multi_label_split_yields_multi_hot_targets(idx_dataset, tmp_path):
    out = tmp_path / "prepared"
    prepare_dataset(data_cfg(idx_dataset, num_classes=14, multi_label=True, label_parents=PARENTS), out)
    ds = load_split(out, "train")
    tf = build_transform({"image_size": 28, "channels": 1, "eval_resize": 28}, train=False)
    x, y = TransformedSplit(ds, tf, num_classes=14)[0]
    c = ds[0]["labels"][0]
    assert y.shape == (14,) and y.sum() == 2 and y[c] == 1 and y[PARENTS[c]] == 1
    with pytest.raises(ValueError, match="num_classes"):
        TransformedSplit(ds, tf)


@pytest.mark.parametrize("multi_label", [False, True])
def test_a_batched_read_gives_the_rows_one_by_one(idx_dataset, tmp_path, multi_label):
    extra = dict(num_classes=14, multi_label=True, label_parents=PARENTS) if multi_label else {}
    prepare_dataset(data_cfg(idx_dataset, **extra), tmp_path / "p")
    ds = load_split(tmp_path / "p", "val")
    split = TransformedSplit(ds, build_transform({"image_size": 28, "channels": 1, "eval_resize": 24}, train=False),
                             num_classes=14 if multi_label else None)
    keys = [5, 0, 3, 3, 7]
    rows, batch = [split[k] for k in keys], split.__getitems__(keys)
    assert len(batch) == len(rows) and all(torch.equal(x, bx) for (x, _), (bx, _) in zip(rows, batch))
    assert all(torch.equal(torch.as_tensor(y), torch.as_tensor(by)) for (_, y), (_, by) in zip(rows, batch))
    assert torch.equal(split.__getitems__([(3, 77)])[0][0], split[(3, 77)][0])  # training keys: row by row


class _Draws:
    """A transform drawing from every generator the per-example seeding covers, normal samples included (whose
    cached second value a reseed must clear too): what it returns is the draws, in order."""

    def __call__(self, image):
        return torch.cat([torch.rand(2), torch.randn(3), torch.tensor([random.random(), random.gauss(0, 1),
                                                                       float(random.randrange(1000))])])


def _seeded_alone(transform, image, seed):
    """What an example drew before batches shared one RNG save: its own fork, seeded by its seed."""
    py_state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        out = transform(image)
    random.setstate(py_state)
    return out


@pytest.mark.parametrize("store", [False, True])
def test_a_batch_draws_per_example_what_each_example_draws_alone(idx_dataset, tmp_path, store):
    """A training batch is transformed under one save of the global RNGs: each example still draws exactly what
    it draws seeded alone (the smoke recipe's flips, a randaug recipe's choices, normal samples), whatever
    precedes it in the batch, and the global generators end where they were."""
    from dpnrepro.data.fast import undecoded
    from dpnrepro.data.pixel_store import STORE_DIR, PixelStoreSplit

    prepare_dataset(data_cfg(idx_dataset, pixel_store_side=28 if store else 0), tmp_path / "p")
    ds = load_split(tmp_path / "p", "train")
    ds = PixelStoreSplit(ds, tmp_path / "p" / STORE_DIR) if store else ds
    keys = [(5, 11), (0, 12), (3, 11), (3, 13), (7, 2**40 + 1)]
    torch.manual_seed(123)
    random.seed(123)
    torch.randn(1)  # a cached normal sample in the global generator: the batch must not leak it in or out
    random.gauss(0, 1)
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    draws = TransformedSplit(ds, _Draws()).__getitems__(keys)
    assert torch.equal(torch.get_rng_state(), torch_state) and random.getstate() == py_state
    assert all(torch.equal(x, _seeded_alone(_Draws(), None, seed)) for (x, _), (_, seed) in zip(draws, keys))
    recipes = (dict(inception_crop=True, flip=True, randaug=""), dict(inception_crop=False, flip=True, randaug="rand-m9-n2"))
    for backend in ("fast",) if store else ("pil", "fast"):  # a pixel store feeds the fast backend only
        for recipe in recipes:
            cfg = dict(image_size=28, channels=1, eval_resize=28, backend=backend, **recipe)
            transform = build_transform(cfg, train=True, uint8=True)
            split = TransformedSplit(undecoded(ds) if backend == "fast" else ds, transform)
            alone = [_seeded_alone(transform, split.ds[i]["image"], seed) for i, seed in keys]
            assert all(torch.equal(x, a) for (x, _), a in zip(split.__getitems__(keys), alone)), (backend, recipe)


def test_evaluation_reads_each_batch_in_one_call(idx_dataset, tmp_path, monkeypatch):
    from dpnrepro.data.loader import eval_loader

    prepare_dataset(data_cfg(idx_dataset), tmp_path / "p")
    ds = load_split(tmp_path / "p", "val")
    transform = build_transform({"image_size": 28, "channels": 1, "eval_resize": 24}, train=False)
    one_by_one = [TransformedSplit(ds, transform)[i][0] for i in range(len(ds))]
    reads = []
    read = type(ds).__getitem__
    monkeypatch.setattr(type(ds), "__getitem__", lambda self, key: reads.append(key) or read(self, key))
    batches = list(eval_loader(ds, transform, batch_size=4))
    assert len(reads) == len(batches) == -(-len(ds) // 4)  # one Arrow read per batch, not one per row
    assert torch.equal(torch.cat([x for x, _ in batches]), torch.stack(one_by_one))


@pytest.mark.parametrize("cfg", [{"image_size": 28, "channels": 1, "eval_resize": 24},
                                 {"image_size": 20, "channels": 3, "eval_resize": 23},
                                 {"image_size": 16, "channels": 3, "squash": True}])
def test_evaluation_batches_are_the_per_image_eval_transform_bit_for_bit(idx_dataset, tmp_path, cfg):
    # eval_batches scales each batch of uint8 images at once (loader.scaled_collate): the same floats as
    # build_transform(train=False)'s per-image ToDtype + Normalize, in the same order, targets too
    from dpnrepro.data.loader import eval_batches

    prepare_dataset(data_cfg(idx_dataset), tmp_path / "p")
    ds = load_split(tmp_path / "p", "val")
    per_image = TransformedSplit(ds, build_transform(cfg, train=False))
    batches = list(eval_batches(ds, cfg, batch_size=7))
    images = torch.cat([x for x, _ in batches])
    assert images.dtype == torch.float32 and images.shape[1] == cfg["channels"]
    assert torch.equal(images, torch.stack([per_image[i][0] for i in range(len(ds))]))
    assert torch.cat([y for _, y in batches]).tolist() == list(ds["label"])


def test_prepare_imagefolder_with_label_lists_in_metadata(tmp_path):
    """A user's JFT-style data: images plus metadata.jsonl lines {"file_name", "labels": [ids]}."""
    from PIL import Image

    root = tmp_path / "jft"
    rng = np.random.default_rng(0)
    sets = {"train": [[0], [1, 3], [2], [0, 2, 4], [4], [1], [3, 0], [2, 1]], "test": [[0, 1], [4]]}
    for split, label_sets in sets.items():
        (root / split).mkdir(parents=True)
        with open(root / split / "metadata.jsonl", "w") as f:
            for i, ids in enumerate(label_sets):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / split / f"{i}.png")
                f.write(json.dumps({"file_name": f"{i}.png", "labels": ids}) + "\n")
    out = tmp_path / "out"
    m = prepare_dataset(data_cfg(root, format="imagefolder", num_classes=5, multi_label=True,
                                 minival_fraction=0.25), out)
    assert m["splits"]["val"]["class_counts"] == [1, 1, 0, 0, 1]
    train = [list(x) for x in load_split(out, "train")["labels"]]
    minival = [list(x) for x in load_split(out, "minival")["labels"]]
    # stratified by each example's first label: 2 of 8 held out, from the classes with the largest quota
    assert len(train) == 6 and len(minival) == 2 and sorted(train + minival) == sorted(sets["train"])
    assert sorted(ids[0] for ids in minival) == [0, 1]

    bad = tmp_path / "out_bad"
    with pytest.raises(DatasetError, match="label 4 outside \\[0, 4\\)"):
        prepare_dataset(data_cfg(root, format="imagefolder", num_classes=4, multi_label=True,
                                 minival_fraction=0.25), bad)
    assert not bad.exists()


def test_multi_label_without_label_sets_is_one_clear_error(idx_dataset, tmp_path):
    with pytest.raises(DatasetError, match="no 'labels' column.*label_parents"):
        prepare_dataset(data_cfg(idx_dataset, num_classes=14, multi_label=True), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_prepared_image_folder_is_byte_identical_whatever_the_file_times(tmp_path, hf_cache_in_tmp):
    """`datasets` fingerprints an image folder by file paths and mtimes and records source sizes that
    include the paths; prepare stores a content fingerprint and drops those sizes, so the prepared bytes
    (and the DVC hash in dvc.lock) match on every machine."""
    import os

    import shutil

    root = make_image_folder(tmp_path / "folder", classes=("a", "b"), per_class=6)
    prepare_dataset(data_cfg(root, format="imagefolder", num_classes=2, minival_fraction=0.25), tmp_path / "one")
    # another machine: the same files at another (longer) path, with other times
    moved = shutil.copytree(root, tmp_path / "somewhere" / "else" / "entirely" / "folder")
    for path in moved.rglob("*.jpg"):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    prepare_dataset(data_cfg(moved, format="imagefolder", num_classes=2, minival_fraction=0.25), tmp_path / "two")
    manifest_two = json.loads((tmp_path / "two" / "manifest.json").read_text())
    (tmp_path / "two" / "manifest.json").write_text(  # the manifest names the source path it read
        json.dumps({**manifest_two, "source": str(root)}, indent=2, sort_keys=True) + "\n")
    files = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*") if p.is_file())
    assert files and all((tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes() for f in files)
