"""``input.backend: fast``: same crop/flip/RandAugment draws as the PIL path, close pixels, seeded, robust."""
from __future__ import annotations

import io
import math
import random

import numpy as np
import pytest
import torch
from conftest import data_cfg
from PIL import Image

from dpnrepro.data import fast
from dpnrepro.data.loader import TransformedSplit, build_transform, load_split
from dpnrepro.data.prepare import prepare_dataset
from dpnrepro.data.randaugment import apply_op
from dpnrepro.errors import DatasetError

RA = "rand-n2-m15-mmax15"


def photo(size=(400, 300)) -> Image.Image:
    """A real photograph (matplotlib's bundled grace_hopper.jpg), resized."""
    import matplotlib

    path = f"{matplotlib.get_data_path()}/sample_data/grace_hopper.jpg"
    with Image.open(path) as im:
        return im.convert("RGB").resize(size, Image.Resampling.BICUBIC)


def jpeg(im: Image.Image, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


@pytest.fixture(scope="module")
def photo_jpeg() -> bytes:
    return jpeg(photo())


def cfg(channels=3, size=64, backend="fast", **kw) -> dict:
    return dict(image_size=size, channels=channels, eval_resize=size, inception_crop=True, flip=True,
                randaug=RA, backend=backend, **kw)


def seeded(transform, image, seed):
    torch.manual_seed(seed)
    random.seed(seed)
    return transform(image)


@pytest.mark.parametrize("channels", [1, 3])
def test_fast_output_shape_dtype_range(channels, photo_jpeg):
    t = build_transform(cfg(channels), train=True)
    assert isinstance(t, fast.FastTrainTransform)
    gray_png = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)).save(gray_png, "PNG")
    inputs = [photo_jpeg, {"bytes": photo_jpeg, "path": "x.jpg"}, Image.open(io.BytesIO(photo_jpeg)), photo(),
              gray_png.getvalue(), Image.open(io.BytesIO(gray_png.getvalue())),
              np.array(photo().convert({1: "L", 3: "RGB"}[channels]))]
    for seed, image in enumerate(inputs * 3):
        x = seeded(t, image, seed)
        assert x.shape == (channels, 64, 64) and x.dtype == torch.float32 and x.is_contiguous()
        assert -1.0 <= float(x.min()) and float(x.max()) <= 1.0


@pytest.mark.parametrize("crop_sampler", ["torchvision", "big_vision"])
def test_fast_deterministic_per_seed_on_prepared_smoke_data(idx_dataset, tmp_path, crop_sampler):
    prepare_dataset(data_cfg(idx_dataset), tmp_path / "p")
    ds = load_split(tmp_path / "p", "train")
    split = TransformedSplit(ds, build_transform(cfg(1, size=28, crop_sampler=crop_sampler), train=True))
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    state = torch.get_rng_state(), random.getstate()
    x1, y1 = split[(3, 77)]
    np.random.seed(6)  # NumPy's global RNG must not matter (timm draws RandAugment ops from it)
    x2, y2 = split[(3, 77)]
    x3, _ = split[(3, 78)]
    assert torch.equal(torch.get_rng_state(), state[0]) and random.getstate() == state[1]
    assert torch.equal(x1, x2) and y1 == y2
    assert not torch.equal(x1, x3)
    assert x1.shape == (1, 28, 28) and -1 <= float(x1.min()) and float(x1.max()) <= 1


def test_pil_randaugment_is_seeded_too(photo_jpeg):
    t = build_transform(cfg(3, backend="pil"), train=True)
    outs = []
    for np_seed in (0, 1, 2):
        np.random.seed(np_seed)
        outs.append(seeded(t, Image.open(io.BytesIO(photo_jpeg)), 11))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("hw", [(300, 400), (375, 500), (28, 28), (10, 300), (300, 10), (1, 1)])
def test_crop_box_equals_torchvision_sampler(hw):
    from torchvision.transforms import v2

    rrc = v2.RandomResizedCrop(224, scale=(0.05, 1.0), ratio=(3 / 4, 4 / 3))
    dummy = torch.empty((3, *hw), dtype=torch.uint8)
    for seed in range(200):
        torch.manual_seed(seed)
        p = rrc.make_params([dummy])
        torch.manual_seed(seed)
        assert fast.inception_crop_params(*hw) == (p["top"], p["left"], p["height"], p["width"])


def test_crop_box_distribution():
    torch.manual_seed(0)
    H, W = 375, 500
    boxes = [fast.inception_crop_params(H, W) for _ in range(4000)]
    area = np.array([h * w / (H * W) for _, _, h, w in boxes])
    log_ar = np.array([math.log(w / h) for _, _, h, w in boxes])
    assert area.min() >= 0.045 and area.max() <= 1.0
    assert np.all(np.abs(log_ar) <= math.log(4 / 3) + 0.02)
    assert all(0 <= t and 0 <= l and t + h <= H and l + w <= W for t, l, h, w in boxes)
    # area is ~uniform on [0.05, 1] before rejection of boxes that do not fit: mean well inside (0.4, 0.6)
    assert 0.35 < area.mean() < 0.6 and np.mean(area < 0.2) > 0.1


def test_fast_matches_pil_path_for_the_same_seed(photo_jpeg):
    """Same crop box, flip and RandAugment draws: the two backends' outputs nearly coincide."""
    plain = dict(randaug="")
    for extra, tol in ((plain, 0.05), ({}, 2.0)):
        # 224 px from a 400x300 photo: no crop allows a reduced-scale decode, so pixels match to rounding
        tp = build_transform({**cfg(3, size=224, backend="pil"), **extra}, train=True)
        tf = build_transform({**cfg(3, size=224), **extra}, train=True)
        diffs = []
        for seed in range(24):
            a = seeded(tp, Image.open(io.BytesIO(photo_jpeg)), seed)
            b = seeded(tf, photo_jpeg, seed)
            diffs.append(float((a - b).abs().mean()) * 127.5)  # grey levels
        assert np.mean(diffs) < tol, (extra, diffs)


@pytest.mark.parametrize("crop_sampler", ["torchvision", "big_vision"])
def test_fast_matches_pil_on_tiny_grayscale(crop_sampler):
    img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (28, 28), dtype=np.uint8))
    tp = build_transform({**cfg(1, size=28, backend="pil", crop_sampler=crop_sampler), "randaug": ""}, train=True)
    tf = build_transform({**cfg(1, size=28, crop_sampler=crop_sampler), "randaug": ""}, train=True)
    for seed in range(10):
        a, b = seeded(tp, img, seed), seeded(tf, img, seed)
        assert float((a - b).abs().max()) * 127.5 <= 1.01


@pytest.mark.parametrize("squash", [False, True])
def test_fast_without_crop_equals_pil_for_images_at_and_off_the_training_size(squash):
    """Without inception crop (the smoke recipes) an S x S image skips the resize | central crop, which are the
    image itself there (torchvision returns an image already at the size): the same tensors as the PIL path,
    bit for bit, as for the images the fast path does resize."""
    rng = np.random.default_rng(2)
    for hw in ((28, 28), (36, 28), (20, 33)):
        img = Image.fromarray(rng.integers(0, 256, hw, dtype=np.uint8))
        settings = dict(inception_crop=False, randaug="", squash=squash)
        tp = build_transform({**cfg(1, size=28, backend="pil"), **settings}, train=True, uint8=True)
        tf = build_transform({**cfg(1, size=28), **settings}, train=True, uint8=True)
        for seed in range(6):
            a, b = seeded(tp, img, seed), seeded(tf, np.asarray(img), seed)
            assert b.shape == (1, 28, 28) and torch.equal(a, b), (hw, seed)


def test_randaugment_ops_close_to_timm():
    from timm.data import auto_augment as aa

    img = photo((224, 224))
    hp = {"translate_const": 100, "img_mean": (128,) * 3, "magnitude_max": 15}
    for name in aa._RAND_TRANSFORMS:
        op = aa.AugmentOp(name, prob=1.0, magnitude=15, hparams=hp)
        for seed in range(4):
            random.seed(seed)
            ref = np.asarray(op(img)).astype(np.float32)
            random.seed(seed)
            got = apply_op(op, np.array(img)).astype(np.float32)
            diff = np.abs(ref - got).mean()
            exact = name not in ("Rotate", "ShearX", "ShearY")
            assert (diff == 0) if exact else diff < 1.5, (name, diff)


def test_draft_decode_close_to_full_decode():
    big = jpeg(photo((1600, 1200)))
    box = (100, 150, 1000, 1100)  # top, left, height, width: allows 1/4 scale for 224 px
    assert fast.draft_scale(box[3], box[2], 224) == 4
    im = fast.open_image(big)
    px, scale = fast._pil_pixels(im, "RGB", "<test>", box, 224)
    assert scale == 4 and px.shape[:2] == (300, 400)
    t, l, h, w = box
    got = fast.resized_crop(px, tuple(v / 4 for v in box), 224).astype(np.float32)
    ref = np.asarray(Image.open(io.BytesIO(big)).convert("RGB").resize(
        (224, 224), Image.Resampling.BILINEAR, box=(l, t, l + w, t + h))).astype(np.float32)
    assert np.abs(got - ref).mean() < 3.0


def test_draft_path_close_to_pil_path_for_the_same_seed():
    """64 px crops of a 400x300 photo: most crops decode at 1/2 or 1/4 scale; still close to the PIL path."""
    data = jpeg(photo())
    tp = build_transform({**cfg(3, size=64, backend="pil"), "randaug": ""}, train=True)
    tf = build_transform({**cfg(3, size=64), "randaug": ""}, train=True)
    diffs = [float((seeded(tp, Image.open(io.BytesIO(data)), s) - seeded(tf, data, s)).abs().mean()) * 127.5
             for s in range(24)]
    assert np.mean(diffs) < 3.0, diffs


def test_fast_uses_draft_for_large_crops(monkeypatch):
    big = jpeg(photo((2000, 1500)))
    calls = []
    real = fast._pil_pixels
    monkeypatch.setattr(fast, "_pil_pixels", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    t = build_transform(cfg(3, size=64), train=True)
    for seed in range(10):
        assert seeded(t, big, seed).shape == (3, 64, 64)
    assert len(calls) >= 5  # crops >= 128 px on both sides take the reduced-scale PIL decode


def test_jpeg_size_matches_pil(photo_jpeg):
    assert fast.jpeg_size(photo_jpeg) == (400, 300)
    prog = io.BytesIO()
    photo((123, 77)).save(prog, "JPEG", progressive=True)
    assert fast.jpeg_size(prog.getvalue()) == (123, 77)
    assert fast.jpeg_size(b"\x89PNG\r\n\x1a\n") is None


@pytest.mark.parametrize("bad", ["truncated", "garbage", "header_only"])
def test_corrupt_jpeg_raises_clear_error(bad, photo_jpeg):
    data = {"truncated": photo_jpeg[: len(photo_jpeg) // 3], "garbage": b"not an image at all" * 10,
            "header_only": photo_jpeg[:400]}[bad]
    t = build_transform(cfg(3), train=True)
    with pytest.raises(DatasetError, match="cannot decode image"):
        seeded(t, {"bytes": data, "path": "bad.jpg"}, 0)


def test_benchmark_measure_runs(photo_jpeg):
    from dpnrepro.benchmarks.input_pipeline import measure

    images = [photo_jpeg, jpeg(photo((300, 400)))]
    for backend in ("pil", "fast"):
        assert measure(backend, images, n=4, seed=0, size=64) > 0


# --- the prepare-time uint8 pixel store ----------------------------------------------------------------


def test_pixel_store_holds_the_decoded_train_images(idx_dataset, tmp_path):
    from dpnrepro.data.pixel_store import STORE_DIR, PixelStoreSplit

    m = prepare_dataset(data_cfg(idx_dataset, pixel_store_side=64), tmp_path / "p")
    ds = load_split(tmp_path / "p", "train")
    store = PixelStoreSplit(ds, tmp_path / "p" / STORE_DIR)
    assert m["pixel_store"] == {"examples": len(ds), "bytes": len(ds) * 28 * 28, "max_shorter_side": 64}
    assert len(store) == len(ds) and "label" in store.column_names
    for i in (0, 7, len(ds) - 1):
        ex = store[i]
        assert np.array_equal(ex["image"], np.asarray(ds[i]["image"])[:, :, None])  # 28 px <= 64: kept as is
        assert ex["label"] == ds[i]["label"]
    # same (index, seed) -> the same tensor as the fast transform fed the PNG (identical pixels, same draws)
    t = build_transform({**cfg(1, size=28), "randaug": RA}, train=True)
    png = TransformedSplit(fast.undecoded(ds), t)
    stored = TransformedSplit(store, t)
    for key in ((0, 11), (5, 12), (9, 13)):
        assert torch.equal(png[key][0], stored[key][0]) and png[key][1] == stored[key][1]


def test_pixel_store_downscales_to_the_shorter_side_and_converts_channels(tmp_path):
    from conftest import make_image_folder
    from dpnrepro.data.pixel_store import STORE_DIR, PixelStoreSplit

    root = make_image_folder(tmp_path / "folder", classes=("a", "b"), per_class=4)
    Image.fromarray(np.full((40, 20, 3), 200, np.uint8)).save(root / "train" / "a" / "tall.png")
    prepare_dataset(data_cfg(root, format="imagefolder", num_classes=2, minival_fraction=0.2, pixel_store_side=10),
                    tmp_path / "p")
    store = PixelStoreSplit(load_split(tmp_path / "p", "train"), tmp_path / "p" / STORE_DIR)
    shapes = {tuple(store[i]["image"].shape) for i in range(len(store))}
    assert shapes <= {(10, 10, 3), (20, 10, 3)} and (20, 10, 3) in shapes  # 12x12 -> 10x10, 40x20 -> 20x10
    gray = fast.decode(store[0]["image"], "L", 8, crop=False)[0]  # an RGB store read by a 1-channel run
    assert gray.shape == (10, 10, 1)
    assert np.array_equal(gray[:, :, 0].numpy(), np.asarray(Image.fromarray(store[0]["image"]).convert("L")))


def test_pixel_store_refuses_a_missing_or_stale_store(idx_dataset, tmp_path):
    from dpnrepro.data.pixel_store import PixelStoreSplit, STORE_DIR

    prepare_dataset(data_cfg(idx_dataset), tmp_path / "plain")
    with pytest.raises(DatasetError, match="no pixel store.*pixel_store_side"):
        PixelStoreSplit(load_split(tmp_path / "plain", "train"), tmp_path / "plain" / STORE_DIR)
    prepare_dataset(data_cfg(idx_dataset, pixel_store_side=28), tmp_path / "p")
    ds = load_split(tmp_path / "p", "train")
    with pytest.raises(DatasetError, match="holds .* images, the split"):
        PixelStoreSplit(ds.select(range(3)), tmp_path / "p" / STORE_DIR)
