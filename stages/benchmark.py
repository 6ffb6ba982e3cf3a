"""DVC stage `benchmark`: training img/s, MFU and peak memory of Ti/S/B/L-16 × conv/linear/dpn stems next to
timm's stock ViT, on synthetic input → metrics/benchmarks.json + reports/benchmarks.md.

`dvc repro benchmark` uses the `benchmark` section of params.yaml. Stand-alone on a GPU machine
(command-line flags override params; same outputs):

    python stages/benchmark.py --device cuda --batch-size 256 --steps 50 --warmup-steps 10 --compile
"""

import argparse

from pydantic import ValidationError

from dpnrepro.cli import hardware_label, stage
from dpnrepro.config import load_params
from dpnrepro.errors import ParamsError
from dpnrepro.io import write_json_atomic, write_text_atomic


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
    ap.add_argument("--warmup-steps", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None, help="torch.compile the models")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: datasheet dense bf16 table)")
    ap.add_argument("--out-json", default="metrics/benchmarks.json")
    ap.add_argument("--out-md", default="reports/benchmarks.md")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()

    params = load_params(args.params)
    overrides = {k: v for k, v in {
        "archs": args.archs, "stems": args.stems, "timm_reference": args.timm_reference,
        "batch_size": args.batch_size, "warmup_steps": args.warmup_steps, "steps": args.steps,
        "compile": args.compile, "device": args.device}.items() if v is not None}
    try:  # the overrides go through the same schema as params.yaml
        bench = type(params.benchmark).model_validate({**params.benchmark.model_dump(), **overrides})
    except ValidationError as exc:
        raise ParamsError("invalid command-line override: " + "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None

    from dpnrepro.benchmarks.train_throughput import render_markdown, run_benchmark

    result = run_benchmark(
        bench.archs, bench.stems, timm_reference=bench.timm_reference, batch_size=bench.batch_size,
        warmup_steps=bench.warmup_steps, steps=bench.steps, compile=bench.compile, device=bench.device,
        img_size=args.img_size, num_classes=args.num_classes, optim_cfg=params.train,
        peak_tflops=args.peak_tflops, hardware=hardware_label(), progress=not args.no_progress)
    write_json_atomic(args.out_json, result)
    write_text_atomic(args.out_md, render_markdown(result))
    print(f"wrote {args.out_json}, {args.out_md} ({result['device']})")


if __name__ == "__main__":
    main()
