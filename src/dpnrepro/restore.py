"""How to get a stage's committed outputs back: the command that works for the file, as the errors print it.

A cached output (DVC's cache) comes back with ``dvc checkout --force <output>``: without ``--force`` DVC
refuses ("Can't remove the following unsaved files without confirmation") whenever the damaged or
half-rewritten file is still in place. A git-tracked output (``cache: false``) is not DVC's to restore
(``dvc checkout`` exits 0 and restores nothing): ``git checkout -- <file>`` is. Persist outputs (a run's
checkpoints) are never named: checking them out would replace newer work. Where DVC cannot read the
pipeline, the advice is to rebuild the stage (``dvc repro --force --single-item <stage>``).
"""

from __future__ import annotations

import os
from pathlib import Path

from dpnrepro.dvc_graph import stage_restore_commands  # noqa: F401 - lives beside the outputs it reads


def _outputs(stage: str, root: Path):
    from dpnrepro import dvc_graph

    try:
        return [out for out in dvc_graph.stage_outputs(stage, root) if not out.persist]
    except Exception:  # noqa: BLE001 - advice adds to an error being reported, never replaces it
        return None


def _relative(path: str | os.PathLike, root: Path) -> str:
    """``path`` (relative ones from the working directory) relative to ``root``."""
    return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(root))).as_posix()


def restore_command(path: str | os.PathLike, stage: str, root: str | os.PathLike | None = None) -> str:
    """The command (in backquotes) that puts the committed version of ``path`` (a file of stage ``stage``'s
    outputs, or an output itself) back, run from the project root ``root`` (``$DVC_ROOT`` or the working
    directory); the module docstring says which."""
    root = Path(root or os.environ.get("DVC_ROOT") or ".")
    rel = _relative(path, root)
    for out in _outputs(stage, root) or ():
        if rel == out.path or rel.startswith(out.path + "/"):
            return f"`dvc checkout --force {out.path}`" if out.cache else f"`git checkout -- {out.path}`"
    return f"`dvc repro --force --single-item {stage}`"


def restore_fix(path: str | os.PathLike, stage: str, root: str | os.PathLike | None = None) -> str:
    """``rerun `dvc repro <stage>` or restore it with <command>``: the end of an error about a damaged file."""
    return f"rerun `dvc repro {stage}` or restore it with {restore_command(path, stage, root)}"
