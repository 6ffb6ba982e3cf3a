"""The DVC pipelines as data, from DVC's Python API (``dvc.repo.Repo``), never from its printed text.

Three questions, for the stages of every ``dvc.yaml`` in the project (``dvc.yaml``, ``study/dvc.yaml``,
``benchmarks/dvc.yaml``), each stage addressed as ``dvc repro`` takes it from the project's root
(``name`` in the root's dvc.yaml, ``study/dvc.yaml:name`` elsewhere):

- :func:`stage_outputs`: a stage's outputs, paths relative to the root (``wdir`` resolved), with their
  cache / persist / metric / plot flags;
- :func:`upstream_stages`: the stages it depends on, directly or not;
- :func:`reproduce` / :func:`status`: what ``reproduce()`` ran, and what ``status()`` says is stale.

Reading (outputs, upstream stages) takes no repository lock, so a stage can ask about itself while
``dvc repro`` holds the lock (cli.restore_hint). ``dvc`` is imported on first use, not with this module.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dpnrepro.errors import UserError

PROJECT_FILE = "dvc.yaml"


@dataclass(frozen=True)
class Output:
    """One output of a stage: its path relative to the project root and DVC's flags for it."""

    path: str
    cache: bool
    persist: bool
    metric: bool
    plot: bool


@contextlib.contextmanager
def open_repo(root: Path | str = ".") -> Iterator:
    """``dvc.repo.Repo`` of the project at ``root``, with the working directory at its root (DVC resolves
    targets and names stages relative to the working directory). A folder without ``.dvc`` is read as an
    uninitialised project (its dvc.yaml files still parse)."""
    from dvc.repo import Repo

    root = Path(root).resolve()
    with contextlib.chdir(root), Repo(str(root), uninitialized=not (root / ".dvc").is_dir()) as repo:
        yield repo


def address(stage, root_dir: str) -> str:
    """How ``dvc repro`` at ``root_dir`` names ``stage``: ``name``, ``sub/dvc.yaml:name``, or a ``.dvc`` file."""
    rel = Path(os.path.relpath(stage.path, root_dir)).as_posix()
    name = getattr(stage, "name", None)
    return rel if not name else name if rel == PROJECT_FILE else f"{rel}:{name}"


def _stage(repo, name: str):
    """The stage ``name`` addresses (see the module docstring); UserError when there is none."""
    from dvc.exceptions import DvcException

    try:
        stages = repo.stage.collect(name)
    except DvcException as exc:
        raise UserError(f"no stage {name!r} in this project's dvc.yaml files ({exc})") from None
    if len(stages) != 1:
        raise UserError(f"{name!r} names {len(stages)} stages, not one")
    return stages[0]


def stage_outputs(name: str, root: Path | str = ".") -> list[Output]:
    """The outputs (``outs``, ``metrics``, ``plots``) of stage ``name``, in dvc.yaml's order."""
    with open_repo(root) as repo:
        stage = _stage(repo, name)
        return [Output(path=Path(os.path.relpath(out.fs_path, repo.root_dir)).as_posix(), cache=bool(out.use_cache),
                       persist=bool(out.persist), metric=bool(out.metric), plot=bool(out.plot))
                for out in stage.outs]


def upstream_stages(names: Sequence[str], root: Path | str = ".") -> list[str]:
    """Every stage that ``names`` depend on, directly or not, dependencies first, from DVC's own stage
    graph (a dependency inside or above another stage's output is an edge); ``names`` themselves excluded
    unless one depends on another."""
    import networkx as nx

    with open_repo(root) as repo:
        graph = repo.index.graph  # an edge goes from a stage to a stage it depends on
        targets = [_stage(repo, name) for name in names]
        up = set().union(*(nx.descendants(graph, stage) for stage in targets))
        order: list[str] = []
        for stage in targets:
            order += [address(node, repo.root_dir) for node in nx.dfs_postorder_nodes(graph, stage)
                      if node in up and address(node, repo.root_dir) not in order]
        return order


def reproduce(targets: Sequence[str] = (), root: Path | str = ".", **options) -> list[str]:
    """``Repo.reproduce(targets, **options)`` (``force``, ``single_item``, ``dry``, ...): the addresses of the
    stages it ran, in order. A stage that fails is a UserError naming it."""
    from dvc.exceptions import DvcException

    with open_repo(root) as repo:
        try:
            ran = repo.reproduce(list(targets) or None, **options)
        except DvcException as exc:
            cause = f": {exc.__cause__}" if exc.__cause__ else ""
            raise UserError(f"dvc repro {' '.join(targets)}: {exc}{cause}".replace("\n", " ")) from None
        return [address(stage, repo.root_dir) for stage in ran]


def status(targets: Sequence[str] = (), root: Path | str = ".") -> dict[str, list]:
    """``Repo.status(targets)``: each stale stage's address and what changed (deps, outs, command, params),
    as ``dvc status --json`` lists them; empty when everything is up to date."""
    with open_repo(root) as repo:
        return dict(repo.status(list(targets) or None))
