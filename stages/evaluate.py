"""DVC stage `evaluate-<report>` (``--table N`` or ``--report figure1``): score every run of the sweeps of a report → metrics/<sweep>.json each
(one process per table: the stage pays Python's and DVC's per-stage cost once). ``--sweep`` scores one.

Each sweep is scored by its evaluator (``evaluate`` in config.sweeps.SWEEPS, one module each, named in
config.sweeps.EVALUATORS): top-1 on minival and val (big_vision's classification evaluator), or fewshot_lsr
on the `data` splits for the 21k / JFT-style pretraining sweeps. With ``runtime.devices`` > 1 the same
command starts torchrun's agent itself (src/dpnrepro/training/launch.py): every rank scores its shard of
each split, rank 0 writes the metrics, the same bytes as one process.
"""

import importlib
import json
from pathlib import Path

from dpnrepro.artifacts import describe_recipe, read_config
from dpnrepro.cli import stage, stage_parser
from dpnrepro.config.params import load_params
from dpnrepro.config.sweeps import EVALUATORS, SWEEPS, get_sweep, reports
from dpnrepro.data.prepare import PREPARED, load_manifest
from dpnrepro.io import write_json_atomic
from dpnrepro.runs import resolve_runs, session_settings
from dpnrepro.training import launch


@stage
def main() -> None:
    ap = stage_parser(__doc__)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--table", type=int, choices=sorted({d.table for d in SWEEPS.values() if isinstance(d.table, int)}))
    which.add_argument("--report", choices=reports(), help="every sweep of a report (table<N>, figure1)")
    which.add_argument("--sweep", choices=list(SWEEPS))
    args = ap.parse_args()
    params = load_params()
    report = f"table{args.table}" if args.table is not None else args.report
    sweeps = [args.sweep] if args.sweep else [s for s, d in SWEEPS.items() if d.report == report]
    resolved = {name: resolve_runs(params, name) for name in sweeps}
    # runtime.devices > 1 outside torchrun: launches the job's processes, then exits
    with launch.stage_session(*session_settings([r for runs in resolved.values() for r in runs])) as ctx:
        for name, runs in resolved.items():
            metrics = evaluate_sweep(params, name, runs, ctx)
            if ctx.is_main:
                out = Path("metrics") / f"{name}.json"
                write_json_atomic(out, metrics)
                print(f"wrote {out} ({len(metrics['runs'])} runs)")


def majority_rate(split: dict) -> float:
    """The % of a split's images that carry its most common class (the manifest's counts): the top-1 of always
    predicting it, the score of a model that learned nothing (the reports' chance, stats.learned)."""
    return 100.0 * max(split["class_counts"]) / split["examples"]


def evaluate_sweep(params, name: str, resolved, ctx) -> dict:
    """The metrics of every run of sweep ``name`` (``resolved``), scored in the session ``ctx`` by the sweep's evaluator."""
    evaluator = SWEEPS[name].evaluate
    definition = EVALUATORS[evaluator]
    Evaluator = importlib.import_module(definition.module).Evaluator
    config = getattr(get_sweep(params, name), evaluator) if definition.params is not None else None
    groups = {}  # the runs that share their evaluation settings are scored together (Evaluator.run_all)
    for r in resolved:
        settings = ({**r.cfg.input.model_dump(), "workers": r.cfg.runtime.workers}, r.cfg.runtime.eval_batch_size)
        groups.setdefault(json.dumps(settings, sort_keys=True), (settings, []))[1].append(r)
    scored = {}
    for (input_cfg, batch_size), group in groups.values():
        scorer = Evaluator(config, input_cfg, prepared_dir=PREPARED, batch_size=batch_size, device=ctx.device,
                           progress=ctx.is_main)
        scored |= zip((r.run.name for r in group), scorer.run_all([r.dir for r in group]))
    runs = {r.run.name: scored[r.run.name] for r in resolved}
    splits = load_manifest(PREPARED)["splits"]
    return {
        "profile": params.profile, "dataset": params.data.name, "sweep": name,
        "evaluate": evaluator, "recipe": describe_recipe(read_config(resolved[0].dir)),
        "data": {"name": params.data.name, "train_examples": splits["train"]["examples"],
                 "val_examples": splits["val"]["examples"], "majority_val": majority_rate(splits["val"])},
        "runs": runs}


if __name__ == "__main__":
    main()
