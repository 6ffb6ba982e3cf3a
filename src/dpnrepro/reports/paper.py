"""Published numbers of the Dual PatchNorm paper (Kumar et al., TMLR 2023).

Tables 1-7 are transcribed to ``reports/paper/tableN.yaml``; values and CIs are
stored as the printed strings (see ``reports/paper/README.md``).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from dpnrepro.io import read_yaml

_CACHE: dict[tuple, dict] = {}  # (path, mtime_ns, size) -> parsed YAML


def paper_dir() -> Path:
    """Return ``<repo>/reports/paper``; the repo root is ``$DPNREPRO_ROOT`` if set,
    else the parent of ``src/`` above this package."""
    root = os.environ.get("DPNREPRO_ROOT")
    if root:
        return Path(root).expanduser().resolve() / "reports" / "paper"
    # .../<repo>/src/dpnrepro/reports/paper.py -> parents[3] == <repo>
    return Path(__file__).resolve().parents[3] / "reports" / "paper"


def load_paper_table(n: int) -> dict:
    """Load and return the parsed YAML of paper Table ``n`` (1-7)."""
    path = paper_dir() / f"table{int(n)}.yaml"
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None  # read_yaml says how to restore it
    key = (str(path), st.st_mtime_ns, st.st_size) if st else None
    if key not in _CACHE:
        _CACHE[key] = read_yaml(path, fix=f"restore the transcription with `git checkout -- {_shown(path)}`")
    return copy.deepcopy(_CACHE[key])


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it lies below it (the form ``git checkout`` takes there)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def paper_value(n: int, **match) -> dict:
    """Return the unique row of Table ``n`` whose keys equal all ``match`` pairs.

    Values compare as strings, so ``paper_value(1, arch="B/16", variant="dpn",
    block="ViT AugReg")`` works. Raises KeyError if zero or several rows match.
    """
    rows = load_paper_table(n).get("rows") or []
    want = {k: str(v) for k, v in match.items()}
    hits = [
        r for r in rows
        if all(k in r and r[k] is not None and str(r[k]) == v for k, v in want.items())
    ]
    if len(hits) != 1:
        what = "no row" if not hits else f"{len(hits)} rows"
        raise KeyError(f"paper table {n}: {what} match {want} (need exactly one)")
    return hits[0]


def as_float(s: str | None) -> float | None:
    """Convert a printed value/CI string (e.g. ``"-2.6"``) to float; None stays None."""
    return None if s is None else float(s)
