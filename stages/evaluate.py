"""DVC stage `evaluate`: score every run of a sweep on minival and val → metrics/<sweep>.json."""

import argparse
from pathlib import Path

from dpnrepro.cli import stage
from dpnrepro.config import load_params
from dpnrepro.evaluation.classification import evaluate_run
from dpnrepro.io import write_json_atomic
from dpnrepro.training.run import PREPARED, run_dir, run_name


@stage
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sweep", default="table1")
    args = ap.parse_args()
    params = load_params()
    sweep = getattr(params, args.sweep)
    runs = {}
    for arch in sweep.archs:
        for stem in sweep.stems:
            for seed in sweep.seeds:
                runs[run_name(arch, stem, seed)] = evaluate_run(
                    run_dir(args.sweep, arch, stem, seed), PREPARED, params.input.model_dump(),
                    batch_size=params.train.eval_batch_size, device=params.train.device)
    out = Path("metrics") / f"{args.sweep}.json"
    write_json_atomic(out, {"profile": params.profile, "dataset": params.data.name, "runs": runs})
    print(f"wrote {out} ({len(runs)} runs)")


if __name__ == "__main__":
    main()
