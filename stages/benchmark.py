"""DVC stage `benchmark`: training img/s, MFU and peak memory of Ti/S/B/L-16 × conv/linear/dpn stems next to
timm's stock ViT, on synthetic input → metrics/benchmarks.json + reports/benchmarks.md.

`dvc repro benchmark` uses the `benchmark` section of params.yaml and writes the stage's outputs. With
command-line overrides (e.g. on a GPU machine) the results go to other files, never to the DVC outputs,
which must stay a function of the tracked params:

    python stages/benchmark.py --device cuda --batch-size 256 --rounds 20 --steps-per-round 10 --compile
    # -> metrics/benchmarks_cli.json, reports/benchmarks_cli.md (or --out-json / --out-md)
"""

import argparse

from pydantic import ValidationError

from dpnrepro.cli import hardware_label, stage
from dpnrepro.config.benchmarks import BenchmarkParams
from dpnrepro.config.params import load_params
from dpnrepro.errors import ParamsError
from dpnrepro.io import write_json_atomic, write_text_atomic


STAGE_OUTS = ("metrics/benchmarks.json", "reports/benchmarks.md")
CLI_OUTS = ("metrics/benchmarks_cli.json", "reports/benchmarks_cli.md")


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


@stage
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    ap.add_argument("--archs", type=_list, help="comma-separated, e.g. Ti-16,B-16 (default: benchmark.archs)")
    ap.add_argument("--stems", type=_list, help="comma-separated, e.g. conv,dpn (default: benchmark.stems)")
    ap.add_argument("--timm-reference", action=argparse.BooleanOptionalAction, default=None,
                    help="also run timm's stock vit_* model per arch (default: benchmark.timm_reference)")
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--img-size", type=int)
    ap.add_argument("--warmup-steps", type=int)
    ap.add_argument("--rounds", type=int, help="interleaved timing rounds (>= 6 for a 95 %% CI)")
    ap.add_argument("--steps-per-round", type=int, help="timed steps per model per round")
    ap.add_argument("--seed", type=int, help="weights, synthetic batch and per-round model order")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile the models")
    ap.add_argument("--cudagraphs", action=argparse.BooleanOptionalAction, default=None,
                    help="with --compile on CUDA: replay forward + backward as CUDA graphs")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--num-classes", type=int)
    ap.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: datasheet dense bf16 table)")
    ap.add_argument("--out-json", help=f"default: {STAGE_OUTS[0]}, or {CLI_OUTS[0]} with overrides")
    ap.add_argument("--out-md", help=f"default: {STAGE_OUTS[1]}, or {CLI_OUTS[1]} with overrides")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()

    params = load_params(args.params)
    overrides = {k: v for k, v in {
        "archs": args.archs, "stems": args.stems, "timm_reference": args.timm_reference,
        "batch_size": args.batch_size, "img_size": args.img_size, "warmup_steps": args.warmup_steps,
        "rounds": args.rounds, "steps_per_round": args.steps_per_round, "seed": args.seed,
        "compile": args.compile, "cudagraphs": args.cudagraphs, "device": args.device}.items() if v is not None}
    custom = bool(overrides) or args.params != "params.yaml" or any(
        v is not None for v in (args.num_classes, args.peak_tflops))
    defaults = CLI_OUTS if custom else STAGE_OUTS
    args.out_json, args.out_md = args.out_json or defaults[0], args.out_md or defaults[1]
    if custom and {args.out_json, args.out_md} & set(STAGE_OUTS):
        raise ParamsError(f"{', '.join(STAGE_OUTS)} are the `benchmark` stage's outputs and follow params.yaml alone; "
                          "write results of command-line overrides elsewhere (--out-json/--out-md)")
    try:  # the overrides go through the same schema as params.yaml
        bench = BenchmarkParams.model_validate({**params.benchmark.model_dump(), **overrides})
    except ValidationError as exc:
        raise ParamsError("invalid command-line override: " + "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None

    from dpnrepro.benchmarks.train_throughput import render_markdown, run_benchmark

    result = run_benchmark(
        bench.archs, bench.stems, timm_reference=bench.timm_reference, batch_size=bench.batch_size,
        warmup_steps=bench.warmup_steps, rounds=bench.rounds, steps_per_round=bench.steps_per_round,
        compile=bench.compile, cudagraphs=bench.cudagraphs, device=bench.device, img_size=bench.img_size, num_classes=args.num_classes or 1000,
        optim_cfg=params.train, peak_tflops=args.peak_tflops, hardware=hardware_label(measured_on=True),
        seed=bench.seed, progress=not args.no_progress)
    write_json_atomic(args.out_json, result)
    write_text_atomic(args.out_md, render_markdown(result))
    print(f"wrote {args.out_json}, {args.out_md} ({result['device']})")


if __name__ == "__main__":
    main()
