"""Peak host memory of evaluation on a split and on the same kind of split ``k`` times larger.

What one measurement runs, in a fresh process (so its peak RSS is evaluation's, not the caller's): the
smoke profile's evaluation of one run, as the ``evaluate-*`` stages do it — top-1 on ``minival`` and
``val`` (:func:`dpnrepro.evaluation.classification.evaluate_run`) and big_vision's few-shot probe on
``train`` → ``val`` (:func:`dpnrepro.evaluation.fewshot.evaluate_fewshot_run`, the 21k sweeps' shots,
draws, pool and resize) — on a prepared-like data directory of real Fashion-MNIST images (Debian's idx
files, PNG-encoded as the smoke ``imagefolder`` export stores them). Scale 1 has the smoke split sizes
(train 4950, minival 50, val 1000); scale ``k`` has ``k`` times as many images of each split (Fashion-MNIST
holds 60,000 + 10,000: up to ``k = 10``). The model is the smoke arch (Mu/7, DPN stem) at ``image_size``
with seeded random weights: memory does not depend on what the weights are.

The peak is the process's high-water RSS (``VmHWM``, :func:`peak_rss_kb`) at the end, with one thread
and no loader workers; the RSS after imports and model load (``baseline``) is recorded next to it, so the
part evaluation adds is visible, and so is evaluation's wall time. Next to it, the peak of the process's
anonymous memory (``RssAnon``; :class:`AnonPeak` samples it every few milliseconds, so a spike shorter
than that is missed) and the most anonymous memory held *between* batches (``held_anon_kb``: read after
each batch's heap trim, when the batch itself is gone). Within a batch the model's activations come and
go (~200 MiB at 56 px, batch 500) and the heap's fragmentation lifts each batch's peak a little more than
the last (tens of MiB over 20 batches, nothing kept); between batches only what evaluation keeps is left
(logits, features, a kept split), so that level grows with the split only if something of it is kept.
The child opts out of transparent huge pages (``prctl``): where the kernel's policy is ``always``,
khugepaged turns partly used 2 MiB regions resident at its own pace, which adds tens of MiB of noise to a
longer run's peak. Allocator modes (:data:`ALLOCATORS`):
``trim`` is the code as it runs (:class:`dpnrepro.allocator.HeapTrimmed`), ``none`` the same without the
trim (glibc's own policy), ``fixed`` without the trim but with glibc's mmap threshold fixed at 128 KiB
(``mallopt``, as ``MALLOC_MMAP_THRESHOLD_`` does), the alternative that was measured and not chosen. The
peak counts the memory-mapped Arrow pages evaluation touches too (file-backed, reclaimable: a larger
split's are more of them).

    python -m dpnrepro.benchmarks.eval_memory --image-size 28 56 --scales 1 10 --out reports/eval_memory.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dpnrepro.errors import UserError

FMNIST = Path("/usr/share/datasets/fashion-mnist")
SMOKE_SIZES = {"train": 4950, "minival": 50, "val": 1000}
SOURCE_SPLIT = {"train": "train", "minival": "train", "val": "test"}  # minival: the train images after train's
FEWSHOT_SWEEP = "i21k_93k"
ALLOCATORS = ("trim", "none", "fixed")
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value, kept fixed in mode `fixed`
M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)


def build_prepared(out: Path, scale: int, source: Path = FMNIST) -> dict:
    """A prepared-like directory (``datasets`` splits of PNG images + labels) at ``scale`` x the smoke sizes."""
    import io

    import datasets
    from PIL import Image

    from dpnrepro.data.sources import load_idx

    sizes = {k: v * scale for k, v in SMOKE_SIZES.items()}
    arrays = {s: load_idx(source, s) for s in ("train", "test")}
    if sizes["train"] + sizes["minival"] > len(arrays["train"][0]) or sizes["val"] > len(arrays["test"][0]):
        raise UserError(f"scale {scale} needs more images than {source} holds (60,000 train, 10,000 test)")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    start = {"train": 0, "minival": sizes["train"], "val": 0}
    for split, n in sizes.items():
        images, labels = arrays[SOURCE_SPLIT[split]]
        rows = range(start[split], start[split] + n)

        def png(i):
            buf = io.BytesIO()
            Image.fromarray(images[i], mode="L").save(buf, format="PNG")
            return {"bytes": buf.getvalue(), "path": None}

        ds = datasets.Dataset.from_dict({"image": [png(i) for i in rows], "label": [int(labels[i]) for i in rows]},
                                        features=features)
        ds.save_to_disk(str(out / split))
    return sizes


def build_run(out: Path, image_size: int, profile: str = "params.yaml") -> Path:
    """A run directory (spec + safetensors) of the smoke arch at ``image_size``, seeded random weights."""
    from dataclasses import replace

    import torch

    from dpnrepro.artifacts import write_run
    from dpnrepro.config.params import load_params
    from dpnrepro.config.sweeps import get_sweep, sweep_config
    from dpnrepro.training.run import model_spec

    params = load_params(profile)
    arch = get_sweep(params, "table1").archs[0]
    spec = replace(model_spec(sweep_config(params, "table1", arch), arch, "dpn"), img_size=image_size)
    torch.manual_seed(0)
    model = spec.build()
    out.mkdir(parents=True, exist_ok=True)
    summary = {"arch": arch, "stem": "dpn", "seed": 0, "hardware": "cpu",
               "params_m": sum(p.numel() for p in model.parameters()) / 1e6}
    write_run(out, model, spec, {}, summary)
    return out


def peak_rss_kb() -> int:
    """This process's peak RSS (KiB) since its ``exec``: ``VmHWM`` of ``/proc/self/status``. Not
    ``ru_maxrss``: Linux carries the pre-``exec`` high-water mark over, and a child forked from a larger
    parent (a test process holding the splits it built) would report that parent's RSS."""
    return status_kb("VmHWM")


def status_kb(field: str) -> int:
    """A KiB field of this process's ``/proc/self/status`` (``VmHWM``, ``RssAnon``, ...)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def disable_transparent_huge_pages() -> bool:
    """Opt this process (and its children) out of transparent huge pages (``PR_SET_THP_DISABLE``), so its
    RSS is the pages it touched whatever the machine's THP policy; False where ``prctl`` refuses."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(41, 1, 0, 0, 0) == 0  # PR_SET_THP_DISABLE
    except (OSError, AttributeError):
        return False


class AnonPeak:
    """The highest ``RssAnon`` (KiB) of this process seen while the ``with`` block runs (``kb``; ``start``:
    the level on entry), sampled by a daemon thread every ``interval`` seconds (Linux has no high-water
    mark of anonymous memory alone)."""

    def __init__(self, interval: float = 0.005):
        self.interval, self.kb, self.start = interval, 0, 0

    def _sample(self):
        while not self._stop.wait(self.interval):
            self.kb = max(self.kb, status_kb("RssAnon"))

    def __enter__(self):
        import threading

        self.start = self.kb = status_kb("RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.kb = max(self.kb, status_kb("RssAnon"))


def _rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def evaluate_once(prepared: Path, run: Path, image_size: int, profile: str = "params.yaml",
                  allocator: str = "trim") -> dict:
    """Run the evaluation path in this process; its peak and baseline RSS (KiB), wall time and results.
    ``allocator``: one of :data:`ALLOCATORS` (:func:`measure`)."""
    import ctypes
    import time

    import torch

    from dpnrepro import allocator as heap
    from dpnrepro.artifacts import load_run_model
    from dpnrepro.config.sweeps import get_sweep, sweep_config
    from dpnrepro.config.params import load_params
    from dpnrepro.evaluation.classification import evaluate_run
    from dpnrepro.evaluation.fewshot import evaluate_fewshot_run

    torch.set_num_threads(1)
    heap.ENABLED = allocator == "trim"
    if allocator == "fixed" and ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed: not glibc?")
    params = load_params(profile)
    arch = get_sweep(params, "table1").archs[0]
    cfg = sweep_config(params, "table1", arch)
    input_cfg = {**cfg.input.model_dump(), "image_size": image_size, "workers": 0}
    fs = get_sweep(params, FEWSHOT_SWEEP).fewshot
    resize = -(-fs.resize * image_size // cfg.input.image_size)  # the smoke ratio, 32 / 28
    load_run_model(run)  # imports and first allocations before the baseline
    baseline = _rss_kb()
    kw = dict(batch_size=cfg.runtime.eval_batch_size, device="cpu", progress=False)
    held, trim = [], heap.release_free_heap

    def trim_and_record():  # HeapTrimmed calls it after each batch, once the consumer let go of it
        released = trim()
        held.append(status_kb("RssAnon"))
        return released

    heap.release_free_heap = trim_and_record
    start = time.perf_counter()
    try:
        with AnonPeak() as anon:
            top1 = evaluate_run(run, prepared, input_cfg, **kw)
            few = evaluate_fewshot_run(run, prepared, input_cfg, shots=fs.shots, draws=fs.draws,
                                       l2_reg=fs.l2_reg, train_split=fs.train_split, test_split=fs.test_split,
                                       resize=resize, pool_size=fs.pool_size, **kw)
    finally:
        heap.release_free_heap = trim
    seconds = time.perf_counter() - start
    return {"held_anon_kb": max(held), "batches": len(held), "peak_rss_kb": peak_rss_kb(),
            "baseline_rss_kb": baseline, "peak_anon_kb": anon.kb, "baseline_anon_kb": anon.start,
            "eval_seconds": round(seconds, 2),
            "val_examples": top1["val_examples"], "minival_examples": top1["minival_examples"],
            "fewshot_test_examples": few["fewshot_test_examples"], "fewshot_train_pool": few["fewshot_train_pool"],
            "batch_size": kw["batch_size"]}


def measure(image_size: int, scales=(1, 10), *, allocator: str = "trim", repeats: int = 1,
            root: Path | None = None, profile: str = "params.yaml", enough_kb: dict | None = None,
            by: str = "peak_rss_kb") -> dict:
    """``{scale: measurement}``: ``repeats`` fresh single-threaded processes per scale, on one shared run;
    the measurement is the run with the lowest ``by`` (``peak_rss_kb``, ``peak_anon_kb`` or ``held_anon_kb``;
    every run's values of the three in ``<name>_runs``): a transient spike in one run does not count, a
    split kept in memory, which every run holds, still does.

    ``enough_kb``: ``{scale: KiB}``, a bound the caller checks the lowest peak ``by`` against; a scale runs no
    more processes once one peaked within its bound (a further one cannot change that check's outcome).

    ``allocator``: ``trim`` (the code: the heap's free pages released after each batch), ``none`` (glibc's
    dynamic mmap threshold alone, under which RSS creeps with the number of batches although nothing is
    kept: :mod:`dpnrepro.allocator`) or ``fixed`` (no trim, a fixed 128 KiB mmap threshold)."""
    if allocator not in ALLOCATORS:
        raise UserError(f"allocator {allocator!r}: one of {', '.join(ALLOCATORS)}")
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        tmp = Path(tmp)
        run = build_run(tmp / "run", image_size, profile)
        out = {}
        for scale in scales:
            sizes = build_prepared(tmp / f"x{scale}", scale)
            env = dict(os.environ, DPNREPRO_CPU_THREADS="1", OMP_NUM_THREADS="1", HF_DATASETS_OFFLINE="1",
                       HF_HUB_OFFLINE="1")
            env.pop("MALLOC_MMAP_THRESHOLD_", None)
            runs = []
            bound = (enough_kb or {}).get(scale)
            while len(runs) < repeats and not (bound is not None and runs and runs[-1][by] <= bound):
                proc = subprocess.run([sys.executable, "-m", "dpnrepro.benchmarks.eval_memory", "--child",
                                       str(tmp / f"x{scale}"), str(run), str(image_size), profile, allocator],
                                      capture_output=True, text=True, env=env)
                if proc.returncode:
                    raise RuntimeError(f"evaluation at scale {scale} failed:\n{proc.stderr[-3000:]}")
                runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            best = min(runs, key=lambda m: m[by])
            out[scale] = {"split_sizes": sizes, "allocator": allocator, **best,
                          **{f"{k}_runs": [m.get(k) for m in runs]
                             for k in ("peak_rss_kb", "peak_anon_kb", "held_anon_kb")}}
        return out


def render(results: list[dict], machine: str) -> str:
    """The markdown report of :func:`measure` results (``[{"image_size", "code", "scales": measure(...)}]``)."""
    lines = ["# Evaluation memory", "",
             "Peak RSS of the smoke profile's evaluation of one run (top-1 on minival and val, 25-shot probe on "
             "train → val, the few-shot pool fixed at the profile's 650) on real Fashion-MNIST splits at the smoke "
             "sizes (scale 1) and 10× larger, each in a fresh single-threaded process without loader workers "
             "(`python -m dpnrepro.benchmarks.eval_memory`; how it measures: the module's docstring). Baseline = RSS "
             "after imports and model load. Allocator: `trim` is the code as it runs (glibc's free heap pages "
             "released after each batch, `dpnrepro/allocator.py`), `none` the same without the trim, `fixed` "
             "without the trim and with glibc's mmap threshold fixed at 128 KiB (the alternative not chosen). "
             f"Machine: {machine}. Each row: the lowest peak of its runs (all listed), and that run's evaluation "
             "wall time.", "",
             "| code | image size | allocator | scale | val / minival / train images | peak RSS (MiB), lowest | "
             "baseline (MiB) | added by evaluation (MiB) | peak / scale-1 peak | anonymous: peak, held between batches (MiB) | "
             "evaluation (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        by_scale = r["scales"]
        ref = by_scale[min(by_scale)]["peak_rss_kb"]
        for scale, m in by_scale.items():
            s = m["split_sizes"]
            lines.append(f"| {r['code']} | {r['image_size']} px | {m['allocator']} | {scale}× | {s['val']:,} / {s['minival']:,} / "
                         f"{s['train']:,} | {m['peak_rss_kb'] / 1024:.0f} ({', '.join(f'{v / 1024:.0f}' for v in m['peak_rss_kb_runs'])}) | "
                         f"{m['baseline_rss_kb'] / 1024:.0f} | "
                         f"{(m['peak_rss_kb'] - m['baseline_rss_kb']) / 1024:.0f} | {m['peak_rss_kb'] / ref:.3f} | "
                         f"{m['peak_anon_kb'] / 1024:.0f}, {m['held_anon_kb'] / 1024:.0f} | "
                         f"{m['eval_seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=5, metavar=("PREPARED", "RUN", "IMAGE_SIZE", "PROFILE", "ALLOCATOR"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--image-size", type=int, nargs="+", default=[28])
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--machine", default="2-core AMD EPYC VM, shared with other work")
    ap.add_argument("--allocator", nargs="+", choices=ALLOCATORS, default=list(ALLOCATORS))
    ap.add_argument("--repeats", type=int, default=2, help="processes per scale (the lowest peak counts)")
    ap.add_argument("--code", default="streamed", help="label of the code measured (the report's first column)")
    ap.add_argument("--out", type=Path, help="markdown report")
    ap.add_argument("--json", type=Path, help="raw measurements")
    args = ap.parse_args(argv)
    if args.child:
        prepared, run, size, profile, allocator = args.child
        thp_off = disable_transparent_huge_pages()  # before the imports allocate
        print(json.dumps({**evaluate_once(Path(prepared), Path(run), int(size), profile, allocator),
                          "thp_disabled": thp_off}))
        return
    results = [{"image_size": size, "code": args.code,
                "scales": measure(size, args.scales, allocator=a, repeats=args.repeats)}
               for size in args.image_size for a in args.allocator]
    text = render(results, args.machine)
    print(text)
    if args.json:
        from dpnrepro.io import write_json_atomic

        write_json_atomic(args.json, {"machine": args.machine, "results": results})
    if args.out:
        from dpnrepro.io import write_text_atomic

        write_text_atomic(args.out, text)


if __name__ == "__main__":
    main()
