"""DVC stage `table2`: metrics of the Table 2 sweeps + paper numbers → reports/table2.{md,png} + summary."""

from dpnrepro.cli import stage
from dpnrepro.config import load_params
from dpnrepro.reports.build import build_table


@stage
def main() -> None:
    written = build_table(2, load_params())
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
