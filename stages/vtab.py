"""DVC stage `vtab`: Table 3's fine-tunes, every task × arch × stem × lr × seed in one process
(transfer/vtab.py) → metrics/vtab.json. Resumable (checkpoints/vtab/, persistent). With
``runtime.devices`` > 1 it spreads itself over that many processes (training/launch.py): every rank
trains and evaluates, rank 0 alone writes."""

from pathlib import Path

from dpnrepro.cli import stage
from dpnrepro.config import load_params, vtab_config
from dpnrepro.errors import ParamsError
from dpnrepro.io import write_json_atomic
from dpnrepro.training.launch import stage_session
from dpnrepro.transfer.vtab import run_vtab


@stage
def main() -> None:
    params = load_params()
    if params.vtab is None:
        raise ParamsError("params.yaml has no `vtab` section (Table 3)")
    train = vtab_config(params, params.vtab.lrs[0])[2]
    with stage_session(params.runtime, train.device, train.deterministic) as ctx:
        metrics = run_vtab(params, progress=ctx.is_main)
        if ctx.is_main:
            out = Path("metrics") / "vtab.json"
            write_json_atomic(out, metrics)
            print(f"wrote {out} ({len(metrics['tasks'])} tasks)")


if __name__ == "__main__":
    main()
