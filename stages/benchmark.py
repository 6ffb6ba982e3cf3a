"""DVC stage `benchmark`: training img/s, MFU and peak memory of Ti/S/B/L-16 × conv/linear/dpn stems next to
timm's stock ViT, on synthetic input → metrics/benchmarks.json + reports/benchmarks.md.

`dvc repro benchmark` uses the `benchmark` section of params.yaml and writes the stage's outputs. With
command-line overrides (e.g. on a GPU machine) the results go to other files, never to the DVC outputs,
which must stay a function of the tracked params:

    python stages/benchmark.py --device cuda --batch-size 256 --rounds 20 --steps-per-round 10 --compile
    # -> metrics/benchmarks_cli.json, reports/benchmarks_cli.md (or --out-json / --out-md)
"""

from dpnrepro.benchmarks.stage_cli import add_output_options, add_settings_options, output_paths, settings_of
from dpnrepro.cli import hardware_label, stage, stage_parser
from dpnrepro.config.benchmarks import BenchmarkParams
from dpnrepro.config.params import load_params
from dpnrepro.io import all_or_nothing, write_json_atomic, write_text_atomic

STAGE_OUTS = ("metrics/benchmarks.json", "reports/benchmarks.md")
CLI_OUTS = ("metrics/benchmarks_cli.json", "reports/benchmarks_cli.md")


@stage
def main() -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    add_settings_options(ap, BenchmarkParams, "benchmark")  # --archs, --batch-size, ...: one per field
    ap.add_argument("--num-classes", type=int)
    ap.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: datasheet dense bf16 table)")
    add_output_options(ap, STAGE_OUTS, CLI_OUTS)
    args = ap.parse_args()

    params = load_params(args.params)
    bench, overrides = settings_of(args, params.benchmark, "benchmark")
    custom = bool(overrides) or args.params != "params.yaml" or any(
        v is not None for v in (args.num_classes, args.peak_tflops))
    out_json, out_md = output_paths(args, custom, "benchmark", STAGE_OUTS, CLI_OUTS, "params.yaml")

    from dpnrepro.benchmarks.throughput_report import render_markdown
    from dpnrepro.benchmarks.train_throughput import run_benchmark

    result = run_benchmark(**bench.model_dump(), num_classes=args.num_classes or 1000, optim_cfg=params.train,
                           peak_tflops=args.peak_tflops, hardware=hardware_label(measured_on=True),
                           progress=not args.no_progress)
    with all_or_nothing():  # the new files together, or the previous ones stay
        write_json_atomic(out_json, result)
        write_text_atomic(out_md, render_markdown(result))
        if not custom:  # the stage's run: its headline is a DVC metric (benchmarks/dvc.yaml)
            from dpnrepro.benchmarks.headline import throughput_headline
            from dpnrepro.reports.headline import write_headline

            write_headline("benchmarks", throughput_headline(result))
    print(f"wrote {out_json}, {out_md} ({result['device']})")


if __name__ == "__main__":
    main()
