"""DVC stages `table3` / `table7`: metrics/vtab.json or metrics/sun397_scratch.json + the paper's numbers →
reports/table<N>.{md,png} + metrics/table<N>_summary.json (reports/transfer_tables.py). Needs neither
params nor data nor weights: the metrics carry profile, recipe and hardware."""

from dpnrepro.cli import stage, stage_parser
from dpnrepro.reports.transfer_tables import METRICS, build_transfer_table


@stage
def main() -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--table", type=int, choices=sorted(METRICS), required=True)
    written = build_transfer_table(ap.parse_args().table)
    print("wrote " + ", ".join(map(str, written)))


if __name__ == "__main__":
    main()
