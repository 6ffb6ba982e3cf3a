"""GPU-hours of every report's training runs at the full profile (``profiles/full.yaml``): the workloads
(groups of identical runs) and what each costs on one GPU.

Training steps only; evaluation, data loading and checkpoints are not counted. Per workload: training
images ÷ the measured images/s per GPU of the same arch and resolution
(``benchmarks/measured/gpu_throughput_summary.json``; the same stem if measured, else the slowest
measured stem; the measurement with the profile's ``runtime.compile`` setting if there is one). Where no
ViT training step was measured at that arch and resolution (and for LiT, whose step is not one),
training FLOPs (:mod:`dpnrepro.benchmarks.flops`, 3 × forward) ÷ (the device's bf16 peak × the MFU
measured for the nearest arch: the same arch at the nearest resolution, else the measurement closest in
FLOPs per image). Without any measurement: FLOPs at an assumed 40 % MFU of an H100 SXM.

The FLOPs of the sweeps come from :mod:`dpnrepro.benchmarks.flops`, of Tables 3 and 7 from
:mod:`dpnrepro.cost.transfer`, of Table 4 from :mod:`dpnrepro.cost.lit`, of Table 5 from the mmseg config.
reports/README.md (:mod:`dpnrepro.reports.index`) renders them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from dpnrepro.config.lit import LitParams
from dpnrepro.config.segmentation import SegmentationParams

FULL_PROFILE = Path("profiles/full.yaml")
THROUGHPUT = Path("benchmarks/measured/gpu_throughput_summary.json")
SEG_CONFIGS = "configs/segmentation"  # the mmseg config files (Table 5's workloads read the profile's one)
INPUTS = (FULL_PROFILE.as_posix(), SEG_CONFIGS, THROUGHPUT.as_posix())  # every file the estimates read

ASSUMED_MFU = 0.40
ASSUMED_DEVICE = "H100"  # resolved by benchmarks.flops.peak_bf16_tflops: H100 SXM


def assumed_device() -> tuple[float, str]:
    """(dense bf16 peak TFLOP/s, device name) of the device assumed without a measurement."""
    from dpnrepro.benchmarks.flops import peak_bf16_tflops

    return peak_bf16_tflops(ASSUMED_DEVICE)


@dataclass(frozen=True)
class Workload:
    """Identical training runs of one report at the full profile."""

    label: str                # what they are ("table1", "VTAB-1k fine-tunes", ...)
    arch: str                 # "B/16"
    img_size: int
    stem: str | None          # None: several stems pooled
    runs: int
    images: int               # training images (examples) over all these runs
    flops_per_image: float    # training FLOPs per image
    vit_step: bool = True     # a ViT training step: measured images/s apply


@dataclass(frozen=True)
class Throughput:
    """benchmarks/measured/gpu_throughput_summary.json: one GPU's measured training steps."""

    device: str
    torch: str | None
    measured: str | None
    git_rev: str | None
    runs: tuple[dict, ...]
    peak_tflops: float | None     # dense bf16 peak of the device (benchmarks.flops), None if unknown


def load_throughput(path: Path) -> Throughput | None:
    """The measurement, or None when the file is missing or holds no device or no runs."""
    from dpnrepro.benchmarks.flops import peak_bf16_tflops

    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    runs = tuple(dict(r, arch=r["arch"].replace("-", "/")) for r in doc.get("runs") or ())
    if not doc.get("device") or not runs:
        return None
    peak = peak_bf16_tflops(doc["device"])
    return Throughput(doc["device"], doc.get("torch"), doc.get("measured"), doc.get("git_rev"), runs,
                      peak[0] if peak else None)


def _preferred(candidates: list[dict], stem: str | None, compile_: bool) -> dict:
    """The same stem, then the same compile setting, then the slowest."""
    return min(candidates, key=lambda r: (r["stem"] != stem, bool(r.get("compile")) != compile_, r["images_per_s"]))


def _run_label(r: dict) -> str:
    return f"{r['arch']} {r['stem']} {r['img_size']} px{', compiled' if r.get('compile') else ''}"


def estimate(w: Workload, tp: Throughput | None, *, compile_: bool = False) -> tuple[float, str, str]:
    """(GPU-hours, method, source) of a workload; method is ``measured``, ``mfu`` or ``assumed``."""
    from dpnrepro.benchmarks.flops import train_flops_per_image

    if tp is not None and w.vit_step:
        same = [r for r in tp.runs if r["arch"] == w.arch and r["img_size"] == w.img_size]
        if same:
            r = _preferred(same, w.stem, compile_)
            return w.images / r["images_per_s"] / 3600, "measured", _run_label(r)
    if tp is not None and tp.peak_tflops:
        same_arch = [r for r in tp.runs if r["arch"] == w.arch]

        def distance(r: dict) -> float:  # the same arch at the nearest resolution, else the nearest in FLOPs
            if same_arch:
                return abs(r["img_size"] - w.img_size)
            return abs(math.log(train_flops_per_image(r["arch"], img_size=r["img_size"]) / w.flops_per_image))

        pool = same_arch or list(tp.runs)
        nearest = min(map(distance, pool))
        r = min((r for r in pool if distance(r) == nearest), key=lambda r: r["mfu_pct"])  # its slowest stem
        flops_per_s = tp.peak_tflops * 1e12 * r["mfu_pct"] / 100
        return w.images * w.flops_per_image / flops_per_s / 3600, "mfu", f"{r['mfu_pct']:.1f} % MFU of {_run_label(r)}"
    peak, _ = assumed_device()
    return (w.images * w.flops_per_image / (peak * 1e12 * ASSUMED_MFU) / 3600, "assumed",
            f"{ASSUMED_MFU * 100:.0f} % MFU assumed")


def full_profile_workloads(root: Path) -> tuple[dict[str, list[Workload]], bool]:
    """({report: [Workload]}, runtime.compile) of the full profile (profiles/full.yaml)."""
    from dpnrepro.benchmarks.flops import train_flops_per_image
    from dpnrepro.config.core import arch_name
    from dpnrepro.config.params import load_params
    from dpnrepro.config.sweeps import SWEEPS, sweep_config

    params = load_params(root / FULL_PROFILE)
    out: dict[str, list[Workload]] = {}
    for sweep, definition in SWEEPS.items():
        sw = params.sweeps().get(sweep)
        for arch in sw.archs if sw else ():
            cfg = sweep_config(params, sweep, arch, next(iter(sw.variants), ""))
            flops = train_flops_per_image(arch_name(arch), img_size=cfg.input.image_size,
                                          num_classes=cfg.data.num_classes)
            runs = len(sw.seeds) * max(1, len(sw.variants))
            out.setdefault(definition.report, []).extend(
                Workload(sweep, arch_name(arch), cfg.input.image_size, stem, runs,
                         runs * cfg.train.steps * cfg.train.batch_size, flops) for stem in sw.stems)
    out["table3"] = _transfer_workloads(params, "table3")
    out["table7"] = _transfer_workloads(params, "table7")
    out["table4"] = _lit_workloads(params)
    out["table5"] = _segmentation_workloads(params, root)
    return {k: v for k, v in out.items() if v}, params.runtime.compile


def _transfer_workloads(params, report: str) -> list[Workload]:
    from dpnrepro.config.core import arch_name
    from dpnrepro.config.transfer import transfer_config, vtab_config
    from dpnrepro.cost.transfer import scratch_cost, vtab_cost

    if report == "table3" and params.vtab:
        label, cost, img = "VTAB-1k fine-tunes of Table 1's runs", vtab_cost(params), \
            vtab_config(params, params.vtab.lrs[0])[0].image_size
    elif report == "table7" and params.sun397_scratch:
        label, cost, img = "Sun397 search from scratch", scratch_cost(params), \
            transfer_config(params, params.sun397_scratch.recipe)[0].image_size
    else:
        return []
    return [Workload(label, arch_name(arch), img, None, c["runs"], c["train_images"],
                     c["train_flops"] / c["train_images"]) for arch, c in cost.items()]


def _lit_workloads(params) -> list[Workload]:
    from dpnrepro.config.core import arch_name
    from dpnrepro.config.sweeps import sweep_config
    from dpnrepro.cost.lit import lit_flops_per_example

    lit: LitParams | None = params.lit
    if lit is None:
        return []
    out, label = [], f"LiT text towers on the locked towers of {', '.join(lit.towers.sweeps)}"
    for sweep in lit.towers.sweeps:
        for arch in lit.towers.archs:
            img = sweep_config(params, sweep, arch).input.image_size
            flops = lit_flops_per_example(arch, width=lit.text[arch].width, layers=lit.text[arch].layers,
                                          context_length=lit.context_length, batch_size=lit.train.batch_size,
                                          img_size=img)["total"]
            runs = len(lit.seeds)
            out += [Workload(label, arch_name(arch), img, stem, runs,
                             runs * lit.train.steps * lit.train.batch_size, flops, vit_step=False)
                    for stem in lit.towers.stems]
    return out


def _segmentation_workloads(params, root: Path) -> list[Workload]:
    """Table 5: the mmseg config's iterations × batch × crops per (stem, fraction, seed)."""
    from mmengine.config import Config

    from dpnrepro.benchmarks.flops import TRAIN_FLOPS_MULTIPLIER, vit_forward_flops
    from dpnrepro.config.core import arch_name

    sp: SegmentationParams | None = params.segmentation
    if sp is None:
        return []
    cfg = Config.fromfile(str(root / sp.config), import_custom_modules=False)
    cfg.merge_from_dict(dict(sp.options))
    crop, head = cfg.crop_size[0], cfg.model.decode_head
    backbone = vit_forward_flops(arch_name(sp.arch), img_size=crop, num_classes=0)
    flops = TRAIN_FLOPS_MULTIPLIER * (backbone.total + 2 * backbone.patches * head.in_channels * head.num_classes)
    runs = len(sp.fractions) * len(sp.seeds)
    images = runs * cfg.train_cfg.max_iters * cfg.train_dataloader.batch_size
    return [Workload("ADE20K fine-tunes of Table 1's runs", arch_name(sp.arch), crop, stem, runs, images, flops)
            for stem in sp.stems]
