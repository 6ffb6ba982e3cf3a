"""The ``input.backend: gpu`` path against the CPU paths: images/s, and CPU cores for B/16's 3,300 img/s.

On real JPEG photos (:func:`dpnrepro.benchmarks.input_pipeline.load_photos`: scikit-image's and matplotlib's
photos, longer side 500 px, quality 90, cycled; they install on the GPU image too), the full profile's train
transform (224 px, ``crop_sampler`` big_vision, flip, RandAugment ``rand-n2-m15-tbigvision``):

* ``cpu``: img/s per core (process CPU time, one thread) of each backend's per-image work in a loader
  worker: ``pil`` and ``fast`` do everything; ``gpu``'s worker only reads the bytes and draws the parameters
  (:class:`dpnrepro.data.gpu.PlanTransform`). Interleaved rounds, medians, order-statistic 95 % CIs.
* ``device`` (CUDA): :class:`dpnrepro.data.gpu.DeviceAugment` on batches of 256 (nvJPEG decode, crop,
  flip, RandAugment): img/s (wall, synchronised with a blocking event) and the main process's CPU s per image.
* ``end_to_end``: the trainer's own batches (:func:`dpnrepro.data.loader.train_batches`, ``workers`` loader
  processes, images on the device) for every backend, no model: wall img/s and CPU s per image of the main
  process plus its workers (live ones by psutil, joined ones by ``RUSAGE_CHILDREN``) over a window of exactly
  20 batches in steady state (the sampler runs past it: :func:`lookahead`) → cores for 3,300 img/s =
  3,300 x CPU s per image.
* ``agreement`` (CUDA): the device path on CUDA against the same plans on the CPU (nvJPEG vs libjpeg-turbo
  decode, float kernels): max and mean |diff| in grey levels.

    python -m dpnrepro.benchmarks.gpu_input --device cuda --workers 14 --out gpu_input.json --out-md gpu_input.md
    python -m dpnrepro.benchmarks.gpu_input --device cpu --skip-end-to-end --out X.json   # the CPU half only

The trainer with a model on top is ``python -m dpnrepro.benchmarks.trainer_loop --backend gpu``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from dpnrepro.benchmarks.rounds import median_ci, round_orders

B16_IMG_PER_S = 3300
INPUT = {"image_size": 224, "channels": 3, "inception_crop": True, "crop_sampler": "big_vision", "flip": True,
         "randaug": "rand-n2-m15-tbigvision", "crop_min_area": 0.05}
BACKENDS = ("pil", "fast", "gpu")


def _split(n: int):
    from dpnrepro.benchmarks.trainer_loop import photo_split

    return photo_split(n, 10)


def _worker_transform(backend: str):
    """The per-image work a loader worker does for ``backend``, and the split form it reads."""
    from dpnrepro.data.fast import undecoded
    from dpnrepro.data.gpu import PlanTransform
    from dpnrepro.data.loader import build_transform

    if backend == "gpu":
        plan = PlanTransform(INPUT["image_size"], 3, randaug=INPUT["randaug"], crop_sampler=INPUT["crop_sampler"])
        return plan, undecoded
    return build_transform({**INPUT, "backend": backend}, train=True, uint8=True), (
        undecoded if backend == "fast" else (lambda ds: ds))


def cpu_rates(n: int = 100, rounds: int = 10, seed: int = 0) -> dict:
    """img/s per core of each backend's worker-side work (one thread, interleaved rounds)."""
    from dpnrepro.benchmarks.input_pipeline import _single_thread
    from dpnrepro.data.loader import TransformedSplit

    _single_thread()
    ds = _split(max(n, 64))
    views = {}
    for b in BACKENDS:
        transform, prep = _worker_transform(b)
        views[b] = TransformedSplit(prep(ds), transform)

    def timed(view, r: int, count: int) -> float:
        cpu0 = time.process_time()
        for j in range(count):
            view[((r * count + j) % len(ds), seed * 1_000_003 + r * count + j)]
        return time.process_time() - cpu0

    for view in views.values():
        timed(view, rounds + 1, 10)  # warm-up
    per_core = {b: [] for b in BACKENDS}
    orders = round_orders(list(BACKENDS), rounds, seed)
    for r, names in enumerate(orders):
        for b in names:
            per_core[b].append(n / max(timed(views[b], r, n), 1e-9))
    out = {}
    for b in BACKENDS:
        med, lo, hi, _ = median_ci(per_core[b])
        out[b] = {"img_per_s_per_core": med, "ci": None if lo is None else [lo, hi],
                  "cores_for_b16": B16_IMG_PER_S / med, "rounds": per_core[b]}
    return {"n_per_round": n, "rounds": rounds, "orders": orders, "backends": out}


def _plans(n: int, seed: int = 0):
    """A packed batch of ``n`` photos, as the loader workers hand it over."""
    from dpnrepro.data.gpu import pack
    from dpnrepro.data.loader import TransformedSplit

    transform, prep = _worker_transform("gpu")
    view = TransformedSplit(prep(_split(n)), transform)
    return pack([view[(i, seed * 1_000_003 + i)][0] for i in range(n)], INPUT["image_size"], 3)


class _Sync:
    """Waits for ``device`` without spinning a core (a blocking CUDA event), so process CPU time is work."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self) -> None:
        if self.device.type == "cuda":
            ev = torch.cuda.Event(blocking=True)
            ev.record()
            ev.synchronize()


def device_rate(device: str, batch: int = 256, rounds: int = 10) -> dict:
    """img/s and main-process CPU s per image of :class:`DeviceAugment` on a packed batch of ``batch`` photos:
    the whole device half, the decode alone and the augmentation alone (crop + RandAugment on decoded pixels)."""
    from dpnrepro.data.gpu import DeviceAugment

    device = torch.device(device)
    packed = _plans(batch)
    aug, sync = DeviceAugment(INPUT["image_size"], 3, device, INPUT["crop_sampler"]), _Sync(device)
    flat = aug.decode(packed)
    parts = {"all": lambda: aug(packed), "decode": lambda: aug.decode(packed), "augment": lambda: aug.augment(flat, packed)}
    for fn in parts.values():  # warm-up: nvJPEG handles, kernels
        fn()
    sync()
    rates, cpu = {k: [] for k in parts}, []
    for _ in range(rounds):
        for name, fn in parts.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            sync()
            rates[name].append(batch / (time.perf_counter() - t0))
            if name == "all":
                cpu.append((time.process_time() - c0) / batch)
    med, lo, hi, _ = median_ci(rates["all"])
    return {"batch": batch, "img_per_s": med, "ci": None if lo is None else [lo, hi],
            "main_cpu_s_per_img": median_ci(cpu)[0], "rounds_img_per_s": rates["all"],
            "decode_img_per_s": median_ci(rates["decode"])[0], "augment_img_per_s": median_ci(rates["augment"])[0]}


def _cpu_s(proc) -> float:
    """CPU seconds of ``proc``, of its children already joined (``RUSAGE_CHILDREN``: loader workers shut down
    inside the window) and of its live children (psutil)."""
    import resource

    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = sum(proc.cpu_times()[:2]) + kids.ru_utime + kids.ru_stime
    for child in proc.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except Exception:  # noqa: BLE001 - a child that just exited
            pass
    return total


def lookahead(workers: int, prefetch_factor: int = 2) -> int:
    """Batches the pipeline may have made beyond the one handed over: the loader's prefetch and the device
    path's producer queue. The sampler runs that many past the window, so the loader is never exhausted (its
    workers idle or joined) inside it and the window's work is that of its own batches."""
    return max(1, workers) * prefetch_factor + 4


def end_to_end(backend: str, device: str, workers: int, batch: int = 256, steps: int = 20, warmup: int = 5,
               ds=None) -> dict:
    """The trainer's batches for ``backend`` (no model) from ``ds`` (default: the photos, in memory): wall img/s
    and CPU s per image (main process + loader workers) over a window of exactly ``steps`` batches in steady
    state (marks after batch ``warmup`` and after batch ``warmup + steps``; the sampler runs on past it)."""
    import psutil

    from dpnrepro.data.loader import StepBatchSampler, train_batches

    device = torch.device(device)
    ds = _split(max(4 * batch, 1024)) if ds is None else ds
    sampler = StepBatchSampler(len(ds), batch, seed=0, start_step=0,
                               total_steps=warmup + steps + lookahead(workers))
    proc, sync = psutil.Process(), _Sync(device)
    marks = {}
    batches = iter(train_batches(ds, {**INPUT, "backend": backend}, sampler, workers, 10, device))
    try:
        for k, (images, _) in enumerate(batches, start=1):
            images = images.to(device, non_blocking=True)  # the trainer's copy (a no-op for gpu)
            if k in (warmup, warmup + steps):
                sync()
                marks[k] = (time.perf_counter(), _cpu_s(proc))
            if k == warmup + steps:
                break
    finally:
        getattr(batches, "close", lambda: None)()
    (t0, c0), (t1, c1) = marks[warmup], marks[warmup + steps]
    cpu_per_img = (c1 - c0) / (steps * batch)
    return {"backend": backend, "workers": workers, "batch": batch, "steps_timed": steps,
            "img_per_s": steps * batch / (t1 - t0), "cpu_s_per_img": cpu_per_img,
            "cores_for_b16": B16_IMG_PER_S * cpu_per_img}


def _diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a.cpu().int() - b.cpu().int()).abs().float()
    return {"max_abs_diff": d.max().item(), "mean_abs_diff": d.mean().item(), "frac_over_1": (d > 1).float().mean().item()}


def agreement(batch: int = 64) -> dict:
    """The device path on CUDA against the same plans on the CPU, |diff| in grey levels: end to end, and each
    stage alone on the same input: the decode (nvJPEG vs libjpeg-turbo), crop + resize + flip on the CPU's
    decoded pixels, each RandAugment op on the CPU's crops."""
    from dpnrepro.data.gpu import ROW, DeviceAugment, PackedBatch, draw_op
    from dpnrepro.data.gpu_ops import apply_batched, device_op_name
    from dpnrepro.data.randaugment import randaugment

    packed = _plans(batch, seed=1)
    aug = {d: DeviceAugment(INPUT["image_size"], 3, d, INPUT["crop_sampler"]) for d in ("cuda", "cpu")}
    out = {"images": batch, **_diff(aug["cuda"](packed), aug["cpu"](packed))}
    flat = aug["cpu"].decode(packed)
    out["decode"] = _diff(aug["cuda"].decode(packed), flat)
    crop_only = PackedBatch(packed.data, packed.params[:, :len(ROW)], packed.where)
    crops = aug["cpu"].augment(flat, crop_only)
    out["crop_resize_flip"] = _diff(aug["cuda"].augment(flat.cuda(), crop_only), crops)
    out["ops"] = {}
    random.seed(0)
    for op in randaugment(INPUT["randaug"], INPUT["image_size"], 3).ops:
        params = [d[1:] for d in (draw_op(op, INPUT["image_size"]) for _ in range(batch)) if d is not None]
        if params:
            name = device_op_name(op)
            x = crops[: len(params)]
            out["ops"][op.name] = _diff(apply_batched(name, x.cuda(), params), apply_batched(name, x, params))
    return out


def render_markdown(res: dict) -> str:
    lines = ["# `input.backend: gpu` against the CPU paths", "",
             f"Generated by `{res['command']}` (`src/dpnrepro/benchmarks/gpu_input.py`) on {res['device']}, "
             f"{res['cpus']} CPUs, torch {res['torch']}. Transform: 224 px, crop_sampler big_vision, flip, "
             "`rand-n2-m15-tbigvision` (the full profile's), real JPEG photos. Cores for 3,300 img/s = B/16's rate "
             "on one H100." + (f" Load average before / after: {res['load_before']} / {res['load_after']} (per-core "
                               "rates use process CPU time; a loaded machine still slows them)." if "load_before" in res
                               else ""), ""]
    cpu = res.get("cpu")
    if cpu:
        lines += ["## Loader-worker work per image, one thread", "",
                  "| backend | what a worker does | img/s per core [95 % CI] | cores for 3,300 img/s (workers) |",
                  "|---|---|---:|---:|"]
        what = {"pil": "decode, crop, flip, RandAugment (PIL)", "fast": "decode, crop, flip, RandAugment (uint8)",
                "gpu": "read bytes, parse header, draw crop / flip / RandAugment"}
        for b, r in cpu["backends"].items():
            ci = "" if r["ci"] is None else f" [{r['ci'][0]:.0f}, {r['ci'][1]:.0f}]"
            lines.append(f"| `{b}` | {what[b]} | {r['img_per_s_per_core']:.0f}{ci} | {r['cores_for_b16']:.2f} |")
        lines.append("")
    dev = res.get("device_half")
    if dev:
        lines += [f"Device half (`DeviceAugment`, batch {dev['batch']}): {dev['img_per_s']:.0f} img/s, "
                  f"{dev['main_cpu_s_per_img'] * 1e3:.3f} ms of main-process CPU per image"
                  + (f"; decode alone {dev['decode_img_per_s']:.0f} img/s, crop + RandAugment alone "
                     f"{dev['augment_img_per_s']:.0f} img/s" if "decode_img_per_s" in dev else "") + ".", ""]
    e2e = res.get("end_to_end")
    if e2e:
        lines += ["## The trainer's batches end to end (no model)", "",
                  "| backend | workers | img/s (wall) | CPU ms per image (main + workers) | cores for 3,300 img/s |",
                  "|---|---:|---:|---:|---:|"]
        for r in e2e:
            lines.append(f"| `{r['backend']}` | {r['workers']} | {r['img_per_s']:.0f} | "
                         f"{r['cpu_s_per_img'] * 1e3:.2f} | {r['cores_for_b16']:.1f} |")
        lines.append("")
    agr = res.get("agreement")
    if agr:
        lines += [f"CUDA vs CPU on the same plans ({agr['images']} images): max |diff| {agr['max_abs_diff']:.0f}, "
                  f"mean {agr['mean_abs_diff']:.3f} grey levels, {100 * agr['frac_over_1']:.2f} % of the values "
                  "off by > 1.", ""]
        stages = [("decode", agr.get("decode")), ("crop + resize + flip", agr.get("crop_resize_flip")),
                  *((f"op {k}", v) for k, v in agr.get("ops", {}).items())]
        if any(v for _, v in stages):
            lines += ["| stage alone, same input | max |diff| | mean |diff| | % off by > 1 |", "|---|---:|---:|---:|"]
            lines += [f"| {k} | {v['max_abs_diff']:.0f} | {v['mean_abs_diff']:.4f} | {100 * v['frac_over_1']:.3f} |"
                      for k, v in stages if v]
            lines.append("")
    return "\n".join(lines)


def main(argv=None) -> None:
    import sys

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--skip-end-to-end", action="store_true")
    ap.add_argument("--skip-cpu", action="store_true", help="skip the per-core worker rates (the CPU half)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--out-md")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_input: --device cuda but no CUDA device is visible")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    random.seed(0)
    res = {"command": "python -m dpnrepro.benchmarks.gpu_input " + " ".join(sys.argv[1:] if argv is None else argv),
           "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "cpus": os.cpu_count(),
           "torch": torch.__version__, "input": INPUT, "load_before": [round(x, 2) for x in os.getloadavg()]}
    if not args.skip_cpu:
        res["cpu"] = cpu_rates(rounds=args.rounds)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    if args.device == "cuda":
        res["device_half"] = device_rate(args.device, rounds=args.rounds)
        res["agreement"] = agreement()
    if not args.skip_end_to_end:
        res["end_to_end"] = [end_to_end(b, args.device, args.workers) for b in BACKENDS]
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    md = render_markdown(res)
    if args.out_md:
        Path(args.out_md).write_text(md)
    print(md)


if __name__ == "__main__":
    main()
