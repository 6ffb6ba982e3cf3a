"""DVC stage `table4`: metrics/lit.json + the paper's Table 4 → reports/table4.{md,png} +
metrics/table4_summary.json (needs neither params nor weights: the metrics carry profile, recipe, hardware)."""

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.reports.table4 import build_table4


@stage
def main() -> None:
    stage_arguments(__doc__)
    print("wrote " + ", ".join(map(str, build_table4())))


if __name__ == "__main__":
    main()
