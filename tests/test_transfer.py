"""Tables 3 and 7: VTAB task adapters (label rules on hand-made examples, split protocol), the selection
protocols (validation chooses, test only reports), the smoke stand-ins and the report statistics."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpnrepro.errors import DatasetError
from dpnrepro.transfer.protocol import scratch_search, select_best, vtab_protocol
from dpnrepro.transfer.tasks import TASKS, Slice, get_task
from helpers import FMNIST


def _clevr(depths):
    return {"objects": {"size": [1] * len(depths), "pixel_coords": [[0.0, 0.0, d] for d in depths]}}


# ---------------------------------------------------------------------------------------------------
# The 19 tasks and their label rules (task_adaptation/data/*.py)


def test_the_19_tasks_of_table_3_with_vtab_class_counts():
    from dpnrepro.reports.paper import load_paper_table

    paper = load_paper_table(3)["datasets"]
    assert {g: [t for t, v in TASKS.items() if v.group == g] for g in paper} == paper
    classes = {"Caltech101": 102, "CIFAR-100": 100, "DTD": 47, "Flowers102": 102, "Pets": 37, "Sun397": 397,
               "SVHN": 10, "Camelyon": 2, "EuroSAT": 10, "Resisc45": 45, "Retinopathy": 5, "Clevr-Count": 8,
               "Clevr-Dist": 6, "DMLab": 6, "dSpr-Loc": 16, "dSpr-Ori": 16, "KITTI-Dist": 4, "sNORB-Azim": 18,
               "sNORB-Elev": 9}
    assert {t: v.num_classes for t, v in TASKS.items()} == classes


@pytest.mark.parametrize("objects, label", [(3, 0), (4, 1), (10, 7)])
def test_clevr_count_is_objects_minus_3(objects, label):
    assert get_task("Clevr-Count").label_of(_clevr([9.0] * objects)) == label


def test_clevr_count_outside_3_to_10_is_an_error():
    with pytest.raises(DatasetError, match="outside"):
        get_task("Clevr-Count").label_of(_clevr([9.0] * 11))


@pytest.mark.parametrize("depths, label", [
    ([7.9, 12.0], 0), ([8.0], 0),          # a depth equal to a threshold falls into the bin below
    ([8.01, 9.7], 1), ([8.5], 1), ([8.6], 2), ([9.2, 11.0], 3), ([9.6], 4), ([10.0], 4), ([10.5, 30.0], 5),
])
def test_clevr_distance_bins_the_nearest_object(depths, label):
    assert get_task("Clevr-Dist").label_of(_clevr(depths)) == label


@pytest.mark.parametrize("types, depths, label", [
    ([0], [5.0], 0), ([0], [8.0], 0), ([1], [8.5], 1), ([2], [20.0], 1), ([0], [25.0], 2),
    ([3, 0], [2.0, 15.0], 1),   # the pedestrian (type 3) is nearer but not a vehicle
    ([3, 4], [2.0, 3.0], 3),    # no Car/Van/Truck: the "no vehicle" class
    ([], [], 3),
])
def test_kitti_distance_bins_the_nearest_vehicle(types, depths, label):
    ex = {"objects": {"type": types, "location": [[0.0, 0.0, d] for d in depths]}}
    assert get_task("KITTI-Dist").label_of(ex) == label


@pytest.mark.parametrize("x, label", [(0, 0), (1, 0), (2, 1), (17, 8), (31, 15)])
def test_dsprites_position_32_values_in_16_bins(x, label):
    assert get_task("dSpr-Loc").label_of({"label_x_position": x, "label_orientation": 7}) == label


@pytest.mark.parametrize("o, label", [(0, 0), (2, 0), (3, 1), (4, 1), (5, 2), (20, 8), (39, 15)])
def test_dsprites_orientation_40_values_in_16_bins(o, label):
    assert get_task("dSpr-Ori").label_of({"label_orientation": o, "label_x_position": 3}) == label


def test_smallnorb_azimuth_and_elevation_as_given():
    ex = {"label_azimuth": 17, "label_elevation": 8, "label_category": 2}
    assert (get_task("sNORB-Azim").label_of(ex), get_task("sNORB-Elev").label_of(ex)) == (17, 8)
    with pytest.raises(DatasetError):
        get_task("sNORB-Elev").label_of({"label_elevation": 9})


def test_a_source_with_vtab_labels_and_no_raw_fields_is_read_as_is():
    assert get_task("Clevr-Count").label_of({"label": 5}) == 5
    with pytest.raises(DatasetError, match="neither"):
        get_task("Clevr-Count").label_of({"other": 1})


def test_unknown_task_names_the_19():
    with pytest.raises(DatasetError, match="Caltech101"):
        get_task("ImageNet")


# ---------------------------------------------------------------------------------------------------
# Splits: train800 / val200 / test, disjoint


SOURCE_SIZES = {"train": 3000, "validation": 600, "test": 800}


def _rows(task, name):
    return {(sl.split, i) for sl in task.splits.slices()[name] for i in sl.indices(SOURCE_SIZES[sl.split])}


@pytest.mark.parametrize("name", list(TASKS))
def test_train800_val200_test_are_disjoint_slices_of_the_source(name):
    task = TASKS[name]
    train, val, test = _rows(task, "train800"), _rows(task, "val200"), _rows(task, "test")
    assert (len(train), len(val)) == (800, 200)
    assert not (train & val) and not (train & test) and not (val & test)
    assert _rows(task, "train800val200") == train | val
    assert train <= _rows(task, "train") and val <= _rows(task, "val")


def test_split_rules_follow_task_adaptation():
    n = SOURCE_SIZES["train"]
    # caltech101: val200 = train[90%:][:200]; test = the official test split
    assert _rows(TASKS["Caltech101"], "val200") == {("train", i) for i in range(90 * n // 100, 90 * n // 100 + 200)}
    # dsprites: one split, 80 / 10 / 10
    assert _rows(TASKS["dSpr-Loc"], "test") == {("train", i) for i in range(90 * n // 100, n)}
    # smallnorb: val = test[:50%], test = test[50%:]
    assert _rows(TASKS["sNORB-Elev"], "val200") == {("test", i) for i in range(200)}
    assert min(i for _, i in _rows(TASKS["sNORB-Elev"], "test")) == SOURCE_SIZES["test"] // 2
    # clevr: VTAB's test is the TFDS validation split
    assert {s for s, _ in _rows(TASKS["Clevr-Count"], "test")} == {"validation"}
    # DTD: validation[:200]
    assert _rows(TASKS["DTD"], "val200") == {("validation", i) for i in range(200)}


def test_a_source_too_small_for_the_protocol_is_a_clear_error():
    with pytest.raises(DatasetError, match="needs 800"):
        Slice("train", 0, None, 800).indices(500)
    with pytest.raises(DatasetError, match="needs 200"):  # val200 past the end of a held-out 10 %
        Slice("train", "90%", None, 200).indices(1500)


def test_vtab_splits_relabel_a_datasets_source(tmp_path):
    import datasets
    from PIL import Image

    from dpnrepro.transfer.sources import DecodedSplit, load_source, vtab_splits

    img = Image.new("L", (4, 4))
    n = 2000
    xs = [i % 32 for i in range(n)]
    src = datasets.DatasetDict({"train": datasets.Dataset.from_dict(
        {"image": [img] * n, "label_x_position": xs, "label_orientation": [0] * n})})
    src.save_to_disk(str(tmp_path / "dsprites"))
    splits = vtab_splits(get_task("dSpr-Loc"), load_source("disk", str(tmp_path / "dsprites")))
    assert {k: len(v) for k, v in splits.items()} == {"train800": 800, "val200": 200, "train800val200": 1000,
                                                      "test": 200}
    assert splits["train800"]["label"][:4] == [0, 0, 1, 1]
    assert splits["test"]["label"][:2] == [xs[1800] // 2, xs[1801] // 2]
    decoded = DecodedSplit(splits["test"])
    assert decoded._fingerprint == splits["test"]._fingerprint and len(decoded) == 200
    assert decoded[3]["label"] == splits["test"][3]["label"] and decoded[3]["image"].size == (4, 4)
    with pytest.raises(DatasetError, match="validation"):
        vtab_splits(get_task("DTD"), src)


def test_missing_or_offline_sources_fail_with_one_line(tmp_path, monkeypatch):
    from dpnrepro.transfer.sources import load_source

    with pytest.raises(DatasetError, match="save_to_disk"):
        load_source("disk", str(tmp_path / "nope"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DatasetError, match="network"):
        load_source("hub", "clip-benchmark/wds_vtab-dtd")


# ---------------------------------------------------------------------------------------------------
# Selection: validation chooses, test only reports


class Recorder:
    """A fake trainer/evaluator: accuracy per (lr, split) from a table; records every call."""

    def __init__(self, table):
        self.table, self.fits, self.scores = table, [], []

    def fit(self, split, hp, seed):
        self.fits.append((split, hp.get("lr"), seed))
        return (split, hp, seed)

    def score(self, model, split):
        self.scores.append((model, split))
        _, hp, seed = model
        return self.table[hp["lr"]][split] + 0.1 * seed


def test_select_best_takes_the_highest_mean_and_the_first_of_ties():
    assert select_best({0.1: [50, 70], 0.3: [61, 61], 1.0: [40, 80]}) == 0.3
    assert select_best({"a": [1.0], "b": [1.0]}) == "a"


def test_vtab_chooses_the_lr_by_validation_never_by_test():
    # lr 0.03 is best on test, lr 0.01 on validation: the protocol must report lr 0.01's test accuracy.
    rec = Recorder({0.003: {"val200": 50, "test": 60}, 0.01: {"val200": 70, "test": 40}, 0.03: {"val200": 60, "test": 90}})
    out = vtab_protocol([0.003, 0.01, 0.03], [0, 1, 2], rec.fit, rec.score)
    assert out["lr"] == 0.01
    assert out["test"] == pytest.approx([40.0, 40.1, 40.2])
    assert out["val"]["0.03"] == pytest.approx([60.0, 60.1, 60.2])
    tested = [m for m, split in rec.scores if split == "test"]
    assert [m[1]["lr"] for m in tested] == [0.01] * 3             # test scored for the chosen lr only,
    assert [split for _, split in rec.scores][-3:] == ["test"] * 3  # after every validation score
    assert out["trained_on"] == "train800" and len(rec.fits) == 9


def test_vtab_retrains_the_chosen_lr_on_train800val200_when_asked():
    rec = Recorder({0.01: {"val200": 70, "test": 40}, 0.03: {"val200": 60, "test": 90}})
    out = vtab_protocol([0.01, 0.03], [0, 1], rec.fit, rec.score, retrain_on_train800val200=True)
    assert rec.fits[-2:] == [("train800val200", 0.01, 0), ("train800val200", 0.01, 1)]
    assert [m[0] for m, split in rec.scores if split == "test"] == ["train800val200"] * 2
    assert out["trained_on"] == "train800val200"


def test_scratch_search_three_steps_each_chosen_on_validation():
    def acc(hp, split):  # validation prefers lr 1e-3, mixup 0.2, randaug 10; test prefers other settings
        v = (hp["lr"] == 1e-3) * 10 + (hp.get("mixup") == 0.2) * 5 + (hp.get("randaug_magnitude") == 10) * 3 \
            + hp.get("steps", 0) / 1000
        return v if split == "val" else 100 - v

    fits, tests = [], []

    def fit(split, hp, seed):
        assert split == "train"
        fits.append(hp)
        return dict(hp)

    def score(model, split):
        if split == "test":
            tests.append(model)
        return acc(model, split)

    grid = [{"lr": lr, "weight_decay": 0.1, "dropout": 0.0} for lr in (1e-4, 1e-3)]
    aug = [{"mixup": m, "randaug_magnitude": r} for m in (0.0, 0.2) for r in (0, 10)]
    rows = scratch_search(grid, aug, {"steps": 2000}, 0, fit, score)
    assert [r["setting"] for r in rows] == ["from scratch", "+ Augmentation", "+ Train Longer"]
    assert rows[0]["hparams"]["lr"] == 1e-3
    assert (rows[1]["hparams"]["mixup"], rows[1]["hparams"]["randaug_magnitude"], rows[1]["hparams"]["lr"]) == (0.2, 10, 1e-3)
    assert rows[2]["hparams"] == {**rows[1]["hparams"], "steps": 2000}
    assert tests == [r["hparams"] for r in rows]        # test: once per row, the chosen setting only
    assert len(fits) == len(grid) + len(aug) + 1


# ---------------------------------------------------------------------------------------------------
# Smoke stand-ins: the real adapters read them


def test_fmnist_scenes_store_clevr_objects_and_count_labels():
    from dpnrepro.transfer.smoke_data import fmnist_scenes
    if not FMNIST.is_dir():
        pytest.skip("Debian dataset-fashion-mnist not installed")
    dd = fmnist_scenes({"train": 12}, 0, str(FMNIST))
    for ex in dd["train"]:
        k = len(ex["objects"]["size"])
        assert 3 <= k <= 10
        assert get_task("Clevr-Count").label_of(ex) == k - 3
        assert np.asarray(ex["image"]).shape == (28, 28) and np.asarray(ex["image"]).max() > 0


def test_fmnist_sprites_put_the_item_where_the_position_latent_says():
    """The item lies in its 16-px square at sprite_x of its x value, vertically centred; the x values spread
    over the whole free width; every orientation and x value is drawn."""
    from dpnrepro.transfer.smoke_data import SIZE, SPRITE_PX, SPRITE_X_LATENTS, fmnist_sprites, sprite_x
    if not FMNIST.is_dir():
        pytest.skip("Debian dataset-fashion-mnist not installed")
    assert [sprite_x(v) for v in SPRITE_X_LATENTS] == [0, 4, 8, 12]
    dd = fmnist_sprites({"train": 400}, 0, str(FMNIST))
    y0 = (SIZE - SPRITE_PX) // 2
    for ex in dd["train"].select(range(40)):
        rows, cols = np.nonzero(np.asarray(ex["image"]))
        x0 = sprite_x(ex["label_x_position"])
        assert x0 <= cols.min() and cols.max() < x0 + SPRITE_PX and y0 <= rows.min() and rows.max() < y0 + SPRITE_PX
    assert set(dd["train"]["label_x_position"]) == set(SPRITE_X_LATENTS)
    assert set(dd["train"]["label_orientation"]) == set(range(40))


def test_texture_and_nuclei_splits_come_from_disjoint_bands():
    from dpnrepro.transfer.smoke_data import BANDS

    edges = [BANDS[s] for s in ("train", "validation", "test")]
    assert edges[0][1] == edges[1][0] and edges[1][1] == edges[2][0]


# ---------------------------------------------------------------------------------------------------
# Reports


def _vtab_metrics(base, dpn, svhn_chance=10.0):
    runs = {f"Mu-7_{stem}": {"arch": "Mu-7", "stem": stem, "lr": 0.01, "test": acc, "trained_on": "train800",
                              "val": {"0.01": acc}} for stem, acc in (("conv", base), ("dpn", dpn))}
    return {"profile": "smoke", "hardware": "cpu", "init_from": "table1", "init_seed": 0, "lrs": [0.01],
            "seeds": [0, 1, 2], "retrain_on_train800val200": False, "recipe": "r",
            "tasks": {"SVHN": {"group": "natural", "stand_in": "MNIST", "runs": runs, "majority_test": svhn_chance},
                      "DTD": {"group": "natural", "stand_in": "textures", "majority_test": 33.3, "runs": {
                          k: {**v, "test": [a + 10 for a in v["test"]]} for k, v in runs.items()}}}}


def test_table3_fine_tuning_seeds_of_one_pretrained_pair_never_decide_and_groups_average_per_seed(tmp_path):
    from dpnrepro.reports.transfer_tables import build_transfer_table, summarize_vtab

    clear = summarize_vtab(_vtab_metrics([50, 51, 52], [60, 61, 62.5]))
    delta = clear["tasks"]["SVHN"]["archs"]["Mu-7"]["delta_dpn"]  # 3 fine-tuning seeds of one pretrained pair
    assert delta["low"] > 0 and delta["over"] == "fine-tuning seeds" and delta["training_pairs"] == 1
    assert delta["verdict"] == "not resolved" and delta["why"] == "1 pretraining run"
    group = clear["groups"]["natural"]["Mu-7"]["conv"]
    assert group["test"] == [55, 56, 57] and group["mean"] == pytest.approx(56)
    assert group["learned"] and group["chance"] == pytest.approx((10 + 33.3) / 2)
    # conv 51 % on a task whose majority class is 45 %: not 10 points above chance, so no Δ verdict there
    half = summarize_vtab(_vtab_metrics([50, 51, 52], [60, 61, 62.5], svhn_chance=45.0))
    svhn = half["tasks"]["SVHN"]["archs"]["Mu-7"]
    assert not svhn["conv"]["learned"] and svhn["dpn"]["learned"] and svhn["conv"]["chance"] == 45.0
    assert svhn["delta_dpn"]["learned"] is False and svhn["delta_dpn"]["at_chance"] == ["conv"]
    assert half["groups"]["natural"]["Mu-7"]["conv"]["learned"] is False
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "vtab.json").write_text(json.dumps(_vtab_metrics([50, 51, 52], [60, 61, 62.5])))
    md, png, _ = build_transfer_table(3, tmp_path / "metrics", tmp_path / "reports")
    text = md.read_text()
    assert "| natural | SVHN (MNIST) | 10.0 |" in text and "| +10.17 ± " in text and "**+10.17" not in text
    assert "Verdicts (" in text and "none: not resolved (1 pretraining run)." in text and png.stat().st_size > 0
    assert "| natural | Caltech101 | 87.1 | 87.7 | +0.6 | 86.1 | 86.6 | +0.5 |" in text  # paper, from table3.yaml


def test_table7_rows_from_the_search(tmp_path):
    from dpnrepro.reports.transfer_tables import build_transfer_table

    rows = lambda t: [{"setting": s, "hparams": {"lr": 0.001}, "val": t + i, "test": t + i, "candidates": []}  # noqa: E731
                      for i, s in enumerate(("from scratch", "+ Augmentation", "+ Train Longer"))]
    metrics = {"profile": "smoke", "hardware": "cpu", "task": "Sun397", "stand_in": "MNIST", "seed": 0,
               "examples": {"train": 10, "val": 5, "test": 5}, "majority_test": 32.0, "recipe": "r", "grid": [{}],
               "aug_grid": [{}],
               "longer": {"steps": 80}, "runs": {f"Mu-7_{s}": {"arch": "Mu-7", "stem": s, "rows": rows(t)}
                                                 for s, t in (("conv", 40.0), ("dpn", 45.0))}}
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "sun397_scratch.json").write_text(json.dumps(metrics))
    md, _, summary_file = build_transfer_table(7, tmp_path / "metrics", tmp_path / "reports")
    summary = json.loads(summary_file.read_text())
    text = md.read_text()
    assert "| + Train Longer | 42.00 (42.00) | 47.00 (47.00) | +5.00 |" in text
    arch = summary["Mu-7"]  # conv's 40 % is not 10 points above the 32 % majority class; its 42 % is
    assert not arch["conv"]["from scratch"]["learned"] and arch["conv"]["+ Train Longer"]["learned"]
    scratch = arch["delta_dpn"]["from scratch"]  # one model per row: one training run, never a verdict
    assert {k: scratch[k] for k in ("mean", "ci95", "chance", "learned", "at_chance")} == \
        {"mean": 5.0, "ci95": None, "chance": 32.0, "learned": False, "at_chance": ["conv"]}
    longer = arch["delta_dpn"]["+ Train Longer"]
    assert longer["learned"] and longer["verdict"] == "not resolved" and longer["why"] == "1 training run"
    assert "| from scratch | 41.4 | 47.5 | +6.1 | 45.6 | 51.8 | +6.2 |" in text


# ---------------------------------------------------------------------------------------------------
# Cost of the full profile


def test_full_profile_cost_counts_every_run_of_both_tables():
    from dpnrepro.config.params import load_params
    from dpnrepro.cost.transfer import scratch_cost, vtab_cost
    from helpers import REPO

    full = load_params(REPO / "profiles" / "full.yaml")
    t3 = vtab_cost(full)
    assert t3["B-16"]["runs"] == 19 * 2 * 3 * 3                       # tasks x stems x lrs x seeds
    assert t3["B-16"]["train_images"] == 19 * 2 * 3 * 3 * 2500 * 512
    assert t3["B-16"]["train_flops"] == pytest.approx(3 * 35.13e9 * t3["B-16"]["train_images"], rel=1e-3)
    t7 = scratch_cost(full)
    assert t7["B-16"]["runs"] == 2 * (12 + 11 + 1)                    # step 2 re-uses step 1's winner


def test_scratch_search_trains_step_1s_winner_once_when_canonical_says_so():
    fits = []

    def fit(split, hp, seed):
        fits.append(hp)
        return hp

    def no_aug(hp):
        return {k: v for k, v in hp.items() if not (k in ("mixup", "randaug_magnitude") and v == 0)}

    grid = [{"lr": lr} for lr in (1e-4, 1e-3)]
    aug = [{"mixup": m, "randaug_magnitude": r} for m in (0.0, 0.2) for r in (0, 10)]
    rows = scratch_search(grid, aug, {"steps": 9}, 0, fit, lambda m, s: m["lr"] * 1e4 - m.get("mixup", 0),
                          canonical=no_aug)
    assert rows[1]["hparams"] == {"lr": 1e-3, "mixup": 0.0, "randaug_magnitude": 0}  # no augmentation wins
    assert len(fits) == len(grid) + len(aug) - 1 + 1                                  # trained once, not twice


# ---------------------------------------------------------------------------------------------------
# Audit: what reaches the model


PROFILES = ["params.yaml", "profiles/mini.yaml", "profiles/full.yaml"]


def _kitti_frame():
    """A 1242 x 375 frame (KITTI's size): black, with a white band over the leftmost and the rightmost
    tenth of the width (where KITTI-Dist's nearest vehicle often is)."""
    from PIL import Image

    arr = np.zeros((375, 1242, 3), np.uint8)
    arr[:, :124] = arr[:, -124:] = 255
    return Image.fromarray(arr)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mode", ["eval", "train-pil", "train-fast"])
def test_vtab_transform_keeps_the_full_width_of_a_kitti_frame(profile, mode):
    # task_adaptation's preprocess_fn and big_vision's transfer configs resize the whole frame to
    # [size, size]; resize_small | central_crop would keep only the central 30 % of a KITTI frame's width.
    from PIL import Image

    from dpnrepro.config.params import load_params
    from dpnrepro.config.transfer import vtab_config
    from dpnrepro.data.loader import build_transform
    from helpers import REPO

    params = load_params(REPO / profile)
    inp, _, _ = vtab_config(params, params.vtab.lrs[0])
    cfg = inp.model_dump()
    if mode == "train-fast":
        cfg["backend"] = "fast"
    x = build_transform(cfg, train=mode != "eval")(_kitti_frame())
    s, c = inp.image_size, inp.channels
    assert x.shape == (c, s, s)
    assert x[:, :, 0].min() > 0.9 and x[:, :, -1].min() > 0.9   # both ends of the frame are in the input
    ref = np.asarray(_kitti_frame().convert({1: "L", 3: "RGB"}[c]).resize((s, s), Image.Resampling.BILINEAR),
                     np.float32).reshape(s, s, c).transpose(2, 0, 1) / 127.5 - 1
    assert np.abs(x.numpy() - ref).max() < 4 / 127.5                  # the whole frame, squashed


def test_imagenet_eval_stays_resize_small_and_central_crop():
    # Table 1's evaluation is big_vision's ImageNet one: resize_small(256) | central_crop(224)
    from dpnrepro.config.params import load_params
    from dpnrepro.data.loader import build_transform
    from helpers import REPO

    full = load_params(REPO / "profiles" / "full.yaml")
    assert not full.input.squash and full.input.eval_resize == 256
    x = build_transform(full.input.model_dump(), train=False)(_kitti_frame())
    assert x.shape == (3, 224, 224) and x.max() < -0.9                 # the central crop misses both bands


def test_squash_with_an_eval_resize_other_than_the_image_size_is_an_error():
    from pydantic import ValidationError

    from dpnrepro.config.core import InputParams

    with pytest.raises(ValidationError, match="squash"):
        InputParams(image_size=224, eval_resize=256, squash=True)


def _dsprites_source(n=2000, value=1):
    """dSprites as TFDS stores it: 64 x 64 x 1 uint8 images of 0 (background) and 1 (the shape)."""
    import datasets
    from PIL import Image

    arr = np.zeros((64, 64), np.uint8)
    arr[20:40, 10:30] = value
    img = Image.fromarray(arr, mode="L")
    return datasets.DatasetDict({"train": datasets.Dataset.from_dict(
        {"image": [img] * n, "label_x_position": [i % 32 for i in range(n)], "label_orientation": [0] * n})})


@pytest.mark.parametrize("task", ["dSpr-Loc", "dSpr-Ori"])
def test_dsprites_0_1_pixels_reach_the_model_at_0_255_in_3_channels(task):
    # task_adaptation's dsprites: tf.tile(image, [1, 1, 3]) * 255
    from dpnrepro.config.params import load_params
    from dpnrepro.config.transfer import vtab_config
    from dpnrepro.data.loader import build_transform
    from dpnrepro.transfer.sources import DecodedSplit, vtab_splits
    from helpers import REPO

    splits = vtab_splits(get_task(task), _dsprites_source())
    img = DecodedSplit(splits["test"])[0]["image"]
    arr = np.asarray(img)
    assert arr.shape == (64, 64, 3) and set(np.unique(arr)) == {0, 255}
    full = load_params(REPO / "profiles" / "full.yaml")
    inp, _, _ = vtab_config(full, full.vtab.lrs[0])
    x = build_transform(inp.model_dump(), train=False)(img)
    assert x.shape == (3, 224, 224) and x.min() == -1.0 and x.max() == 1.0


def test_dsprites_stand_in_already_at_0_255_is_only_tiled():
    from dpnrepro.transfer.sources import vtab_splits

    splits = vtab_splits(get_task("dSpr-Loc"), _dsprites_source(value=200))
    assert set(np.unique(np.asarray(splits["val200"][0]["image"]))) == {0, 200}


@pytest.mark.parametrize("profile", ["params.yaml", "profiles/full.yaml"])
def test_table7_step_1_trains_without_randaugment_and_mixup(profile, monkeypatch):
    # Appendix F: lr x wd x dropout first, without augmentation; then mixup x RandAugment with the winner
    import dpnrepro.transfer.scratch as scratch
    from dpnrepro.config.params import load_params
    from helpers import REPO

    params = load_params(REPO / profile)

    class Split:
        def __len__(self):
            return 10

        def __getitem__(self, column):  # the test split's labels, for its chance rate
            return [0, 1] * 5

    trained = []

    def train(spec, ds, inp, cfg, **kw):
        trained.append((kw["ckpt_dir"].name, inp))
        return len(trained)

    monkeypatch.setattr(scratch, "load_source", lambda fmt, source: None)
    monkeypatch.setattr(scratch, "vtab_splits", lambda task, source, names, **kw: {n: Split() for n in names})
    monkeypatch.setattr(scratch, "decoded_if_small", lambda ds: ds)
    monkeypatch.setattr("dpnrepro.training.trainer.train_classifier", train)
    monkeypatch.setattr("dpnrepro.evaluation.classification.evaluate_top1",
                        lambda model, ds, cfg, **kw: {"top1": float(model)})
    scratch.run_scratch(params, progress=False)
    sp = params.sun397_scratch
    step1 = [(name, inp) for name, inp in trained if "mix" not in name and "steps" not in name]
    assert len(step1) == len(sp.archs) * len(sp.stems) * len(scratch.grids(sp)[0])
    assert all(inp.mixup == 0.0 and inp.randaug == "" for _, inp in step1)
    # every step-2 run trains with its own mixup and RandAugment, on top of step 1's winner
    aug = {(a["mixup"], a["randaug_magnitude"]) for a in scratch.grids(sp)[1]}
    seen = {(inp.mixup, inp.randaug) for name, inp in trained if "_mix" in name}
    assert seen == {(m, scratch.randaug_spec(r)) for m, r in aug if (m, r) != (0.0, 0)}
    # step 2's "no augmentation" candidate is step 1's winner, trained once
    assert len(trained) == len(sp.archs) * len(sp.stems) * (len(scratch.grids(sp)[0]) + len(aug) - 1 + 1)


def test_table7_recipe_setting_the_searched_augmentation_is_an_error():
    import yaml
    from pydantic import ValidationError

    from dpnrepro.config.transfer import ScratchParams
    from helpers import REPO

    sp = yaml.safe_load((REPO / "profiles" / "full.yaml").read_text())["sun397_scratch"]
    sp["recipe"]["input"]["mixup"] = 0.5
    with pytest.raises(ValidationError, match="the search does"):
        ScratchParams.model_validate(sp)


def test_a_split_is_decoded_into_memory_only_within_the_budget():
    import datasets
    from PIL import Image

    from dpnrepro.transfer.sources import DecodedSplit, decoded_if_small

    imgs = [Image.new("RGB", (8, 4), (i, 0, 0)) for i in range(10)]  # 96 bytes of pixels each
    ds = datasets.Dataset.from_dict({"image": imgs, "label": list(range(10))},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "label": datasets.Value("int64")}))
    small = decoded_if_small(ds, budget=960)
    assert isinstance(small, DecodedSplit) and small._fingerprint == ds._fingerprint
    assert [small[i]["label"] for i in range(10)] == list(range(10))
    assert [small[i]["image"].getpixel((0, 0)) for i in range(10)] == [ds[i]["image"].getpixel((0, 0))
                                                                        for i in range(10)]
    assert decoded_if_small(ds, budget=959) is ds  # one byte short: read row by row, nothing kept


def test_metrics_stage_checks_its_section_then_rank_0_writes_the_metrics(tmp_path, monkeypatch):
    """The one body of the `vtab` and `sun397_scratch` stages (training/launch.metrics_stage)."""
    from types import SimpleNamespace

    from dpnrepro.errors import ParamsError
    from dpnrepro.training.launch import metrics_stage

    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics").mkdir()
    train = SimpleNamespace(device="cpu", deterministic=True)
    calls = []

    def run(params, ctx, progress):
        calls.append(progress)
        return {"tasks": {"A": 1.0, "B": 2.0}}

    missing = SimpleNamespace(vtab=None, runtime=SimpleNamespace(devices=1, nodes=1))
    with pytest.raises(ParamsError, match=r"no `vtab` section \(Table 3\)"):
        metrics_stage(missing, "vtab", "Table 3", lambda p: train, run, "tasks", "tasks")
    assert not calls and not (tmp_path / "metrics" / "vtab.json").exists()
    params = SimpleNamespace(vtab=object(), runtime=SimpleNamespace(devices=1, nodes=1))
    metrics_stage(params, "vtab", "Table 3", lambda p: train, run, "tasks", "tasks")
    assert calls == [True]
    assert json.loads((tmp_path / "metrics" / "vtab.json").read_text()) == {"tasks": {"A": 1.0, "B": 2.0}}
