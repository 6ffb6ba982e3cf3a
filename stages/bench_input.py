"""Stage `bench_input`: input-pipeline img/s per CPU core, `pil` vs `fast` (decode + inception crop +
RandAugment) → metrics/input_pipeline.json + reports/input_pipeline.md.

`dvc repro bench_input` uses the settings below (this file is a dependency of the stage). With
command-line overrides the results go to other files, never to the stage's outputs:

    python stages/bench_input.py --n 20 --rounds 6
    # -> metrics/input_pipeline_cli.json, reports/input_pipeline_cli.md (or --out-json / --out-md)
"""

import argparse
import os

from dpnrepro.cli import stage
from dpnrepro.errors import ParamsError
from dpnrepro.io import write_json_atomic, write_text_atomic

# The stage's settings: 20 interleaved rounds of 100 images per backend (~25 s on one idle core).
SETTINGS = {"n": 100, "rounds": 20, "seed": 0, "size": 224}
STAGE_OUTS = ("metrics/input_pipeline.json", "reports/input_pipeline.md")
CLI_OUTS = ("metrics/input_pipeline_cli.json", "reports/input_pipeline_cli.md")


@stage
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, help=f"images per backend per round (default {SETTINGS['n']})")
    ap.add_argument("--rounds", type=int, help=f"interleaved rounds, >= 6 for a 95 %% CI (default {SETTINGS['rounds']})")
    ap.add_argument("--seed", type=int, help=f"per-round order and per-image draws (default {SETTINGS['seed']})")
    ap.add_argument("--size", type=int, help=f"output image size (default {SETTINGS['size']})")
    ap.add_argument("--out-json", help=f"default: {STAGE_OUTS[0]}, or {CLI_OUTS[0]} with overrides")
    ap.add_argument("--out-md", help=f"default: {STAGE_OUTS[1]}, or {CLI_OUTS[1]} with overrides")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()

    overrides = {k: getattr(args, k) for k in SETTINGS if getattr(args, k) is not None}
    bad = [f"--{k} {v}" for k, v in overrides.items() if v < (0 if k == "seed" else 1)]
    if bad:
        raise ParamsError(f"invalid override: {', '.join(bad)} (n, rounds and size must be >= 1, seed >= 0)")
    defaults = CLI_OUTS if overrides else STAGE_OUTS
    out_json, out_md = args.out_json or defaults[0], args.out_md or defaults[1]
    if overrides and {out_json, out_md} & set(STAGE_OUTS):
        raise ParamsError(f"{', '.join(STAGE_OUTS)} are the `bench_input` stage's outputs and follow this file's "
                          "settings alone; write results of command-line overrides elsewhere (--out-json/--out-md)")

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # per-core numbers: one thread everywhere
    from dpnrepro.benchmarks.input_pipeline import render_markdown, run_input_benchmark

    res = run_input_benchmark(**{**SETTINGS, **overrides}, progress=not args.no_progress)
    write_json_atomic(out_json, res)
    write_text_atomic(out_md, render_markdown(res))
    b, sp = res["backends"], res["speedups"]
    print(f"pil {b['pil']['img_per_s_per_core']:.1f} img/s/core, fast {b['fast']['img_per_s_per_core']:.1f} "
          f"({sp['fast_over_pil']['median']:.2f}x, {sp['fast_over_pil']['resolved']}), fast on pre-decoded uint8 "
          f"{b['fast_pixels']['img_per_s_per_core']:.1f} ({sp['fast_pixels_over_pil']['median']:.2f}x); "
          f"wrote {out_json}, {out_md}")


if __name__ == "__main__":
    main()
