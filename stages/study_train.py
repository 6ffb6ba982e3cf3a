"""DVC stage `study-<cell>` (study/dvc.yaml): train and score every run of one cell of the powered study
→ metrics/study/<cell>.json. ``python stages/study_train.py --cell fashion_mnist-Mu-7-short``."""

from pathlib import Path

from dpnrepro.cli import stage, stage_parser
from dpnrepro.io import write_json_atomic
from dpnrepro.study.config import load_study_params
from dpnrepro.study.run import METRICS_DIR, run_cell


@stage
def main() -> None:
    ap = stage_parser(__doc__)
    ap.add_argument("--cell", required=True)
    ap.add_argument("--workers", type=int, help="parallel runs (default: $DPNREPRO_STUDY_WORKERS or the CPU count)")
    args = ap.parse_args()
    params = load_study_params()
    cell = params.cell(args.cell)
    out = Path(METRICS_DIR) / f"{cell.name}.json"
    write_json_atomic(out, run_cell(params, cell, workers=args.workers))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
