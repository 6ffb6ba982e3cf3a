"""DVC stage `segment` (Table 5): every (stem, training fraction, seed) of ``segmentation`` in params,
each trained with mmengine's Runner and evaluated with mmseg's IoUMetric, in one process (a Runner
costs about a second to build; a process with torch + mmseg imports several).

A completed run is read back from ``checkpoints/seg/<run>/`` (persistent), a killed one resumes from
its last mmengine checkpoint there. Writes ``runs/seg/<run>/`` (segmentor weights as safetensors,
config, result) and ``metrics/seg.json``. One run: ``--stem dpn --fraction 1/4 --seed 0``
(each flag must name a value of the params' sweep).
With ``runtime.devices`` > 1 it spreads itself over that many processes (training/launch.py): every rank
trains every run (mmengine's DDP), rank 0 alone writes.
"""

import itertools

from dpnrepro.cli import stage, stage_parser
from dpnrepro.config.params import load_params


@stage
def main() -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--stem")
    ap.add_argument("--fraction")
    ap.add_argument("--seed", type=int)
    args = ap.parse_args()
    params = load_params()
    seg = params.segmentation
    if seg is None:
        from dpnrepro.errors import ParamsError

        raise ParamsError("params.yaml has no segmentation section (Table 5)")
    for flag, value, valid in (("--stem", args.stem, seg.stems), ("--fraction", args.fraction, seg.fractions),
                               ("--seed", args.seed, seg.seeds)):
        if value is not None and value not in valid:  # before torch and mmseg load: a bad flag costs no import
            from dpnrepro.errors import ParamsError

            raise ParamsError(f"{flag} {value!r} is not a run of segmentation in params.yaml; "
                              f"choose from {', '.join(map(str, valid))}")
    from dpnrepro.segmentation.execution import hide_gpus_for_cpu
    from dpnrepro.training.launch import stage_session

    hide_gpus_for_cpu(seg.device)
    runs = [r for r in itertools.product(seg.stems, seg.fractions, seg.seeds)
            if (args.stem in (None, r[0]) and args.fraction in (None, r[1]) and args.seed in (None, r[2]))]
    single = any(v is not None for v in (args.stem, args.fraction, args.seed))
    with stage_session(params.runtime, seg.device, deterministic=False) as ctx:
        from dpnrepro.segmentation.sweep import run_sweep

        written = run_sweep(params, runs, write_outputs=not single, ctx=ctx)
        if ctx.is_main:
            print("wrote " + ", ".join(map(str, written)) if written
                  else f"trained {len(runs)} run(s) into checkpoints/seg")


if __name__ == "__main__":
    main()
