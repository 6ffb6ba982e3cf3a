"""Matplotlib without a display, PNGs whose bytes depend only on what is drawn, and the three files of a report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: Path) -> None:
    """Write ``fig`` to ``path`` atomically, without the version stamp (byte-identical across matplotlib builds)."""
    import io

    import matplotlib.pyplot as plt

    from dpnrepro.io import write_bytes_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())


def read_metrics(path: Path, stage: str) -> dict:
    """The metrics JSON a report is built from; a one-line error naming the stage that writes it if missing
    or unreadable."""
    from dpnrepro.io import read_json
    from dpnrepro.restore import restore_command

    return read_json(path, fix=lambda: f"rebuild it with `dvc repro --force {stage}` or restore it with "
                                       f"{restore_command(path, stage)}")


def finish_delta_axes(axes) -> None:
    """Bar charts of differences: first bar on top, a line at 0, a light x grid."""
    for ax in axes:
        ax.invert_yaxis()
        ax.axvline(0, color="black", lw=0.8)
        ax.grid(axis="x", alpha=0.3)


def write_report(name: str, markdown: str, draw: Callable[[Path], None], summary, *, headline: dict,
                 metrics_dir: Path, reports_dir: Path) -> list[Path]:
    """Write ``reports/<name>.md``, ``reports/<name>.png`` (``draw(path)``, which saves through :func:`save_png`),
    ``metrics/<name>_summary.json`` and beside it its headline numbers ``metrics/headline/<name>.json``
    (:mod:`dpnrepro.reports.headline`), all four or none (:func:`dpnrepro.io.all_or_nothing`); returns the paths
    of the first three."""
    from dpnrepro.io import all_or_nothing, write_json_atomic, write_text_atomic
    from dpnrepro.reports.headline import write_headline

    md, png, out = reports_dir / f"{name}.md", reports_dir / f"{name}.png", metrics_dir / f"{name}_summary.json"
    with all_or_nothing():
        write_text_atomic(md, markdown)
        draw(png)
        write_json_atomic(out, summary)
        write_headline(name, headline, metrics_dir)
    return [md, png, out]


def report_from_metrics(name: str, metrics_file: str, stage: str, summarize: Callable[[dict], dict],
                 render_markdown: Callable[[dict, dict], str], render_figure: Callable[[dict, dict, Path], None],
                 headline: Callable[[dict, dict], dict], metrics_dir: str | Path = "metrics",
                 reports_dir: str | Path = "reports") -> list[Path]:
    """A report built from one metrics file (Tables 4 and 5): ``metrics/<metrics_file>`` (written by DVC stage
    ``stage``) → ``summarize(metrics)`` → :func:`write_report` of ``render_markdown(metrics, summary)``,
    ``render_figure(metrics, summary, png)`` and ``headline(metrics, summary)``."""
    metrics_dir, reports_dir = Path(metrics_dir), Path(reports_dir)
    metrics = read_metrics(metrics_dir / metrics_file, stage)
    summary = summarize(metrics)
    return write_report(name, render_markdown(metrics, summary), lambda png: render_figure(metrics, summary, png),
                        summary, headline=headline(metrics, summary), metrics_dir=metrics_dir, reports_dir=reports_dir)
