"""One arch's compiled training step under each step lever, one after another in one process.

Each lever is a :func:`~dpnrepro.benchmarks.train_throughput.run_benchmark` of the same model, batch of real
photos and recipe (the full profile's ``table1`` optimizer and clipping for the arch; fp32 master weights,
bf16 autocast) with one setting changed (:data:`LEVERS`); its result is written as soon as it is measured, so a
run stopped by its time budget keeps what it finished. The baseline runs first and, when ``baseline_end`` is
listed, again last: the spread of the two is the noise a lever's difference must exceed.

    python tools/step_levers.py --arch B-16 --levers baseline,sdpa_cudnn --out-dir D
    python tools/step_levers.py --summarize D     # D/levers.json + D/levers.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dpnrepro.cli import measurement

LEVERS = {
    "baseline": {},
    "sdpa_cudnn": {"sdpa_backend": "cudnn"},
    "sdpa_flash": {"sdpa_backend": "flash"},
    "compiled_optimizer": {"compiled_optimizer": True},
    "channels_last": {"channels_last": True},
    "batch512": {"batch_size": 512},
    "max_autotune": {"compile_mode": "max-autotune-no-cudagraphs"},
    "baseline_end": {},
}


def run_lever(name: str, arch: str, stem: str, *, batch_size: int, rounds: int, steps_per_round: int,
              device: str, img_size: int, profile: bool, compile: bool = True) -> dict:
    from dpnrepro.benchmarks.train_throughput import run_benchmark
    from dpnrepro.config.params import load_params
    from dpnrepro.config.sweeps import sweep_config

    settings = {"batch_size": batch_size, **LEVERS[name]}
    train = sweep_config(load_params("profiles/full.yaml"), "table1", arch).train
    res = run_benchmark([arch], [stem], timm_reference=False, warmup_steps=3, rounds=rounds,
                        steps_per_round=steps_per_round, compile=compile, device=device, img_size=img_size,
                        optim_cfg=train, measure_matmul=False, progress=False,
                        profile_ops=profile and name == "baseline", **settings)
    return {"lever": name, "settings": settings, "result": res}


def summarize(out_dir: Path) -> dict:
    """Every lever's row next to the first baseline: ms/step, img/s, MFU, img/s vs the baseline."""
    rows = []
    for name in LEVERS:
        path = out_dir / f"{name}.json"
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        res = doc["result"]
        row = next(iter(next(iter(res["results"].values())).values()))
        rows.append({"lever": name, "settings": doc["settings"], "device": res["device"],
                     **{k: row.get(k) for k in ("ms_per_step", "ms_per_step_ci", "img_per_s", "mfu_pct", "mfu_pct_ci",
                                                "peak_mem_bytes", "error", "op_profile")}})
    base = next((r for r in rows if r["lever"] == "baseline" and r.get("img_per_s")), None)
    for r in rows:
        r["img_per_s_vs_baseline_pct"] = (100 * (r["img_per_s"] / base["img_per_s"] - 1)
                                          if base and r.get("img_per_s") else None)
    out = {"rows": rows}
    (out_dir / "levers.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = ["| lever | settings | ms/step [95 % CI] | img/s | MFU % | vs baseline |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if r.get("error") or r.get("ms_per_step") is None:
            lines.append(f"| {r['lever']} | {r['settings']} | {r.get('error', 'no result')} | | | |")
            continue
        ci = r["ms_per_step_ci"] or [float("nan")] * 2
        mfu = "n/a" if r["mfu_pct"] is None else f"{r['mfu_pct']:.1f}"
        vs = "" if r["img_per_s_vs_baseline_pct"] is None else f"{r['img_per_s_vs_baseline_pct']:+.1f} %"
        lines.append(f"| {r['lever']} | {r['settings']} | {r['ms_per_step']:.1f} [{ci[0]:.1f}, {ci[1]:.1f}] | "
                     f"{r['img_per_s']:,.0f} | {mfu} | {vs} |")
    (out_dir / "levers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return out


@measurement
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="B-16")
    ap.add_argument("--stem", default="dpn")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps-per-round", type=int, default=5)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--levers", default=",".join(LEVERS), help=f"comma-separated, from {', '.join(LEVERS)}")
    ap.add_argument("--profile", action="store_true", help="the baseline's kernel time by op group")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="torch.compile the step (default; --no-compile: CPU dry runs)")
    ap.add_argument("--out-dir")
    ap.add_argument("--summarize", metavar="DIR", help="only write DIR/levers.{json,md} from its results")
    args = ap.parse_args(argv)
    if args.summarize:
        summarize(Path(args.summarize))
        return
    if not args.out_dir:
        ap.error("--out-dir is required")
    names = [n.strip() for n in args.levers.split(",") if n.strip()]
    unknown = [n for n in names if n not in LEVERS]
    if unknown:
        ap.error(f"unknown levers {unknown}; choose from {', '.join(LEVERS)}")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        doc = run_lever(name, args.arch, args.stem, batch_size=args.batch_size, rounds=args.rounds,
                        steps_per_round=args.steps_per_round, device=args.device, img_size=args.img_size,
                        profile=args.profile, compile=args.compile)
        (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
        row = next(iter(doc["result"]["results"][args.arch].values()))
        print(f"{name}: {row.get('ms_per_step', float('nan')):.2f} ms/step, MFU {row.get('mfu_pct')}", flush=True)
    summarize(out)


if __name__ == "__main__":
    main()
