"""Input-pipeline throughput per CPU core: ``input.backend`` ``pil`` vs ``fast`` on real JPEG photographs.

What one timed image costs (both backends, one thread, per-example seeding as in ``TransformedSplit``):

    JPEG bytes → decode → inception crop to S (area 5-100 %, aspect 3/4-4/3) → flip
    → RandAugment (timm spec, default ``rand-n2-m15-mmax15``) → float tensor (C, S, S) in [-1, 1]

``pil`` is ``Image.open`` + the torchvision-v2/timm transform of :func:`dpnrepro.data.loader.build_transform`;
``fast`` feeds the same bytes to :class:`dpnrepro.data.fast.FastTrainTransform`. Throughput per core is
images / CPU seconds of this (single-threaded) process, so other load on a shared machine inflates it
less than wall time would; both are recorded.

Timing design (:mod:`dpnrepro.benchmarks.rounds`): ``rounds`` rounds, each timing one block of ``n``
images per backend in an order reshuffled every round with a fixed seed, so drift of the machine hits
all backends alike. A backend's img/s per core is the median over rounds; a speed-up ``fast`` / ``pil``
is the median over rounds of the per-round ratio (paired by round) with a distribution-free 95 % CI for
that median (order statistics); "faster" / "slower" only when the CI excludes 1, else "not resolved".

Images: photographs bundled with installed packages — scikit-image's ``skimage/data`` (astronaut, chelsea,
coffee, rocket, hubble_deep_field, motorcycle_left) and matplotlib's ``grace_hopper.jpg`` — resized
(bicubic) so the longer side is ``max_side`` (500: ImageNet-like, e.g. 500x333) and re-encoded as baseline
JPEG, quality 90.
"""

from __future__ import annotations

import importlib.util
import io
import os
import random
import tempfile
import time
from pathlib import Path

from dpnrepro.benchmarks.rounds import MIN_ROUNDS, compare, median_ci, ratio_summary, round_orders
from dpnrepro.errors import UserError

SKIMAGE_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "hubble_deep_field.jpg",
                  "motorcycle_left.png")
DEFAULT_RANDAUG = "rand-n2-m15-tbigvision"
OP_CHAIN = ("JPEG decode → inception crop (RandomResizedCrop, scale 0.05-1, ratio 3/4-4/3) to {size} px "
            "→ horizontal flip (p 0.5) → RandAugment `{randaug}` → float32 (C, {size}, {size}) in [-1, 1]")


def photo_paths() -> list[Path]:
    """The benchmark's source photographs (scikit-image + matplotlib sample data)."""
    import matplotlib

    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the input-pipeline benchmark reads scikit-image's bundled photos; "
                        "install it with `pip install scikit-image==0.26.0`")
    ski = Path(list(spec.submodule_search_locations)[0]) / "data"
    paths = [ski / name for name in SKIMAGE_PHOTOS]
    paths.append(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UserError(f"benchmark photos missing: {', '.join(missing)}; reinstall scikit-image / matplotlib")
    return paths


def load_photos(max_side: int = 500, quality: int = 90) -> tuple[list[bytes], list[dict]]:
    """JPEG bytes of every benchmark photo (longer side ``max_side``) and a description of each."""
    from PIL import Image

    blobs, info = [], []
    for path in photo_paths():
        with Image.open(path) as src:
            im = src.convert("RGB")
        w, h = im.size
        f = max_side / max(w, h)
        im = im.resize((max(1, round(w * f)), max(1, round(h * f))), Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=quality)
        blobs.append(buf.getvalue())
        info.append({"name": path.name, "package": path.parts[-3] if path.parent.name == "data" else "matplotlib",
                     "original_size": [w, h], "size": list(im.size), "jpeg_bytes": len(blobs[-1])})
    return blobs, info


def photo_split(n: int, num_classes: int):
    """A ``datasets`` train split of ``n`` real JPEG photos (cycled), labels ``i % num_classes``."""
    import datasets

    blobs, _ = load_photos()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=num_classes)})
    return datasets.Dataset.from_dict(
        {"image": [{"bytes": blobs[i % len(blobs)], "path": None} for i in range(n)],
         "label": [i % num_classes for i in range(n)]}, features=features)


def decode_all(images: list[bytes], store_dir) -> list:
    """The photos written to a prepare-time pixel store at ``store_dir`` (full size), read back as the
    memory-mapped uint8 arrays training hands to the fast transform."""
    from dpnrepro.data.pixel_store import PixelStore, write_pixel_store

    write_pixel_store(images, store_dir, side=1 << 30)  # no downscale: the photos are already <= 500 px
    store = PixelStore(store_dir)
    return [store[i] for i in range(len(store))]


def make_pipeline(backend: str, size: int = 224, channels: int = 3, randaug: str = DEFAULT_RANDAUG):
    """``image -> tensor`` for one backend, exactly as training would build it: ``pil`` takes JPEG bytes
    (opened with PIL), ``fast`` JPEG bytes, ``fast_pixels`` (the fast transform) pre-decoded uint8 arrays."""
    from PIL import Image

    from dpnrepro.data.loader import build_transform

    cfg = {"image_size": size, "channels": channels, "eval_resize": size, "inception_crop": True, "flip": True,
           "randaug": randaug, "backend": "pil" if backend == "pil" else "fast"}
    transform = build_transform(cfg, train=True)
    if backend == "pil":
        return lambda data: transform(Image.open(io.BytesIO(data)))
    if backend in ("fast", "fast_pixels"):
        return transform
    raise ValueError(f"unknown input backend {backend!r}")


def _single_thread() -> None:
    import torch

    torch.set_num_threads(1)
    try:
        import cv2

        cv2.setNumThreads(1)
    except ImportError:  # pragma: no cover - cv2 comes with mmcv
        pass


def _timed(pipeline, images: list[bytes], n: int, seed: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) for ``n`` images, each seeded like ``TransformedSplit``."""
    import torch

    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i in range(n):
        s = seed * 1_000_003 + i
        torch.default_generator.manual_seed(s)  # torch.manual_seed also queues CUDA/XPU/MTIA seeding
        random.seed(s)
        pipeline(images[i % len(images)])
    return time.process_time() - cpu0, time.perf_counter() - wall0


def measure(backend: str, images: list[bytes], n: int, seed: int = 0, **kw) -> float:
    """Images per second per CPU core (images / CPU seconds, one thread) of ``backend`` over ``n`` images."""
    _single_thread()
    pipeline = make_pipeline(backend, **kw)
    _timed(pipeline, images, min(n, 20), seed + 1)  # warm-up: imports, first-call allocations
    cpu, _ = _timed(pipeline, images, n, seed)
    return n / max(cpu, 1e-9)


# Speed-ups reported: key -> (backend, reference backend).
SPEEDUPS = {"fast_over_pil": ("fast", "pil"), "fast_pixels_over_pil": ("fast_pixels", "pil")}


def run_input_benchmark(n: int = 100, rounds: int = 20, seed: int = 0, size: int = 224,
                        randaug: str = DEFAULT_RANDAUG, max_side: int = 500, quality: int = 90,
                        progress: bool = False) -> dict:
    """Interleaved rounds of ``pil``, ``fast`` and ``fast_pixels`` (order reshuffled per round with
    ``seed``); per backend the median over rounds of img/s per core (CPU time) and of wall img/s, per
    speed-up the median of the per-round ratios with its 95 % CI."""
    from tqdm.auto import tqdm

    from dpnrepro.cli import hardware_label

    if n < 1 or rounds < 1:
        raise UserError("input benchmark: n and rounds must be >= 1")
    _single_thread()
    images, info = load_photos(max_side, quality)
    with tempfile.TemporaryDirectory(prefix="pixel_store_") as store:
        inputs = {"pil": images, "fast": images, "fast_pixels": decode_all(images, store)}
        pipelines = {b: make_pipeline(b, size=size, randaug=randaug) for b in inputs}
        for b, p in pipelines.items():
            _timed(p, inputs[b], 20, seed + 1)  # warm-up: imports, first-call allocations
        per_core = {b: [] for b in pipelines}
        wall = {b: [] for b in pipelines}
        orders = round_orders(list(pipelines), rounds, seed)
        with tqdm(total=rounds * len(pipelines), desc="bench_input", unit="block", disable=not progress) as bar:
            for r, order in enumerate(orders):
                for b in order:
                    cpu, w = _timed(pipelines[b], inputs[b], n, seed + r)  # same images and draws every backend
                    per_core[b].append(n / max(cpu, 1e-9))
                    wall[b].append(n / max(w, 1e-9))
                    bar.update(1)

    backends = {}
    for b in pipelines:
        med, lo, hi, cov = median_ci(per_core[b])
        backends[b] = {"img_per_s_per_core": med, "img_per_s_per_core_ci": None if lo is None else [lo, hi],
                       "wall_img_per_s": median_ci(wall[b])[0], "rounds_img_per_s_per_core": per_core[b],
                       "rounds_wall_img_per_s": wall[b]}
    speedups = {}
    for key, (a, ref) in SPEEDUPS.items():
        sm = ratio_summary(per_core[a], per_core[ref])  # img/s ratio: > 1 means ``a`` is faster
        speedups[key] = {"backend": a, "reference": ref, "median": sm["median"],
                         "ci": None if sm["lo"] is None else [sm["lo"], sm["hi"]], "ci_coverage": sm["coverage"],
                         "resolved": compare(sm, above="faster", below="slower"), "ratios": sm["ratios"]}
    return {
        "hardware": hardware_label(measured_on=True),
        "threads": 1,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "image_size": size,
        "randaug": randaug,
        "op_chain": OP_CHAIN.format(size=size, randaug=randaug),
        "images": info,
        "image_source": (f"{len(info)} photographs from installed packages (scikit-image data, matplotlib "
                         f"sample_data), longer side resized to {max_side} px (bicubic), JPEG quality {quality}"),
        "n_per_round": n,
        "rounds": rounds,
        "seed": seed,
        "round_orders": orders,
        "statistic": ("median over rounds; speed-ups: median of the per-round img/s ratios (paired by round), "
                      "95 % CI for the median from order statistics (distribution-free, exact binomial coverage)"),
        "backends": backends,
        "speedups": speedups,
    }


def _ci(ci, fmt: str) -> str:
    return "(no CI)" if ci is None else f"[{format(ci[0], fmt)}, {format(ci[1], fmt)}]"


def render_markdown(res: dict) -> str:
    """``reports/input_pipeline.md``."""
    b, sp = res["backends"], res["speedups"]
    cov = next((x["ci_coverage"] for x in sp.values() if x["ci_coverage"]), None)

    def cell(name):
        return f"{b[name]['img_per_s_per_core']:.1f} {_ci(b[name]['img_per_s_per_core_ci'], '.1f')}"

    def speed(key):
        x = sp[key]
        return f"**{x['median']:.2f}x** {_ci(x['ci'], '.2f')} ({x['resolved']})"

    lines = [
        "# Input pipeline throughput per CPU core",
        "",
        "Generated by `stages/bench_input.py`.",
        "",
        f"- measured on: {res['hardware']} (one thread; `OMP_NUM_THREADS={res['omp_num_threads'] or 'unset'}`)",
        f"- images: {res['image_source']}: "
        + ", ".join(f"{i['name']} {i['size'][0]}x{i['size'][1]}" for i in res["images"]),
        f"- op chain (both backends): {res['op_chain']}",
        f"- timing: {res['rounds']} interleaved rounds; each round runs one block of {res['n_per_round']} images "
        f"per backend, in an order reshuffled every round (seed {res['seed']}; orders in the JSON), every image "
        "seeded per example (same draws for every backend); img/s per core = images / process CPU seconds",
        "- statistics: per backend the median over rounds; a speed-up is the median over rounds of the "
        "per-round img/s-per-core ratio (paired by round); brackets are **95 % CIs for the median from order "
        "statistics** (distribution-free; exact binomial coverage"
        + (f" {100 * cov:.1f} % with {res['rounds']} rounds" if cov else
           f"; none with fewer than {MIN_ROUNDS} rounds") + "); \"faster\" only when the CI excludes 1x",
        "",
        "| backend | img/s per core, median [95 % CI] | wall img/s (median) | what it does |",
        "|---|---:|---:|---|",
        f"| `pil` | {cell('pil')} | {b['pil']['wall_img_per_s']:.1f} | PIL decode, torchvision v2 "
        "RandomResizedCrop + flip, timm RandAugment (PIL), v2 ToDtype + Normalize |",
        f"| `fast` | {cell('fast')} | {b['fast']['wall_img_per_s']:.1f} | crop sampled from the "
        "JPEG header; `torchvision.io.decode_jpeg` straight into a uint8 tensor (PIL DCT-scaled `draft` decode "
        "when the crop allows 1/2-1/8); uint8 crop + antialiased bilinear resize (torch channels-last kernel); "
        "flip and RandAugment on the uint8 crop (Rotate/Shear/Sharpness in OpenCV, LUT ops and Brightness in "
        "NumPy, the rest timm's PIL ops); one float conversion |",
        f"| `fast` from the pixel store | {cell('fast_pixels')} | {b['fast_pixels']['wall_img_per_s']:.1f} | the "
        "`fast` transform fed the uint8 pixels of a prepare-time "
        "pixel store (`data.pixel_store_side`, `data/pixel_store.py`; memory-mapped, ~9x the bytes of JPEG q90) "
        "— no decode at train time; what smoke and mini train from |",
        "",
        f"Speed-up per core over `pil` (median of per-round ratios [95 % CI]): `fast` {speed('fast_over_pil')}; "
        f"`fast` from the pixel store {speed('fast_pixels_over_pil')}.",
        "",
        "Same samplers and RNG draws in both backends (same crop box, flip, RandAugment ops and magnitudes for "
        "one seed); approximations of `fast` are listed in `src/dpnrepro/data/fast.py` and "
        "`src/dpnrepro/data/randaugment.py` (OpenCV's bicubic/bilinear kernels for Rotate/ShearX/ShearY, "
        "≲1 grey level mean abs difference; DCT-domain pre-downscale for crops ≥ 2x the output size, never at "
        "224 px from these ~500 px photos).",
        "",
        "Every CPU input path on a JPEG folder read from disk (the full profile's `crop_sampler: big_vision` "
        "included), the cores each needs for B/16's rate, and `prepare` of the folder per `data.storage`: "
        "[input_folder.md](input_folder.md) (`tools/bench_folder.py`).",
        "",
    ]
    return "\n".join(lines)
