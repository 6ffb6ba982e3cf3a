"""The texts the recipes and transcriptions are checked against, which the repository does not ship.

They are plain-text extractions in one folder, each named ``NNN_<anything>.txt``: ``000`` the paper
(Kumar et al., TMLR 2023, PDF to text), ``004`` Touvron's thesis (DeiT's Table 3.9). The folder is
``$DPNREPRO_PAPER_DIR``, else ``../shared/seeds`` beside the repository when it exists. A test that needs a
text it cannot find skips, and its reason names the variable.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "DPNREPRO_PAPER_DIR"
REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO.parent / "shared" / "seeds"
PAPER, DEIT_THESIS = "000", "004"


def paper_dir() -> Path | None:
    """The folder of the texts: ``$DPNREPRO_PAPER_DIR`` when set, else the default when it exists."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    return DEFAULT if DEFAULT.is_dir() else None


def skip_reason(prefix: str) -> str:
    return (f"needs the text {prefix}_*.txt: set {ENV} to the folder of the paper's text "
            f"(default ../shared/seeds beside the repository)")


def source_text(prefix: str = PAPER) -> str:
    """The text ``<prefix>_*.txt`` of the folder; skips the calling test when there is none."""
    folder = paper_dir()
    found = sorted(folder.glob(f"{prefix}_*.txt")) if folder and folder.is_dir() else []
    if not found:
        pytest.skip(skip_reason(prefix))
    return found[0].read_text(encoding="utf-8")
