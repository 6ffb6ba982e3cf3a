"""Stage `bench_input`: input-pipeline img/s per CPU core, `pil` vs `fast` (decode + inception crop +
RandAugment) → metrics/input_pipeline.json + reports/input_pipeline.md.

`dvc repro bench_input` uses the settings below (this file is a dependency of the stage). With
command-line overrides the results go to other files, never to the stage's outputs:

    python stages/bench_input.py --n 20 --rounds 6
    # -> metrics/input_pipeline_cli.json, reports/input_pipeline_cli.md (or --out-json / --out-md)
"""

import os

from pydantic import BaseModel, ConfigDict, Field

from dpnrepro.benchmarks.stage_cli import add_output_options, add_settings_options, output_paths, settings_of
from dpnrepro.cli import stage, stage_parser
from dpnrepro.io import all_or_nothing, write_json_atomic, write_text_atomic


class Settings(BaseModel):
    """The stage's settings: 20 interleaved rounds of 100 images per backend (~25 s on one idle core)."""

    model_config = ConfigDict(extra="forbid")
    n: int = Field(100, ge=1, description="images per backend per round")
    rounds: int = Field(20, ge=1, description="interleaved rounds, >= 6 for a 95 % CI")
    seed: int = Field(0, ge=0, description="per-round order and per-image draws")
    size: int = Field(224, ge=1, description="output image size")


STAGE_OUTS = ("metrics/input_pipeline.json", "reports/input_pipeline.md")
CLI_OUTS = ("metrics/input_pipeline_cli.json", "reports/input_pipeline_cli.md")


@stage
def main() -> None:
    ap = stage_parser(__doc__)
    add_settings_options(ap, Settings, "bench_input")
    add_output_options(ap, STAGE_OUTS, CLI_OUTS)
    args = ap.parse_args()
    settings, overrides = settings_of(args, Settings(), "bench_input")
    out_json, out_md = output_paths(args, bool(overrides), "bench_input", STAGE_OUTS, CLI_OUTS,
                                    "this file's settings")

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # per-core numbers: one thread everywhere
    from dpnrepro.benchmarks.input_pipeline import render_markdown, run_input_benchmark

    res = run_input_benchmark(**settings.model_dump(), progress=not args.no_progress)
    with all_or_nothing():  # the new files together, or the previous ones stay
        write_json_atomic(out_json, res)
        write_text_atomic(out_md, render_markdown(res))
        if not overrides:  # the stage's run: its headline is a DVC metric (benchmarks/dvc.yaml)
            from dpnrepro.benchmarks.headline import input_headline
            from dpnrepro.reports.headline import write_headline

            write_headline("input_pipeline", input_headline(res))
    b, sp = res["backends"], res["speedups"]
    print(f"pil {b['pil']['img_per_s_per_core']:.1f} img/s/core, fast {b['fast']['img_per_s_per_core']:.1f} "
          f"({sp['fast_over_pil']['median']:.2f}x, {sp['fast_over_pil']['resolved']}), fast on pre-decoded uint8 "
          f"{b['fast_pixels']['img_per_s_per_core']:.1f} ({sp['fast_pixels_over_pil']['median']:.2f}x); "
          f"wrote {out_json}, {out_md}")


if __name__ == "__main__":
    main()
