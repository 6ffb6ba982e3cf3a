"""``input.backend: gpu`` (data/gpu.py, data/gpu_ops.py) run with device="cpu" against the CPU path on real
JPEG photos: the same draws (crop box, flip, RandAugment ops and arguments) for the same seed, pixels within
stated bounds."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dpnrepro.benchmarks.input_pipeline import load_photos
from dpnrepro.data.fast import FastTrainTransform, decode
from dpnrepro.data.gpu import DeviceAugment, PlanBatch, PlanTransform, draw_op, upload
from dpnrepro.data.gpu_ops import apply_batched, device_op_name
from dpnrepro.data.randaugment import apply_op, op_args, randaugment
from dpnrepro.errors import DatasetError, UserError

BIGVISION, TIMM = "rand-n2-m15-tbigvision", "rand-m9-mstd0.5-inc1"


def _seeded(fn, seed: int):
    """``fn()`` with torch and Python RNGs seeded as TransformedSplit seeds an example; also the RNG states after."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    out = fn()
    return out, (torch.random.get_rng_state(), random.getstate())


@pytest.fixture(scope="module")
def photos():
    blobs, _ = load_photos()
    return blobs


# --- the draws ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("sampler,randaug", [("big_vision", BIGVISION), ("torchvision", TIMM)])
def test_plans_make_the_cpu_paths_draws(photos, monkeypatch, sampler, randaug):
    size = 256  # no reduced-scale decode on the CPU path: its box is in full-image pixels
    drawn = []
    monkeypatch.setattr("dpnrepro.data.randaugment.op_args",
                        lambda op: drawn.append((op.name, op_args(op))) or drawn[-1][1])
    cpu = FastTrainTransform(size, 3, randaug=randaug, crop_sampler=sampler, uint8=True)
    plan = PlanTransform(size, 3, randaug=randaug, crop_sampler=sampler)
    flips = 0
    for k, blob in enumerate(photos * 4):
        seed = 7919 * k + 1
        drawn.clear()
        _, cpu_state = _seeded(lambda: cpu(blob), seed)
        cpu_ops = list(drawn)
        drawn.clear()
        p, plan_state = _seeded(lambda: plan(blob), seed)
        assert torch.equal(cpu_state[0], plan_state[0]) and cpu_state[1] == plan_state[1]  # same number of draws
        (_, box), _ = _seeded(lambda: decode(blob, "RGB", size, sampler=sampler), seed)
        assert p.box == box and p.jpeg
        assert [(name, args) for name, args in drawn] == cpu_ops
        assert [None if o is None else o[1] for o in p.ops] == [args for _, args in cpu_ops]
        flips += p.flip
    assert 0 < flips < len(photos) * 4


def test_plans_refuse_ops_without_a_device_version():
    from timm.data.auto_augment import rand_augment_transform

    ra = rand_augment_transform("rand-m9-n2", {"img_mean": (128, 128, 128)})
    ra.ops[0].aug_fn = lambda img, **_: img  # not one of timm's functions
    with pytest.raises(UserError, match="no device implementation"):
        device_op_name(ra.ops[0])


# --- crop + resize + flip ----------------------------------------------------------------------------

# Measured here: big_vision bit-exact (TF's float32 taps and operation order); torchvision ~16 % of the values by 1
# (torch's uint8 antialias kernel is fixed-point, the float path rounds once). A box off by one pixel gives far more.
@pytest.mark.parametrize("sampler,size,max_bound,mean_bound", [("big_vision", 224, 0, 0.0), ("torchvision", 256, 1, 0.2)])
def test_device_crop_and_flip_match_the_cpu_path(photos, sampler, size, max_bound, mean_bound):
    blobs = photos * 3
    seeds = [1000 + 7 * k for k in range(len(blobs))]
    plan = PlanTransform(size, 3, crop_sampler=sampler)
    state = torch.random.get_rng_state(), random.getstate()
    plans = [_seeded(lambda: plan(b), s)[0] for b, s in zip(blobs, seeds)]
    out = DeviceAugment(size, 3, "cpu", sampler)(PlanBatch(plans))
    assert out.shape == (len(blobs), 3, size, size) and out.dtype == torch.uint8
    cpu = FastTrainTransform(size, 3, randaug="", crop_sampler=sampler, uint8=True)
    ref = torch.stack([_seeded(lambda: cpu(b), s)[0] for b, s in zip(blobs, seeds)])
    diff = (out.int() - ref.int()).abs()
    assert diff.max() <= max_bound, f"max {diff.max()}"
    assert diff.float().mean() <= mean_bound, f"mean {diff.float().mean()}"
    assert 0 < sum(p.flip for p in plans) < len(plans)
    torch.random.set_rng_state(state[0]), random.setstate(state[1])


# --- RandAugment, op by op, on the same uint8 input --------------------------------------------------

# max |device - reference| in grey levels on 12 draws per op (m = 15 / DeiT's m9 with mstd 0.5), the reference being
# the fast CPU path (OpenCV for Rotate / Shear, PIL otherwise) and PIL itself (timm's op on a PIL image). Every op of
# both spellings is bit-exact against PIL (nearest, bilinear and bicubic geometric ops included). Against the fast
# path the geometric ops differ by the fast path's own OpenCV approximations: its nearest-neighbour Rotate picks a
# neighbouring pixel for ~0.1 % of them (big_vision), its bilinear / bicubic (a = -0.75, PIL's is -1) Rotate / Shear
# differ by <= 6 on ~40 % of the pixels (timm's specs).
BOUNDS = {  # (spec, op): (max vs the fast path, max vs PIL); every other op: (0, 0), i.e. bit-exact
    (BIGVISION, "Rotate"): (255, 0),
    (TIMM, "Rotate"): (6, 0), (TIMM, "ShearX"): (6, 0), (TIMM, "ShearY"): (6, 0),
}


@pytest.fixture(scope="module")
def crops(photos):
    cpu = FastTrainTransform(224, 3, flip=False, randaug="", uint8=True)
    return [_seeded(lambda: cpu(b), k)[0].permute(1, 2, 0).numpy().copy() for k, b in enumerate(photos)]


@pytest.mark.parametrize("spec", [BIGVISION, TIMM])
def test_device_ops_match_the_cpu_path_and_pil(crops, spec):
    from PIL import Image

    for op in randaugment(spec, 224, 3).ops:
        refs = {"fast": [], "pil": []}
        params, xs = [], []
        for seed in range(12):
            arr = crops[seed % len(crops)]
            (fast_out, fast_state), (pil_out, pil_state) = (
                _seeded(lambda: apply_op(op, arr.copy()), seed), _seeded(lambda: op(Image.fromarray(arr)), seed))
            drawn, state = _seeded(lambda: draw_op(op, 224), seed)
            assert state[1] == fast_state[1] == pil_state[1], op.name  # the same Python draws, inside the op too
            if drawn is None:
                continue
            refs["fast"].append(torch.from_numpy(np.array(fast_out)).permute(2, 0, 1))
            refs["pil"].append(torch.from_numpy(np.array(pil_out)).permute(2, 0, 1))
            params.append(drawn[1:])
            xs.append(torch.from_numpy(arr).permute(2, 0, 1))
        assert params, f"{op.name}: every draw skipped the op"
        out = apply_batched(device_op_name(op), torch.stack(xs), params)
        for (name, ref), bound in zip(refs.items(), BOUNDS.get((spec, op.name), (0, 0))):
            diff = (out.int() - torch.stack(ref).int()).abs().max().item()
            assert diff <= bound, f"{op.name} vs {name}: max |diff| {diff} > {bound}"


@pytest.mark.parametrize("spec", [BIGVISION, TIMM])
def test_one_layer_of_mixed_ops_matches_pil_image_by_image(crops, spec):
    """A layer whose images each draw another op (every op of the spec, skipped ones too), run as one batch (sorted
    into runs by op kind and back): each image is PIL's result of its own op, bit for bit."""
    from PIL import Image

    from dpnrepro.data.gpu_ops import augment_layer, encode_op, order_layer

    ops = randaugment(spec, 224, 3).ops
    xs, rows, refs = [], [], []
    for k in range(len(ops) + 3):  # every op once, a few twice
        op, arr = ops[k % len(ops)], crops[k % len(crops)]
        drawn, _ = _seeded(lambda: draw_op(op, 224), 100 + k)
        ref, _ = _seeded(lambda: op(Image.fromarray(arr)), 100 + k)
        xs.append(torch.from_numpy(arr).permute(2, 0, 1))
        rows.append(encode_op(drawn, 224))
        refs.append(torch.from_numpy(np.array(ref)).permute(2, 0, 1))
    rows = order_layer(torch.tensor(rows, dtype=torch.float64))
    out = augment_layer(torch.stack(xs), rows, rows)
    for k, (got, ref) in enumerate(zip(out, refs)):
        assert torch.equal(got, ref), f"image {k} ({ops[k % len(ops)].name}): max |diff| {(got.int() - ref.int()).abs().max()}"


# Measured on 56 images (the 7 photos x 8 seeds): big_vision 224 px mean 0.0012, 0.008 % of the values off by > 1;
# torchvision 256 px mean 0.22, 5.2 % off by > 1. Every op is exact on equal inputs (above); what differs is the
# crop's resize (torchvision's: ~11 % of the values by 1, the fixed-point uint8 kernel vs one float rounding), which
# RandAugment amplifies: Color / Contrast / Sharpness extrapolate with factors up to 2.8 at m15, Equalize and
# AutoContrast stretch the histogram, and a threshold op (Solarize, Posterize) can turn 1 level into many.
@pytest.mark.parametrize("sampler,size,mean_bound,over_one_bound", [("big_vision", 224, 0.01, 0.001),
                                                                    ("torchvision", 256, 0.3, 0.08)])
def test_device_chain_matches_the_cpu_path(photos, sampler, size, mean_bound, over_one_bound):
    """Crop + flip + big_vision RandAugment m15 end to end against the fast CPU path."""
    blobs = photos * 4
    seeds = [31 * k + 5 for k in range(len(blobs))]
    plan = PlanTransform(size, 3, randaug=BIGVISION, crop_sampler=sampler)
    out = DeviceAugment(size, 3, "cpu", sampler)(PlanBatch([_seeded(lambda: plan(b), s)[0]
                                                             for b, s in zip(blobs, seeds)]))
    cpu = FastTrainTransform(size, 3, randaug=BIGVISION, crop_sampler=sampler, uint8=True)
    ref = torch.stack([_seeded(lambda: cpu(b), s)[0] for b, s in zip(blobs, seeds)])
    diff = (out.int() - ref.int()).abs().float()
    assert diff.mean() < mean_bound, f"mean {diff.mean()}"
    assert (diff > 1).float().mean() < over_one_bound, f"{(diff > 1).float().mean()} of the values differ by > 1"


# --- errors and plumbing -----------------------------------------------------------------------------

def test_png_and_pixel_inputs_are_decoded_by_the_worker(photos):
    """The device decodes JPEG only: a PNG (or pixel-store array) reaches it as uint8 pixels, same box and crop."""
    import io

    from PIL import Image

    rgb = np.asarray(Image.open(io.BytesIO(photos[0])).convert("RGB"))
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    plan = PlanTransform(64, 3, crop_sampler="big_vision")
    from_png, _ = _seeded(lambda: plan(buf.getvalue()), 3)
    from_pixels, _ = _seeded(lambda: plan(rgb), 3)
    assert not from_png.jpeg and from_png.box == from_pixels.box
    out = DeviceAugment(64, 3, "cpu", "big_vision")(PlanBatch([from_png, from_pixels]))
    ref, _ = _seeded(lambda: FastTrainTransform(64, 3, crop_sampler="big_vision", uint8=True)(rgb), 3)
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], ref)


def test_a_corrupt_jpeg_is_named(photos):
    bad = bytearray(photos[0])
    bad[len(bad) // 2 : len(bad) // 2 + 4000] = b"\xff" * 4000
    plan = PlanTransform(64, 3)
    plans = [_seeded(lambda: plan(b), 0)[0]._replace(where=name)
             for b, name in ((photos[1], "good.jpg"), (bytes(bad), "bad.jpg"))]
    with pytest.raises(DatasetError, match="bad.jpg"):
        DeviceAugment(64, 3, "cpu")(PlanBatch(plans))


def test_a_jpeg_the_device_refuses_is_decoded_on_the_cpu(photos, monkeypatch):
    """nvJPEG refuses some valid JPEGs (CMYK, ...): the batch still decodes, that image through libjpeg-turbo."""
    import torchvision.io

    real, refused = torchvision.io.decode_jpeg, photos[2]

    def device_decoder(data, mode=torchvision.io.ImageReadMode.UNCHANGED, device=None, **kw):
        batch = data if isinstance(data, list) else [data]
        if device is not None and any(bytes(t.numpy()) == refused for t in batch):
            raise RuntimeError("nvjpeg: unsupported JPEG")
        return real(data, mode=mode, **kw)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", device_decoder)
    plan = PlanTransform(64, 3)
    plans = [_seeded(lambda: plan(b), k)[0] for k, b in enumerate(photos[:4])]
    out = DeviceAugment(64, 3, "cpu")(PlanBatch(plans))
    monkeypatch.setattr(torchvision.io, "decode_jpeg", real)
    assert torch.equal(out, DeviceAugment(64, 3, "cpu")(PlanBatch(plans)))


def test_gpu_backend_refuses_what_it_does_not_implement():
    from dpnrepro.data.loader import train_batches

    cfg = {"image_size": 28, "channels": 3, "randaug": "", "backend": "gpu"}
    with pytest.raises(UserError, match="inception_crop"):
        train_batches([], {**cfg, "inception_crop": False}, None, 0, None, "cpu")
    with pytest.raises(UserError, match="random erasing"):
        train_batches([], {**cfg, "random_erasing": 0.25}, None, 0, None, "cpu")


def test_upload_off_cuda_is_a_plain_copy():
    x = torch.arange(12, dtype=torch.uint8).reshape(3, 4)
    assert torch.equal(upload(x, "cpu"), x)


# --- in the trainer ----------------------------------------------------------------------------------

def _photo_split(n: int):
    from dpnrepro.benchmarks.trainer_loop import photo_split

    return photo_split(n, 4)


def test_train_batches_gpu_and_fast_agree(photos):
    """The trainer's loader with backend gpu (device cpu) against fast: same labels, pixels within the chain's bound."""
    from dpnrepro.data.loader import StepBatchSampler, train_batches

    ds = _photo_split(24)
    cfg = {"image_size": 28, "channels": 3, "inception_crop": True, "crop_sampler": "big_vision", "flip": True,
           "randaug": BIGVISION, "crop_min_area": 0.05}
    sampler = StepBatchSampler(len(ds), 8, seed=3, start_step=0, total_steps=3)
    got = {b: list(train_batches(ds, {**cfg, "backend": b}, sampler, 0, 4, "cpu")) for b in ("gpu", "fast")}
    for (x_gpu, y_gpu), (x_fast, y_fast) in zip(got["gpu"], got["fast"]):
        assert x_gpu.dtype == x_fast.dtype == torch.uint8 and x_gpu.shape == x_fast.shape == (8, 3, 28, 28)
        assert torch.equal(y_gpu, y_fast)
        assert (x_gpu.int() - x_fast.int()).abs().float().mean() < 0.5


def test_trainer_runs_the_gpu_backend_on_cpu_the_same_with_workers(tmp_path):
    from dpnrepro.config.core import InputParams, TrainParams
    from dpnrepro.config.runtime import RuntimeParams
    from dpnrepro.training.trainer import ModelSpec, train_classifier

    det = torch.are_deterministic_algorithms_enabled()
    ds = _photo_split(32)
    spec = ModelSpec(arch="Mu/7", stem="dpn", placement="pre-pre", num_classes=4, img_size=28, in_chans=3, pool="tok",
                     rep_size=False, head_bias_init=0.0, pos_drop_rate=0.0, proj_drop_rate=0.0, drop_path_rate=0.1)
    inp = InputParams(image_size=28, channels=3, eval_resize=28, crop_sampler="big_vision", randaug=BIGVISION,
                      mixup=0.5, backend="gpu")
    cfg = TrainParams(lr=1e-3, batch_size=8, steps=3, warmup_steps=1, device="cpu")
    try:
        weights = [train_classifier(spec, ds, inp, cfg, seed=0, ckpt_dir=tmp_path / str(w), progress=False,
                                    runtime=RuntimeParams(workers=w, log_every=1)).state_dict() for w in (0, 1)]
    finally:
        torch.use_deterministic_algorithms(det)
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert all(torch.isfinite(v).all() for v in weights[0].values())


# --- the benchmark's report ----------------------------------------------------------------------------

def test_gpu_benchmark_report_rows():
    from dpnrepro.benchmarks.gpu_input import render_markdown

    e2e = [{"backend": b, "workers": 14, "batch": 256, "steps_timed": 20, "img_per_s": v, "cpu_s_per_img": c,
            "cores_for_b16": 3300 * c} for b, v, c in (("pil", 2000.0, 0.0024), ("gpu", 9000.0, 0.0002))]
    md = render_markdown({"command": "c", "device": "NVIDIA H100", "cpus": 16, "torch": "2.11",
                          "cpu": {"backends": {"gpu": {"img_per_s_per_core": 11408.0, "ci": [11059.0, 11639.0],
                                                       "cores_for_b16": 0.289}}},
                          "device_half": {"batch": 256, "img_per_s": 20000.0, "main_cpu_s_per_img": 5e-5},
                          "end_to_end": e2e,
                          "agreement": {"images": 64, "max_abs_diff": 2.0, "mean_abs_diff": 0.0125,
                                        "frac_over_1": 0.001}})
    assert "| `gpu` | read bytes, parse header, draw crop / flip / RandAugment | 11408 [11059, 11639] | 0.29 |" in md
    assert "| `pil` | 14 | 2000 | 2.40 | 7.9 |" in md and "| `gpu` | 14 | 9000 | 0.20 | 0.7 |" in md
    assert "20000 img/s, 0.050 ms" in md and "max |diff| 2, mean 0.013" in md


def _burn(seconds: float) -> None:
    import time

    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_benchmark_cpu_time_counts_joined_children():
    """A loader worker joined inside the window still counts (else "CPU ms per image" can come out negative)."""
    import multiprocessing

    import psutil

    from dpnrepro.benchmarks.gpu_input import _cpu_s

    proc = psutil.Process()
    before = _cpu_s(proc)
    child = multiprocessing.get_context("fork").Process(target=_burn, args=(0.4,))
    child.start()
    child.join()
    assert _cpu_s(proc) - before >= 0.35


def test_benchmark_window_holds_exactly_its_batches(monkeypatch):
    """A pipeline that makes batch k + 1 before handing over batch k (the device path's producer): the work
    done between the two marks is that of exactly ``steps`` batches, the loader is not exhausted inside it."""
    import dpnrepro.benchmarks.gpu_input as gi

    made = []

    def batches(ds, cfg, sampler, workers, num_classes, device):
        def gen():
            pending = None
            for _ in range(len(sampler)):  # one batch ahead, as DeviceBatches / a prefetching loader
                made.append(1)
                if pending is not None:
                    yield pending
                pending = (torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(2))
            if pending is not None:
                yield pending
        return gen()

    monkeypatch.setattr("dpnrepro.data.loader.train_batches", batches)
    monkeypatch.setattr(gi, "_cpu_s", lambda proc: float(len(made)))  # "CPU seconds" = batches made so far
    r = gi.end_to_end("gpu", "cpu", workers=0, batch=2, steps=20, warmup=5, ds=list(range(64)))
    assert r["cpu_s_per_img"] * r["steps_timed"] * r["batch"] == 20


# --- on CUDA (skipped without a GPU) ---------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _packed(photos, size, sampler, randaug, n=16):
    from dpnrepro.data.gpu import pack

    plan = PlanTransform(size, 3, randaug=randaug, crop_sampler=sampler)
    blobs = (photos * n)[:n]
    return pack([_seeded(lambda: plan(b), 11 * k + 1)[0] for k, b in enumerate(blobs)], size, 3)


@cuda
@pytest.mark.parametrize("sampler,randaug", [("big_vision", BIGVISION), ("torchvision", TIMM)])
def test_cuda_augmentation_never_waits_for_the_device(photos, sampler, randaug):
    """Upload, crop + resize + flip and every RandAugment layer: no host synchronisation (decode excluded:
    nvJPEG waits on its own stream, in the producer thread)."""
    aug = DeviceAugment(224, 3, "cuda", sampler)
    batch = _packed(photos, 224, sampler, randaug, n=32)
    flat = aug.decode(batch)
    aug.augment(flat, batch)  # warm-up: kernels, pinned-memory pool
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = aug.augment(flat, batch)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert out.shape == (32, 3, 224, 224) and out.is_cuda


@cuda
@pytest.mark.parametrize("sampler,randaug", [("big_vision", BIGVISION), ("torchvision", TIMM)])
def test_cuda_augmentation_is_the_cpu_one_on_the_same_decoded_pixels(photos, sampler, randaug):
    """Given libjpeg-turbo's pixels, the device computes what the CPU computes, bit for bit (gathers, float32
    elementwise ops in the CPU's order, integer and float64 LUTs; no TF32 anywhere)."""
    batch = _packed(photos, 224, sampler, randaug)
    flat = DeviceAugment(224, 3, "cpu", sampler).decode(batch)
    got = DeviceAugment(224, 3, "cuda", sampler).augment(flat.cuda(), batch).cpu()
    ref = DeviceAugment(224, 3, "cpu", sampler).augment(flat, batch)
    assert torch.equal(got, ref), f"max |diff| {(got.int() - ref.int()).abs().max()}"


@cuda
def test_cuda_producer_thread_hands_over_every_batch_in_order(photos):
    from dpnrepro.data.gpu import DeviceBatches

    batches = [(_packed(photos, 64, "big_vision", BIGVISION, n=8), torch.full((8,), k)) for k in range(5)]
    aug = DeviceAugment(64, 3, "cuda", "big_vision")
    got = list(DeviceBatches(batches, aug))
    assert [int(t[0]) for _, t in got] == list(range(5))
    for (images, _), (batch, _) in zip(got, batches):
        assert torch.equal(images.cpu(), aug(batch).cpu())
    stream = iter(DeviceBatches(batches, aug))  # abandoned early: the producer stops
    next(stream)
    stream.close()
