"""DVC stage `evaluate@<sweep>`: score every run of a sweep → metrics/<sweep>.json.

``evaluate: top1`` sweeps are scored on minival and val (big_vision's classification evaluator);
``evaluate: fewshot`` sweeps (the 21k / JFT-style pretraining) by fewshot_lsr on the `data` splits.
"""

import argparse
from pathlib import Path

from dpnrepro.artifacts import run_dir, run_name
from dpnrepro.cli import stage
from dpnrepro.config import get_sweep, load_params, sweep_config
from dpnrepro.data.prepare import PREPARED
from dpnrepro.evaluation.classification import evaluate_run
from dpnrepro.evaluation.fewshot import evaluate_fewshot_run
from dpnrepro.io import write_json_atomic


@stage
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sweep", default="table1")
    args = ap.parse_args()
    params = load_params()
    sweep = get_sweep(params, args.sweep)
    runs = {}
    for arch in sweep.archs:
        cfg = sweep_config(params, args.sweep, arch)
        input_cfg = {**cfg.input.model_dump(), "workers": cfg.runtime.workers}
        for stem in sweep.stems:
            for seed in sweep.seeds:
                path = run_dir(args.sweep, arch, stem, seed)
                kw = dict(batch_size=cfg.runtime.eval_batch_size, device=cfg.train.device)
                if sweep.evaluate == "fewshot":
                    fs = sweep.fewshot
                    runs[run_name(arch, stem, seed)] = evaluate_fewshot_run(
                        path, PREPARED, input_cfg, shots=fs.shots, draws=fs.draws, l2_reg=fs.l2_reg,
                        train_split=fs.train_split, test_split=fs.test_split, resize=fs.resize,
                        pool_size=fs.pool_size, **kw)
                else:
                    runs[run_name(arch, stem, seed)] = evaluate_run(path, PREPARED, input_cfg, **kw)
    out = Path("metrics") / f"{args.sweep}.json"
    write_json_atomic(out, {"profile": params.profile, "dataset": params.data.name, "sweep": args.sweep,
                            "evaluate": sweep.evaluate, "runs": runs})
    print(f"wrote {out} ({len(runs)} runs)")


if __name__ == "__main__":
    main()
