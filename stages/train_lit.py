"""DVC stage `lit_train`: a text tower from scratch against every locked image tower of ``lit.towers``,
``lit.seeds`` runs each (Table 4) → runs/lit/ (resumable state in checkpoints/lit/). With
``runtime.devices`` > 1 the command starts torchrun's agent itself (training/launch.py); rank 0 writes."""

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.config.params import load_params
from dpnrepro.errors import ParamsError
from dpnrepro.lit.run import lit_session, train_lit


@stage
def main() -> None:
    stage_arguments(__doc__)
    params = load_params()
    if params.lit is None:
        raise ParamsError("params.yaml has no `lit` section (Table 4); copy it from profiles/")
    with lit_session(params) as ctx:  # runtime.devices > 1 outside torchrun: launches, then exits
        written = train_lit(params, ctx=ctx)
    if ctx.is_main:
        print(f"trained {len(written)} LiT runs")


if __name__ == "__main__":
    main()
