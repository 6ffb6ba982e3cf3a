"""DVC stage `evaluate-<report>` (``--table N`` or ``--report figure1``): score every run of the sweeps of a report → metrics/<sweep>.json each
(one process per table: the stage pays Python's and DVC's per-stage cost once). ``--sweep`` scores one.

Top-1 sweeps are scored on minival and val (big_vision's classification evaluator); few-shot sweeps
(the 21k / JFT-style pretraining; ``evaluate`` in config.sweeps.SWEEPS) by fewshot_lsr on the `data` splits.
"""

import argparse
from pathlib import Path

from dpnrepro.artifacts import describe_recipe, read_config
from dpnrepro.cli import stage
from dpnrepro.config.params import load_params
from dpnrepro.config.sweeps import SWEEPS, get_sweep, reports
from dpnrepro.data.prepare import PREPARED, load_manifest
from dpnrepro.evaluation.classification import evaluate_run
from dpnrepro.evaluation.fewshot import evaluate_fewshot_run
from dpnrepro.io import write_json_atomic
from dpnrepro.runs import resolve_runs


@stage
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--table", type=int, choices=sorted({d.table for d in SWEEPS.values() if isinstance(d.table, int)}))
    which.add_argument("--report", choices=reports(), help="every sweep of a report (table<N>, figure1)")
    which.add_argument("--sweep", choices=list(SWEEPS))
    args = ap.parse_args()
    params = load_params()
    report = f"table{args.table}" if args.table is not None else args.report
    sweeps = [args.sweep] if args.sweep else [s for s, d in SWEEPS.items() if d.report == report]
    for name in sweeps:
        evaluate_sweep(params, name)


def evaluate_sweep(params, name: str) -> None:
    """Score every run of sweep ``name`` → metrics/<name>.json."""
    sweep = get_sweep(params, name)
    runs = {}
    resolved = resolve_runs(params, name)
    for r in resolved:
        cfg = r.cfg
        input_cfg = {**cfg.input.model_dump(), "workers": cfg.runtime.workers}
        kw = dict(batch_size=cfg.runtime.eval_batch_size, device=cfg.train.device)
        if SWEEPS[name].evaluate == "fewshot":
            fs = sweep.fewshot
            runs[r.run.name] = evaluate_fewshot_run(
                r.dir, PREPARED, input_cfg, shots=fs.shots, draws=fs.draws, l2_reg=fs.l2_reg,
                train_split=fs.train_split, test_split=fs.test_split, resize=fs.resize, pool_size=fs.pool_size, **kw)
        else:
            runs[r.run.name] = evaluate_run(r.dir, PREPARED, input_cfg, **kw)
    out = Path("metrics") / f"{name}.json"
    first = resolved[0].dir
    splits = load_manifest(PREPARED)["splits"]
    write_json_atomic(out, {
        "profile": params.profile, "dataset": params.data.name, "sweep": name,
        "evaluate": SWEEPS[name].evaluate, "recipe": describe_recipe(read_config(first)),
        "data": {"name": params.data.name, "train_examples": splits["train"]["examples"],
                 "val_examples": splits["val"]["examples"]},
        "runs": runs})
    print(f"wrote {out} ({len(runs)} runs)")


if __name__ == "__main__":
    main()
