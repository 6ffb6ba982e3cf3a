"""DVC stage `reports_index`: reports/README.md, the index of every table and figure (dpnrepro.reports.index),
for the reports the pipeline's stages write (dpnrepro.pipeline, what dvc.yaml is generated from), from their
metrics, reports/paper, profiles/full.yaml and the committed GPU throughput; its Findings section also reads the
study's record (study/findings.json) and the committed GPU runs (reports/gpu/<run>/)."""

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.pipeline import stages
from dpnrepro.reports.index import report_entries, write_index


@stage
def main() -> None:
    stage_arguments(__doc__)
    print(f"wrote {write_index(report_entries(stages()))}")


if __name__ == "__main__":
    main()
