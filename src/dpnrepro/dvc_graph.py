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

``dvc.api`` has none of this (it reads params, metrics and data, not stages), so this is the one module of
the project that uses DVC's internals: ``dvc.repo.Repo`` (``stage.collect``, ``index.graph``, ``reproduce``
with ``repro_fn=`` wrapping ``dvc.repo.reproduce._reproduce_stage``, ``status``), a stage's ``outs``
(``fs_path``, ``use_cache``, ``persist``, ``metric``, ``plot``) and ``dvc.logger.setup``. Elsewhere the project
uses ``dvc.api`` and ``dvc.exceptions`` only; ``tests/test_dvc_workflow.py`` pins these internals'
signatures and behaviour (and that no other module imports them), so a DVC upgrade that changes them fails
there first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import time
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
    with _working_directory(root), Repo(str(root), uninitialized=not (root / ".dvc").is_dir()) as repo:
        yield repo


@contextlib.contextmanager
def _working_directory(path: Path) -> Iterator[None]:
    """The working directory at ``path`` for the block, then back (``contextlib.chdir`` is Python 3.11+;
    pyproject allows 3.10)."""
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


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


def unwritable_output(stage, root_dir: str) -> str | None:
    """The first output folder of ``stage`` that DVC could not empty before running it (the folder holding an
    output, or a folder output itself, read-only or without write permission), as the one-line fault
    (errors.fault_message) naming it; None when every one is writable. DVC deletes outputs one by one, so a
    stage with one unwritable output would lose the others and then fail with no word on how."""
    import errno

    from dpnrepro.errors import fault_message

    for out in stage.outs:
        if out.persist:
            continue
        path = Path(out.fs_path)
        folders = [path] if path.is_dir() and not path.is_symlink() else []
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        for folder in [folder, *folders]:
            if not os.access(folder, os.W_OK):
                code = errno.EROFS if os.statvfs(folder).f_flag & os.ST_RDONLY else errno.EACCES
                rel = os.path.relpath(folder, root_dir)
                return fault_message(OSError(code, os.strerror(code), rel))
    return None


def reproduce(targets: Sequence[str] = (), root: Path | str = ".", record: Path | None = None,
              **options) -> dict[str, float]:
    """``Repo.reproduce(targets, **options)`` (``force``, ``single_item``, ``dry``, ...): the stages it ran, in
    order, each address with its wall time in seconds. With ``record``, that mapping is also written there
    (JSON) as each stage starts (``null``) and ends, so a run stopped midway still tells which stages it
    started. A failing stage is a UserError naming it."""
    from dvc.exceptions import DvcException
    from dvc.repo.reproduce import _reproduce_stage

    from dpnrepro.io import write_json_atomic

    ran: dict[str, float | None] = {}

    def timed(stage, **kwargs):
        name = address(stage, repo.root_dir)
        will_run = not kwargs.get("dry") and (  # as Stage.reproduce decides; an up-to-date stage is not checked
            kwargs.get("force") or stage.changed(kwargs.get("allow_missing", False), kwargs.get("upstream")))
        if will_run and (unwritable := unwritable_output(stage, repo.root_dir)) is not None:
            raise UserError(f"stage {name} not run, its outputs untouched: {unwritable}")
        ran[name], started = None, time.perf_counter()
        if record:
            write_json_atomic(record, ran)
        result = _reproduce_stage(stage, **kwargs)
        if result is None:
            del ran[name]  # up to date: skipped
        else:
            ran[name] = round(time.perf_counter() - started, 1)
        if record:
            write_json_atomic(record, ran)
        return result

    if record:
        write_json_atomic(record, ran)
    try:
        with open_repo(root) as repo:
            repo.reproduce(list(targets) or None, repro_fn=timed, **options)
    except DvcException as exc:
        cause = f": {exc.__cause__}" if exc.__cause__ else ""
        raise UserError(f"dvc repro {' '.join(targets)}: {exc}{cause}{_removed_hint(ran)}".replace("\n", " ")) \
            from None
    except (OSError, sqlite3.Error) as exc:  # DVC's own writes (its state database, a removal) failed
        from dpnrepro.errors import fault_message

        what = fault_message(exc) or f"DVC's {type(exc).__name__}: {exc} (a full disk or a file-size limit?)"
        raise UserError(f"dvc repro {' '.join(targets)}: {what}{_removed_hint(ran)}".replace("\n", " ")) from None
    return ran


def _removed_hint(ran: dict) -> str:
    """How to get back the outputs DVC removed before the stage that was running when it failed."""
    running = [name for name, seconds in ran.items() if seconds is None]
    ways = stage_restore_commands(running[-1]) if running else []
    return f" (dvc removed {running[-1]}'s previous outputs first; {' and '.join(ways)} restores them)" if ways else ""


def status(targets: Sequence[str] = (), root: Path | str = ".") -> dict[str, list]:
    """``Repo.status(targets)``: each stale stage's address and what changed (deps, outs, command, params),
    as ``dvc status --json`` lists them; empty when everything is up to date."""
    from dvc.exceptions import DvcException

    with open_repo(root) as repo:
        try:
            return dict(repo.status(list(targets) or None))
        except DvcException as exc:
            raise UserError(f"dvc status {' '.join(targets)}: {exc}".replace("\n", " ")) from None


def log_to_terminal() -> None:
    """DVC's own log (the stages it runs, its progress lines) on the terminal, as the ``dvc`` command shows it.
    Importing DVC already installs its handlers; a second ``setup()`` would print every line twice."""
    import logging

    from dvc.logger import setup

    if not logging.getLogger("dvc").handlers:
        setup()


def stage_restore_commands(stage: str, root: str | os.PathLike | None = None) -> list[str]:
    """The commands that put back every output DVC removes before running ``stage`` (persist ones aside):
    ``dvc checkout --force`` of the cached ones, ``git checkout --`` of the git-tracked ones."""
    try:
        outs = [o for o in stage_outputs(stage, Path(root or os.environ.get("DVC_ROOT") or ".")) if not o.persist]
    except Exception:  # noqa: BLE001 - advice adds to an error being reported, never replaces it
        outs = []
    cached, tracked = [o.path for o in outs if o.cache], [o.path for o in outs if not o.cache]
    return ([f"`dvc checkout --force {' '.join(cached)}`"] if cached else []) + \
        ([f"`git checkout -- {' '.join(tracked)}`"] if tracked else [])


def main(argv: list[str] | None = None) -> None:
    """``repro`` as ``dvc repro`` (DVC's own log on the terminal), the stages it ran and their seconds written as
    JSON (``--times``); ``status``: the stale stages as JSON on stdout."""
    ap = argparse.ArgumentParser(prog="python -m dpnrepro.dvc_graph", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("repro", help="dvc repro TARGETS; --times FILE: the stages run and their seconds (JSON)")
    r.add_argument("targets", nargs="*")
    r.add_argument("--times", type=Path, help="JSON file: each stage run, its seconds (null while it runs)")
    r.add_argument("-f", "--force", action="store_true")
    r.add_argument("-s", "--single-item", action="store_true")
    st = sub.add_parser("status", help="the stale stages of TARGETS and what changed, as JSON")
    st.add_argument("targets", nargs="*")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "repro":
            log_to_terminal()
            reproduce(args.targets, record=args.times, force=args.force, single_item=args.single_item)
        else:
            print(json.dumps(status(args.targets), indent=1))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print("interrupted; rerun to go on from the last completed stage", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
