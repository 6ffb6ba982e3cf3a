"""DVC stage `vtab`: Table 3's fine-tunes, every task × arch × stem × lr × seed in one process
(transfer/vtab.py) → metrics/vtab.json. Resumable (checkpoints/vtab/, persistent). With
``runtime.devices`` > 1 it spreads itself over that many processes (training/launch.py): every rank
trains and evaluates, rank 0 alone writes."""

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.config.params import load_params
from dpnrepro.config.transfer import vtab_config
from dpnrepro.training.launch import metrics_stage
from dpnrepro.transfer.vtab import run_vtab


@stage
def main() -> None:
    stage_arguments(__doc__)
    metrics_stage(load_params(), "vtab", "Table 3",
                  lambda p: vtab_config(p, p.vtab.lrs[0])[2], run_vtab, "tasks", "tasks")


if __name__ == "__main__":
    main()
