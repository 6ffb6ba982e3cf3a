"""DVC stage `lit_evaluate`: zero-shot top-1 of every LiT run on ``lit.zeroshot.datasets`` with each
classifier of ``lit.zeroshot.classifiers`` → metrics/lit.json."""

from pathlib import Path

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.config.params import load_params
from dpnrepro.errors import ParamsError
from dpnrepro.io import write_json_atomic
from dpnrepro.lit.evaluate import evaluate_lit

OUT = Path("metrics/lit.json")


@stage
def main() -> None:
    stage_arguments(__doc__)
    params = load_params()
    if params.lit is None:
        raise ParamsError("params.yaml has no `lit` section (Table 4); copy it from profiles/")
    metrics = evaluate_lit(params)
    write_json_atomic(OUT, metrics)
    print(f"wrote {OUT} ({len(metrics['runs'])} runs)")


if __name__ == "__main__":
    main()
