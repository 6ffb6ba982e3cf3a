"""DVC stage `figures`: Figures 2-4 of the paper from the runs of ``figures.sweep`` (Table 1's):
per-layer gradient norms from the trainer's dvclive logs (Fig. 2, 4) and DPN's first LayerNorm scale
(Fig. 3) → reports/figure{2,3,4}.{md,png}, metrics/figures_summary.json, metrics/figure2_*.csv."""

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.config.params import load_params
from dpnrepro.io import all_or_nothing
from dpnrepro.reports.figures import build_figures


@stage
def main() -> None:
    stage_arguments(__doc__)
    with all_or_nothing():  # every figure, table and summary, or none
        written = build_figures(load_params().figures)
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
