"""DVC stage `reports_index`: reports/README.md, the index of every table and figure (dpnrepro.reports.index),
from dvc.yaml, the reports' metrics, reports/paper, profiles/full.yaml and the committed GPU throughput."""

import argparse

from dpnrepro.cli import stage
from dpnrepro.reports.index import write_index


@stage
def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    print(f"wrote {write_index()}")


if __name__ == "__main__":
    main()
