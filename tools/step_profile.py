"""Where one training step spends its time: ``torch.profiler`` over a few steps of the trainer's step.

Reports per step the wall time, the time the GPU was busy (sum of kernel times), the number of kernel
launches, and the top operators by host (CPU) and by device time: a step whose wall time is far above its
kernel time is bound by the host (Python, dispatch, launches), not by the GPU.

    python tools/step_profile.py --arch Ti-16 --batch-size 256 --out profile.json
"""

from __future__ import annotations

import dpnrepro  # noqa: F401,I001  (first: its CPU pins must be in place before numpy and torch load)

import argparse
import json
import time
from pathlib import Path

import torch

from dpnrepro.cli import measurement


def profile_step(arch: str, stem: str = "dpn", *, batch_size: int = 256, img_size: int = 224, steps: int = 10,
                 compile: bool = False, cudagraphs: bool = False, top: int = 25) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from dpnrepro.benchmarks.contenders import DEFAULT_OPTIM, Contender, photo_batch
    from dpnrepro.models import build_vit
    from dpnrepro.training.losses import one_hot_targets

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    images = photo_batch(batch_size, img_size).to(dev)
    targets = one_hot_targets(torch.randint(0, 1000, (batch_size,), device=dev), 1000)
    model = build_vit(arch.replace("-", "/"), stem=stem, img_size=img_size, num_classes=1000).to(dev)
    c = Contender(model, arch, images, targets, optim_cfg=DEFAULT_OPTIM, grad_clip=1.0, compile_model=compile,
                  cudagraphs=cudagraphs)
    c.warm_up(5)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            c.step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    events = prof.key_averages()
    kernels = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    device_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / steps
    launches = sum(e.count for e in kernels) / steps

    def rows(key):
        return [{"op": e.key, "calls_per_step": e.count / steps, "ms_per_step": getattr(e, key) / 1e3 / steps}
                for e in sorted(events, key=lambda e: -getattr(e, key))[:top]]

    return {"arch": arch, "stem": stem, "batch_size": batch_size, "img_size": img_size, "compile": compile,
            "cudagraphs": cudagraphs, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
            "wall_ms_per_step": wall_ms, "kernel_ms_per_step": device_ms, "kernels_per_step": launches,
            "gpu_busy_pct": 100 * device_ms / wall_ms if wall_ms else None,
            "top_host_ops": rows("self_cpu_time_total"), "top_device_ops": rows("self_device_time_total")}


@measurement
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="Ti-16")
    ap.add_argument("--stem", default="dpn")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = {"variants": [profile_step(args.arch, args.stem, batch_size=args.batch_size, img_size=args.img_size,
                                     steps=args.steps, compile=c, cudagraphs=g)
                        for c, g in ((False, False), (True, False), (True, True))]}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for v in out["variants"]:
        print(f"{v['arch']} compile={v['compile']} cudagraphs={v['cudagraphs']}: wall {v['wall_ms_per_step']:.2f} ms, "
              f"kernels {v['kernel_ms_per_step']:.2f} ms ({v['kernels_per_step']:.0f} launches), "
              f"GPU busy {v['gpu_busy_pct']:.0f} %")


if __name__ == "__main__":
    main()
