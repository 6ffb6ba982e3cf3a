"""DVC stages `table1` / `table2` / `table5`: the metrics of a table's sweeps (Table 5: metrics/seg.json) +
the paper's numbers → reports/table<N>.{md,png} + metrics/table<N>_summary.json. Needs neither params nor data nor weights:
every metrics file carries its profile, data, recipe and hardware."""

from dpnrepro.cli import stage, stage_parser
from dpnrepro.reports.build import build_table
from dpnrepro.reports.tables import TABLES


@stage
def main() -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--table", type=int, choices=[*sorted(TABLES), 5], required=True)
    args = ap.parse_args()
    if args.table == 5:
        from dpnrepro.reports.table5 import build_table5

        written = build_table5()
    else:
        written = build_table(args.table)
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
