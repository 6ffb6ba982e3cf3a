"""DVC stage `sun397_scratch`: Table 7's from-scratch search (appendix F) per arch × stem in one process
(transfer/scratch.py) → metrics/sun397_scratch.json. Resumable (checkpoints/sun397_scratch/, persistent).
With ``runtime.devices`` > 1 it spreads itself over that many processes (training/launch.py): every
rank trains and evaluates, rank 0 alone writes."""

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.config.params import load_params
from dpnrepro.config.transfer import transfer_config
from dpnrepro.training.launch import metrics_stage
from dpnrepro.transfer.scratch import run_scratch


@stage
def main() -> None:
    stage_arguments(__doc__)
    metrics_stage(load_params(), "sun397_scratch", "Table 7",
                  lambda p: transfer_config(p, p.sun397_scratch.recipe)[2], run_scratch, "runs", "variants")


if __name__ == "__main__":
    main()
