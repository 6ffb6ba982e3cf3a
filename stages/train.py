"""DVC stage `train@<sweep>`: train the runs of a sweep, resumably.

Writes ``runs/<sweep>/<arch>_<stem>_s<seed>/`` (weights, model spec, resolved config.json, dvclive logs,
run summary); the resumable training state lives in ``checkpoints/<sweep>/...`` (a persistent DVC
output).

The whole sweep (what `dvc repro` runs): ``python stages/train.py --sweep table1``. One run:
``python stages/train.py --sweep table1 --arch Mu-7 --stem dpn --seed 0``. With ``runtime.devices`` > 1
the same command starts torchrun's agent itself and trains on that many processes (GPUs when present),
over ``runtime.nodes`` nodes (src/dpnrepro/training/launch.py); under a hand-started torchrun it just
trains. One process group for the whole sweep; rank 0 writes the outputs.
"""

from dpnrepro.cli import stage, stage_parser
from dpnrepro.config.params import load_params
from dpnrepro.config.sweeps import get_sweep
from dpnrepro.errors import ParamsError
from dpnrepro.runs import Run
from dpnrepro.training.run import train_stage


@stage
def main() -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--arch", help="one run only (with --stem and --seed)")
    ap.add_argument("--stem")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--variant", default="", help="the model variant of the run (sweeps with `variants`)")
    args = ap.parse_args()
    params = load_params()
    one_run = (args.arch, args.stem, args.seed)
    if any(v is None for v in one_run) and not all(v is None for v in one_run):
        raise ParamsError("give all of --arch, --stem and --seed (one run) or none of them (the whole sweep)")
    run = None if args.arch is None else one_run_of(params, args.sweep, Run(args.arch, args.stem, args.seed, args.variant))
    # runtime.devices > 1 outside torchrun: launches the job's processes, then exits
    train_stage(params, args.sweep, run)


def one_run_of(params, sweep: str, run: Run) -> Run:
    """``run`` when the params define it in ``sweep``; else ParamsError naming the flag and its valid values
    (a one-run invocation writes into the sweep's DVC output only a run the params define)."""
    sw = get_sweep(params, sweep)
    for flag, value, valid in (("--arch", run.arch, sw.archs), ("--stem", run.stem, sw.stems),
                               ("--seed", run.seed, sw.seeds), ("--variant", run.variant, list(sw.variants) or [""])):
        if value not in valid:
            choices = ", ".join(str(v) for v in valid) if valid != [""] else "none (leave --variant out)"
            raise ParamsError(f"{flag} {value!r} is not a run of sweep {sweep!r} in params.yaml; choose from {choices}")
    return run


if __name__ == "__main__":
    main()
