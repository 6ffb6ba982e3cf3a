"""DVC stage `sun397_scratch`: Table 7's from-scratch search (appendix F) per arch × stem in one process
(transfer/scratch.py) → metrics/sun397_scratch.json. Resumable (checkpoints/sun397_scratch/, persistent).
With ``runtime.devices`` > 1 it spreads itself over that many processes (training/launch.py): every
rank trains and evaluates, rank 0 alone writes."""

from pathlib import Path

from dpnrepro.cli import stage
from dpnrepro.config import load_params, transfer_config
from dpnrepro.errors import ParamsError
from dpnrepro.io import write_json_atomic
from dpnrepro.training.launch import stage_session
from dpnrepro.transfer.scratch import run_scratch


@stage
def main() -> None:
    params = load_params()
    if params.sun397_scratch is None:
        raise ParamsError("params.yaml has no `sun397_scratch` section (Table 7)")
    train = transfer_config(params, params.sun397_scratch.recipe)[2]
    with stage_session(params.runtime, train.device, train.deterministic) as ctx:
        metrics = run_scratch(params, progress=ctx.is_main)
        if ctx.is_main:
            out = Path("metrics") / "sun397_scratch.json"
            write_json_atomic(out, metrics)
            print(f"wrote {out} ({len(metrics['runs'])} variants)")


if __name__ == "__main__":
    main()
