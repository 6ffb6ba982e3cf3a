"""reports/study.md, reports/study.png and metrics/study_summary.json from the cells' metrics alone."""

from __future__ import annotations

from pathlib import Path


def build_study_report(metrics_dir: str | Path = "metrics", reports_dir: str | Path = "reports") -> list[Path]:
    raise NotImplementedError("study report: being written")
