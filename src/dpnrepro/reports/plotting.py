"""Matplotlib without a display, and PNGs whose bytes depend only on what is drawn."""

from __future__ import annotations

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
