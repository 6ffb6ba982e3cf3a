"""Write one table's report files (Markdown, PNG, JSON summary) from the metrics of its sweeps."""

from __future__ import annotations

from pathlib import Path

from dpnrepro.config.sweeps import SWEEPS
from dpnrepro.reports import headline
from dpnrepro.reports.plotting import read_metrics, write_report
from dpnrepro.reports.tables import render_figure, render_markdown, summarize_sweep, table_sweeps


def build_table(table: int, metrics_dir: str | Path = "metrics", reports_dir: str | Path = "reports") -> list[Path]:
    """The table from the metrics of its sweeps alone (each says its profile, data, recipe and hardware),
    so `dvc pull`ed or committed metrics regenerate it without params, data or weights."""
    metrics_dir, reports_dir = Path(metrics_dir), Path(reports_dir)
    metrics = {}
    for sweep in table_sweeps(table):
        metrics[sweep] = read_metrics(metrics_dir / f"{sweep}.json", f"evaluate-table{table}")
    first = next(iter(metrics.values()))
    hardware = sorted({r["hardware"] for m in metrics.values() for r in m["runs"].values()})
    context = {
        "profile": first["profile"],
        "dataset": f"{first['data']['name']} (train {first['data']['train_examples']} images)",
        "val_examples": first["data"]["val_examples"],
        "chance": first["data"]["majority_val"],
        "hardware": "; ".join(hardware),
        "recipes": {s: m["recipe"] + (f"; fine-tuned from `{SWEEPS[s].init_from}`" if SWEEPS[s].init_from else "")
                    for s, m in metrics.items()},
    }
    summaries = {s: summarize_sweep(m) for s, m in metrics.items()}
    return write_report(f"table{table}", render_markdown(table, metrics, summaries, context),
                        lambda png: render_figure(table, summaries, context, png), summaries,
                        headline=headline.tables_1_2(summaries), metrics_dir=metrics_dir, reports_dir=reports_dir)
