"""Benchmark the CPU input paths and `prepare` on a real-photo JPEG folder (``tools/photo_folder.py``)
→ reports/input_folder.md.

    python tools/bench_folder.py                     # 10,000 + 1,000 images, all CPU cores for prepare
    python tools/bench_folder.py --train 100000 --val 0 --workers 16

Not a DVC stage (minutes, wall-clock numbers of one machine): run it once on an otherwise idle machine.

Input paths (training's train transform, :func:`dpnrepro.data.loader.build_transform` with ``uint8=True``
as the trainer builds it, one thread, per-example seeding as ``TransformedSplit``; each image read from its
file through a ``storage: source`` split): ``input.backend`` ``pil`` / ``fast`` x ``input.crop_sampler``
``torchvision`` / ``big_vision`` (the full profile's: ``pil`` + ``big_vision``), all with RandAugment
``rand-n2-m15-tbigvision``, flip, 224 px. Timing as the ``bench_input`` stage (interleaved rounds, medians,
order-statistic 95 % CIs: :mod:`dpnrepro.benchmarks.rounds`).

``prepare`` of the folder: wall time, CPU time of the process and its workers, and bytes written (the
output directory plus the ``datasets`` cache, where ``copy`` storage's imagefolder loader writes an
Arrow copy of the folder first) for ``copy`` (today's), ``source`` with 1 and with N workers, and, for the
decision between ``source`` and streaming shards, writing the folder as webdataset-style tar shards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from dpnrepro.benchmarks.rounds import median_ci, round_orders
from dpnrepro.cli import stage
from dpnrepro.errors import ParamsError
from dpnrepro.io import write_json_atomic, write_text_atomic

PATHS = {  # name -> (input.backend, input.crop_sampler)
    "pil_torchvision": ("pil", "torchvision"),
    "pil_big_vision": ("pil", "big_vision"),
    "fast_torchvision": ("fast", "torchvision"),
    "fast_big_vision": ("fast", "big_vision"),
}
RANDAUG = "rand-n2-m15-tbigvision"
B16_IMG_PER_S = 3300  # the B/16 training rate on one H100 the input must feed (img/s)


def _split(folder: Path, tmp: Path):
    """The folder's train images as a ``storage: source`` split (one worker: indexing is not timed here)."""
    from dpnrepro.data.loader import load_split
    from dpnrepro.data.prepare import prepare_dataset
    from dpnrepro.data.source_index import index_image_folder

    n_classes = len(index_image_folder(folder, {"train": "train"})["train"].features["label"].names)
    cfg = dict(name="photos", format="imagefolder", source=str(folder), train_split="train", eval_split=None,
               minival_fraction=0.01, train_examples=0, minival_examples=0, val_examples=0,
               num_classes=n_classes, storage="source", seed=0)
    prepare_dataset(cfg, tmp / "prepared", workers=1)
    return load_split(tmp / "prepared", "train")


def input_paths(folder: str | os.PathLike, n: int = 100, rounds: int = 10, seed: int = 0, size: int = 224,
                progress: bool = True) -> dict:
    """img/s per core (images / process CPU s) and wall img/s of every input path of :data:`PATHS`."""
    import torch
    from tqdm.auto import tqdm

    from dpnrepro.benchmarks.input_pipeline import _single_thread
    from dpnrepro.data.fast import undecoded
    from dpnrepro.data.loader import TransformedSplit, build_transform

    _single_thread()
    with tempfile.TemporaryDirectory(prefix="bench_folder_") as tmp:
        ds = _split(Path(folder), Path(tmp))
        views = {}
        for name, (backend, sampler) in PATHS.items():
            cfg = {"image_size": size, "channels": 3, "inception_crop": True, "crop_sampler": sampler, "flip": True,
                   "randaug": RANDAUG, "backend": backend}
            data = undecoded(ds) if backend == "fast" else ds  # as the trainer hands them over
            views[name] = TransformedSplit(data, build_transform(cfg, train=True, uint8=True))
        order = random.Random(seed).sample(range(len(ds)), len(ds))  # random files, as a shuffled epoch

        def timed(view, r: int, count: int) -> tuple[float, float]:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for j in range(count):
                i = order[(r * count + j) % len(order)]
                view[(i, seed * 1_000_003 + r * count + j)]
            return time.process_time() - cpu0, time.perf_counter() - wall0

        for view in views.values():
            timed(view, rounds + 1, 20)  # warm-up
        per_core = {p: [] for p in PATHS}
        wall = {p: [] for p in PATHS}
        orders = round_orders(list(PATHS), rounds, seed)
        torch.set_num_threads(1)
        with tqdm(total=rounds * len(PATHS), desc="input paths", unit="block", disable=not progress) as bar:
            for r, names in enumerate(orders):
                for p in names:
                    cpu, w = timed(views[p], r, n)  # the same files and draws for every path
                    per_core[p].append(n / max(cpu, 1e-9))
                    wall[p].append(n / max(w, 1e-9))
                    bar.update(1)
    out = {}
    for p, (backend, sampler) in PATHS.items():
        med, lo, hi, _ = median_ci(per_core[p])
        out[p] = {"backend": backend, "crop_sampler": sampler, "img_per_s_per_core": med,
                  "img_per_s_per_core_ci": None if lo is None else [lo, hi], "wall_img_per_s": median_ci(wall[p])[0],
                  "cores_for_b16": B16_IMG_PER_S / med, "rounds_img_per_s_per_core": per_core[p]}
    return {"n_per_round": n, "rounds": rounds, "seed": seed, "image_size": size, "randaug": RANDAUG,
            "round_orders": orders, "paths": out}


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def _cpu_s() -> float:
    self_, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return self_.ru_utime + self_.ru_stime + kids.ru_utime + kids.ru_stime


def write_tar_shards(folder: Path, out: Path, per_shard: int = 1000) -> int:
    """The folder's files as webdataset-style tar shards (``<class>/<stem>.jpg`` + ``.cls``); returns bytes."""
    import io

    files = sorted(p for p in folder.rglob("*.jpg"))
    classes = {c: i for i, c in enumerate(sorted({p.parent.name for p in files}))}
    out.mkdir(parents=True)
    for s in range(0, len(files), per_shard):
        with tarfile.open(out / f"shard-{s // per_shard:06d}.tar", "w") as tar:
            for p in files[s : s + per_shard]:
                key = f"{p.parent.parent.name}_{p.parent.name}_{p.stem}"
                tar.add(p, arcname=f"{key}.jpg")
                label = str(classes[p.parent.name]).encode()
                info = tarfile.TarInfo(f"{key}.cls")
                info.size = len(label)
                tar.addfile(info, io.BytesIO(label))
    return _bytes_under(out)


def prepare_costs(folder: str | os.PathLike, workers: int) -> dict:
    """Wall s, CPU s (this process + its workers) and bytes written by ``prepare`` of ``folder`` (train +
    val splits) in ``copy`` storage, ``source`` storage with 1 and ``workers`` processes, and tar shards."""
    import datasets

    from photo_folder import source_photos

    from dpnrepro.data.prepare import prepare_dataset

    folder = Path(folder)
    n_classes = len({name for name, _ in source_photos()})
    base = dict(name="photos", format="imagefolder", source=str(folder), train_split="train", eval_split="validation",
                minival_fraction=0.01, train_examples=0, minival_examples=0, val_examples=0,
                num_classes=n_classes, seed=0)
    runs = {"copy": ({**base, "storage": "copy"}, 1), "source_1_worker": ({**base, "storage": "source"}, 1),
            f"source_{workers}_workers": ({**base, "storage": "source"}, workers)}
    out = {}
    for name, (cfg, w) in runs.items():
        with tempfile.TemporaryDirectory(prefix="bench_prepare_", dir=folder.parent) as tmp:
            tmp = Path(tmp)
            saved, datasets.config.HF_DATASETS_CACHE = datasets.config.HF_DATASETS_CACHE, tmp / "hf_cache"
            try:
                cpu0, wall0 = _cpu_s(), time.perf_counter()
                manifest = prepare_dataset(cfg, tmp / "prepared", workers=w)
                wall, cpu = time.perf_counter() - wall0, _cpu_s() - cpu0
            finally:
                datasets.config.HF_DATASETS_CACHE = saved
            out[name] = {"storage": cfg["storage"], "workers": w, "wall_s": wall, "cpu_s": cpu,
                         "bytes_prepared": _bytes_under(tmp / "prepared"),
                         "bytes_datasets_cache": _bytes_under(tmp / "hf_cache"),
                         "examples": {k: v["examples"] for k, v in manifest["splits"].items()},
                         "sha256": {k: v["sha256"] for k, v in manifest["splits"].items()}}
            out[name]["bytes_written"] = out[name]["bytes_prepared"] + out[name]["bytes_datasets_cache"]
    with tempfile.TemporaryDirectory(prefix="bench_shards_", dir=folder.parent) as tmp:
        cpu0, wall0 = _cpu_s(), time.perf_counter()
        written = write_tar_shards(folder, Path(tmp) / "shards")
        out["tar_shards"] = {"storage": "webdataset-style tar shards (copy of the JPEG bytes, no decode check)",
                             "workers": 1, "wall_s": time.perf_counter() - wall0, "cpu_s": _cpu_s() - cpu0,
                             "bytes_written": written}
    return out


def _mb(b: int) -> str:
    return f"{b / 1e6:,.1f} MB"


def render_markdown(res: dict) -> str:
    """``reports/input_folder.md``."""
    fol, paths, prep = res["folder"], res["input"]["paths"], res["prepare"]
    n_img = sum(s["images"] for s in fol["splits"].values())
    jpeg = sum(s["jpeg_bytes"] for s in fol["splits"].values())
    lines = [
        "# Input paths and `prepare` on a real-photo JPEG folder",
        "",
        f"Generated by `{res['command']}` (`tools/bench_folder.py`), once.",
        "",
        f"- measured on: {res['hardware']}; load average before / after: {res['load_before']} / {res['load_after']} "
        "(**a shared VM**: other jobs ran on its cores, so wall times are noisy; per-core rates use process CPU time)",
        f"- folder: {fol['splits']['train']['images']:,} train + {fol['splits'].get('validation', {}).get('images', 0):,} val "
        f"JPEGs ({_mb(jpeg)}, {jpeg / n_img / 1e3:.0f} kB each on average), {fol['classes']} classes, from "
        f"{fol['photos']} real photographs (`tools/photo_folder.py`: foolbox's ImageNet photos, scikit-image, "
        "matplotlib), seeded crops, longer side 400-500 px, quality 90; written in "
        f"{fol['wall_s']:.0f} s",
        "",
        "## Input paths, images/s per core",
        "",
        f"The trainer's train transform (`build_transform(..., uint8=True)`): file read → decode → inception crop to "
        f"{res['input']['image_size']} px → flip → RandAugment `{res['input']['randaug']}` → uint8 tensor; one "
        f"thread; {res['input']['rounds']} interleaved rounds of {res['input']['n_per_round']} random files per "
        "path, the same files and seeds for every path; median over rounds [95 % CI for the median, order "
        "statistics]. Cores for B/16 = 3,300 img/s (one H100, compiled) / img/s per core, assuming perfect "
        "scaling over loader workers.",
        "",
        "| `input.backend` | `input.crop_sampler` | img/s per core [95 % CI] | wall img/s | cores for 3,300 img/s |",
        "|---|---|---:|---:|---:|",
    ]
    for p in sorted(paths.values(), key=lambda p: list(PATHS.values()).index((p["backend"], p["crop_sampler"]))):
        ci = p["img_per_s_per_core_ci"]
        ci = "" if ci is None else f" [{ci[0]:.0f}, {ci[1]:.0f}]"
        full = " (full profile)" if (p["backend"], p["crop_sampler"]) == ("pil", "big_vision") else ""
        lines.append(f"| `{p['backend']}` | `{p['crop_sampler']}`{full} | {p['img_per_s_per_core']:.0f}{ci} | "
                     f"{p['wall_img_per_s']:.0f} | {p['cores_for_b16']:.1f} |")
    if prep:
        lines += _prepare_lines(fol, prep)
    return "\n".join(lines)


def _prepare_lines(fol: dict, prep: dict) -> list[str]:
    n_prep = fol["splits"]["train"]["images"] + fol["splits"].get("validation", {}).get("images", 0)
    scale = 100_000 / n_prep
    measured = scale <= 1  # a folder of 100k images or more: the table is the measurement, nothing extrapolated
    lines = [
        "",
        f"## `prepare` of the folder ({n_prep:,} images)",
        "",
        "Bytes written = the prepared directory + the `datasets` cache (copy storage's imagefolder loader "
        "writes an Arrow table of the folder there first). CPU s = this process + its workers."
        + ("" if measured else " The 100k column "
           f"is an **extrapolation** (x{scale:.0f}, linear in the image count), not a measurement."),
        "",
        "| storage | workers | wall s | CPU s | written | of which `datasets` cache |"
        + ("" if measured else " 100k images: wall s, written (extrapolated) |"),
        "|---|---:|---:|---:|---:|---:|" + ("" if measured else "---:|"),
    ]
    # JSON files keep sorted keys: rows in a fixed order (copy, source by workers, tar shards)
    for r in sorted(prep.values(), key=lambda r: (r["storage"] != "copy", r["storage"] != "source", r["workers"])):
        cache = _mb(r["bytes_datasets_cache"]) if "bytes_datasets_cache" in r else "–"
        lines.append(f"| {r['storage']} | {r['workers']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                     f"{_mb(r['bytes_written'])} | {cache} |"
                     + ("" if measured else f" {r['wall_s'] * scale:,.0f} s, {_mb(r['bytes_written'] * scale)} |"))
    same = [k for k in prep if k.startswith("source") and prep[k].get("sha256") == prep["copy"]["sha256"]]
    return lines + [
        "",
        "Content hashes (`manifest.json`, per split): copy and source storage "
        + ("agree" if len(same) == 2 else "differ (the two list the folder's files in different orders)") + ".",
        "",
    ]


@stage
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=10_000, help="train images of the folder")
    ap.add_argument("--val", type=int, default=1_000, help="val images of the folder")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for writing and prepare")
    ap.add_argument("--n", type=int, default=100, help="images per input path per round")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds (>= 6 for a 95 %% CI)")
    ap.add_argument("--tmp", default=None, help="where the folder is written (default: the system temp dir)")
    ap.add_argument("--skip-prepare", action="store_true", help="leave out the prepare benchmark")
    ap.add_argument("--out-json", default="benchmarks/measured/input_folder.json")
    ap.add_argument("--out-md", default="reports/input_folder.md")
    args = ap.parse_args()
    if min(args.train, args.workers, args.n, args.rounds) < 1 or args.val < 0:
        raise ParamsError("--train, --workers, --n and --rounds must be >= 1, --val >= 0")

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from photo_folder import write_photo_folder

    from dpnrepro.cli import hardware_label

    res = {"command": "python " + " ".join(sys.argv), "hardware": hardware_label(measured_on=True),
           "load_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="photo_folder_", dir=args.tmp) as tmp:
        t0 = time.perf_counter()
        res["folder"] = write_photo_folder(f"{tmp}/photos", args.train, args.val, workers=args.workers)
        res["folder"]["wall_s"] = time.perf_counter() - t0
        res["input"] = input_paths(f"{tmp}/photos", n=args.n, rounds=args.rounds)
        res["prepare"] = {} if args.skip_prepare else prepare_costs(f"{tmp}/photos", args.workers)
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    write_json_atomic(args.out_json, res)
    write_text_atomic(args.out_md, render_markdown(res))
    print(json.dumps({p: round(v["img_per_s_per_core"], 1) for p, v in res["input"]["paths"].items()}))
    print(f"wrote {args.out_json}, {args.out_md}")


if __name__ == "__main__":
    main()
