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
    import matplotlib.pyplot as plt

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, metadata={"Software": None})
    plt.close(fig)
    tmp.replace(path)


def write_report(name: str, markdown: str, draw: Callable[[Path], None], summary, *, metrics_dir: Path,
                 reports_dir: Path) -> list[Path]:
    """Write ``reports/<name>.md``, ``reports/<name>.png`` (``draw(path)``, which saves through :func:`save_png`)
    and ``metrics/<name>_summary.json``, each atomically; returns their paths."""
    from dpnrepro.io import write_json_atomic, write_text_atomic

    reports_dir.mkdir(exist_ok=True)
    md, png, out = reports_dir / f"{name}.md", reports_dir / f"{name}.png", metrics_dir / f"{name}_summary.json"
    write_text_atomic(md, markdown)
    draw(png)
    write_json_atomic(out, summary)
    return [md, png, out]
