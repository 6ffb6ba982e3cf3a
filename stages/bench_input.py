"""Stage `bench_input`: input-pipeline img/s per CPU core, `pil` vs `fast` (decode + inception crop +
RandAugment) → metrics/input_pipeline.json + reports/input_pipeline.md."""

import os

from dpnrepro.cli import stage
from dpnrepro.io import write_json_atomic, write_text_atomic


@stage
def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # per-core numbers: one thread everywhere
    from dpnrepro.benchmarks.input_pipeline import render_markdown, run_input_benchmark

    res = run_input_benchmark(n=200, rounds=5, seed=0, size=224)
    write_json_atomic("metrics/input_pipeline.json", res)
    write_text_atomic("reports/input_pipeline.md", render_markdown(res))
    print(f"pil {res['pil_img_per_s_per_core']} img/s/core, fast {res['fast_img_per_s_per_core']} "
          f"({res['ratio_fast_over_pil']}x), fast on pre-decoded uint8 {res['fast_pixels_img_per_s_per_core']} "
          f"({res['ratio_fast_pixels_over_pil']}x); wrote metrics/input_pipeline.json, reports/input_pipeline.md")


if __name__ == "__main__":
    main()
