"""DVC stages `table6` / `figure1`: the metrics of the ablation sweeps (+ the paper's Table 6) →
reports/<report>.{md,png} + metrics/<report>_summary.json. Needs neither params nor data nor weights."""

from dpnrepro.cli import stage, stage_parser
from dpnrepro.reports.ablations import BUILDERS, build_report


@stage
def main() -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--report", choices=sorted(BUILDERS), required=True)
    args = ap.parse_args()
    print("wrote " + ", ".join(map(str, build_report(args.report))))


if __name__ == "__main__":
    main()
