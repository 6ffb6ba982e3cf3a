"""The trainer's own loop on real JPEG input, next to the same step on a fixed on-device batch.

``train_classifier`` runs a full-profile recipe (``profiles/full.yaml``'s sweep config for the arch: its
input pipeline, optimizer, clipping, mixup, dropout) on a ``datasets`` split of real JPEG photographs
(:func:`dpnrepro.benchmarks.input_pipeline.load_photos`: scikit-image's and matplotlib's photos, longer side
500 px, quality 90, cycled). Its step time is the wall time between two optimizer steps after the warm-up
(CUDA synchronised at both ends; logging and checkpoints fall outside the window), so it includes
everything the loop does per step: waiting for the loader, the copy to the device, mixup, the step.
The same model and recipe is then timed on a fixed uint8 batch already on the device
(:mod:`dpnrepro.benchmarks.train_throughput`, the same :mod:`dpnrepro.training.step` code): the ratio of
the two is how much of the step's speed the input pipeline keeps.

    python tools/trainer_loop.py --arch B-16 --stem dpn --batch-size 256 --compile --out X.json
"""

from __future__ import annotations

import dpnrepro  # noqa: F401,I001  (first: its CPU pins must be in place before numpy and torch load)

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from dpnrepro.cli import measurement
from dpnrepro.errors import UserError


def measure_trainer_loop(arch: str, stem: str, *, batch_size: int, steps: int, warmup: int, workers: int,
                         compile: bool, cudagraphs: bool, profile: str = "profiles/full.yaml",
                         sweep: str = "table1", backend: str | None = None, device: str = "cuda") -> dict:
    """ms/step and img/s of ``train_classifier`` (the recipe of ``sweep``/``arch`` in ``profile``)."""
    from dpnrepro.benchmarks.input_pipeline import photo_split
    from dpnrepro.config.runtime import RuntimeParams
    from dpnrepro.config.sweeps import sweep_config
    from dpnrepro.config.params import load_params
    from dpnrepro.training.run import model_spec
    from dpnrepro.training.trainer import train_classifier

    params = load_params(profile)
    cfg = sweep_config(params, sweep, arch)
    inp = cfg.input.model_copy(update={"backend": backend}) if backend else cfg.input
    train = cfg.train.model_copy(update={"batch_size": batch_size, "steps": warmup + steps + 1,
                                         "warmup_steps": 1, "device": device, "deterministic": False})
    runtime = RuntimeParams(workers=workers, compile=compile, cudagraphs=cudagraphs, log_every=10**9,
                            ckpt_every=10**9)
    spec = model_spec(cfg, arch, stem)
    ds = photo_split(max(4 * batch_size, 1024), spec.num_classes)
    marks: dict[int, float] = {}

    def on_step(step: int) -> None:  # the window: end of step `warmup` .. end of step `warmup + steps`
        if step in (warmup, warmup + steps):
            if torch.cuda.is_available() and device != "cpu":
                torch.cuda.synchronize()
            marks[step] = time.perf_counter()

    with tempfile.TemporaryDirectory() as ckpt:
        t0 = time.perf_counter()
        train_classifier(spec, ds, inp, train, seed=0, ckpt_dir=Path(ckpt), runtime=runtime, progress=False,
                         on_step=on_step)
        total = time.perf_counter() - t0
    ms = (marks[warmup + steps] - marks[warmup]) * 1e3 / steps
    return {"arch": arch, "stem": stem, "profile": profile, "sweep": sweep, "batch_size": batch_size,
            "steps_timed": steps, "warmup_steps": warmup, "workers": workers, "compile": compile,
            "cudagraphs": cudagraphs, "input": inp.model_dump(), "optimizer": train.optimizer,
            "grad_clip": train.grad_clip, "ms_per_step": ms, "img_per_s": batch_size / (ms / 1e3),
            "wall_s_with_warmup": total}


@measurement
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", required=True)
    ap.add_argument("--stem", default="dpn")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--cudagraphs", action="store_true")
    ap.add_argument("--backend", choices=["pil", "fast"], help="input backend (default: the profile's)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--synthetic-rounds", type=int, default=8, help="rounds of the fixed-batch step (0: skip)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("trainer_loop: --device cuda but no CUDA device is visible")
    if args.warmup < 1 or args.steps < 1:
        raise UserError("trainer_loop: --warmup and --steps must be >= 1")
    loop = measure_trainer_loop(args.arch, args.stem, batch_size=args.batch_size, steps=args.steps,
                                warmup=args.warmup, workers=args.workers, compile=args.compile,
                                cudagraphs=args.cudagraphs, backend=args.backend, device=args.device)
    out = {"trainer_loop": loop, "torch": torch.__version__, "cpus": os.cpu_count(),
           "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    if args.synthetic_rounds:
        from dpnrepro.benchmarks.train_throughput import run_benchmark
        from dpnrepro.config.sweeps import sweep_config
        from dpnrepro.config.params import load_params

        train = sweep_config(load_params(loop["profile"]), loop["sweep"], args.arch).train
        syn = run_benchmark([args.arch], [args.stem], timm_reference=False, batch_size=args.batch_size,
                            warmup_steps=3, rounds=args.synthetic_rounds, steps_per_round=5, compile=args.compile,
                            cudagraphs=args.cudagraphs, device=args.device, optim_cfg=train, progress=False)
        row = syn["results"][args.arch][args.stem]
        out["synthetic"] = {k: row.get(k) for k in ("ms_per_step", "ms_per_step_ci", "img_per_s", "mfu_pct",
                                                    "peak_mem_bytes")}
        out["synthetic"]["peak_tflops"] = syn["peak_tflops"]
        out["loop_vs_synthetic_pct"] = 100 * row["ms_per_step"] / loop["ms_per_step"]
        if syn["peak_tflops"]:
            out["trainer_loop"]["mfu_pct"] = row["mfu_pct"] * row["ms_per_step"] / loop["ms_per_step"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "trainer_loop"} | {
        "loop_ms": loop["ms_per_step"], "loop_img_s": loop["img_per_s"]}, indent=1))


if __name__ == "__main__":
    main()
