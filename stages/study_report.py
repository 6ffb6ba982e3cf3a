"""DVC stage `study_report` (study/dvc.yaml): the cells' metrics → reports/study.{md,png} +
metrics/study_summary.json. Needs neither params nor data nor weights."""

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.study.report import build_study_report


@stage
def main() -> None:
    stage_arguments(__doc__)
    print("wrote " + ", ".join(map(str, build_study_report())))


if __name__ == "__main__":
    main()
