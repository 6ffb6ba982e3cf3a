"""``make repro``'s entry point: ``dvc repro`` (:mod:`dpnrepro.dvc_graph`), with a no-op that costs no DVC import.

Importing DVC and building its index of 38 stages takes seconds before it can say that nothing changed. After
a full ``dvc repro`` that ran nothing, this records a fingerprint of everything DVC read to say so
(:func:`fingerprint`: the DVC version, dvc.yaml, dvc.lock, the params files and every dep and output of every
stage, folders walked, by size, inode, mtime and ctime, as DVC's own state database keys file hashes) in
``.dvc/tmp/``. The next ``make repro`` with no arguments whose fingerprint is the same answers at once;
any edit, checkout, removal or DVC upgrade changes the fingerprint, and DVC decides again. Targets, ``-f``
and ``-s`` always go to DVC. A dvc.yaml this cannot read completely (``foreach``/``matrix``, a stage with no
deps or ``always_changed``) never takes the quick path.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

STAMP = Path(".dvc/tmp/dpnrepro-up-to-date.json")
UP_TO_DATE = "Data and pipelines are up to date. (nothing DVC reads has changed since it said so)"
# .dvcignore lines that keep DVC from reading every folder of a name: the walk skips those folders too
IGNORED_FOLDERS = {"**/__pycache__/": "__pycache__", "__pycache__/": "__pycache__", ".venv/": ".venv"}


def _path(entry) -> str:
    return next(iter(entry)) if isinstance(entry, dict) else str(entry)


def read_paths(root: Path = Path(".")) -> list[str] | None:
    """Every path ``dvc repro`` of root's dvc.yaml reads to decide: its files, params files, deps and outputs
    (metrics and plots included); None where dvc.yaml has a stage this does not model."""
    import yaml

    try:
        stages = (yaml.load((root / "dvc.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
                  or {}).get("stages") or {}
    except (OSError, yaml.YAMLError):
        return None
    paths = {"dvc.yaml", "dvc.lock", ".dvc/config", ".dvc/config.local", ".dvcignore", "params.yaml"}
    for body in stages.values():
        if not isinstance(body, dict) or not body.get("deps") or body.get("always_changed") \
                or {"foreach", "matrix", "do"} & body.keys():
            return None
        wdir = Path(body.get("wdir", "."))
        for key in ("deps", "outs", "metrics", "plots"):
            paths.update(os.path.normpath(wdir / _path(e)) for e in body.get(key) or [])
        for p in body.get("params") or []:
            if isinstance(p, dict):
                paths.update(os.path.normpath(wdir / f) for f in p)
            else:
                paths.add(os.path.normpath(wdir / "params.yaml"))
    return sorted(paths)


def fingerprint(root: Path = Path(".")) -> str | None:
    """sha256 of the DVC version and the stat (size, inode, mtime, ctime) of every path :func:`read_paths`
    names, folders walked; None where the quick path does not apply."""
    from importlib.metadata import PackageNotFoundError, version

    paths = read_paths(root)
    if paths is None:
        return None
    h = hashlib.sha256()
    try:
        h.update(f"dvc {version('dvc')}\n".encode())
    except PackageNotFoundError:
        return None

    def add(rel: str) -> None:
        try:
            st = os.stat(root / rel)
        except OSError:
            h.update(f"{rel} missing\n".encode())
            return
        h.update(f"{rel} {st.st_mode:o} {st.st_size} {st.st_ino} {st.st_mtime_ns} {st.st_ctime_ns}\n".encode())

    try:
        ignore = (root / ".dvcignore").read_text().split("\n")
    except OSError:
        ignore = []
    skipped = {IGNORED_FOLDERS[line.strip()] for line in ignore if line.strip() in IGNORED_FOLDERS}
    for rel in paths:
        add(rel)
        if (root / rel).is_dir():
            for folder, dirs, files in os.walk(root / rel):
                dirs[:] = sorted(d for d in dirs if d not in skipped)
                for name in sorted(dirs) + sorted(files):
                    add(os.path.relpath(os.path.join(folder, name), root))
    return h.hexdigest()


def main(argv: list[str] | None = None) -> None:
    """``dvc repro ARGS`` (:func:`dpnrepro.dvc_graph.main`); with no ARGS, the quick answer where it holds."""
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m dpnrepro.quick_repro", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="*", help="stages or dvc.yaml files, as `dvc repro` takes them")
    ap.add_argument("-f", "--force", action="store_true", help="as `dvc repro -f`")
    ap.add_argument("-s", "--single-item", action="store_true", help="as `dvc repro -s`")
    args = ap.parse_args(argv)
    argv = [*args.targets, *(["-f"] if args.force else []), *(["-s"] if args.single_item else [])]
    # only at the project's root (its .dvc/ beside dvc.yaml), where the stamp lives
    before = fingerprint() if not argv and STAMP.parent.parent.is_dir() else None
    if before is not None and STAMP.is_file():
        try:
            recorded = json.loads(STAMP.read_text()).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            recorded = None
        if recorded == before:
            print(UP_TO_DATE)
            return
    _forget()
    from dpnrepro import dvc_graph

    with tempfile.TemporaryDirectory(prefix="dpnrepro-repro-") as tmp:
        times = Path(tmp) / "times.json"
        dvc_graph.main(["repro", "--times", str(times), *argv])  # exits non-zero on a failure
        ran = json.loads(times.read_text()) if times.is_file() else None
    if before is not None and ran == {} and fingerprint() == before:
        try:  # a shortcut, never a failure: an unwritable .dvc/tmp only means DVC decides next time too
            STAMP.parent.mkdir(exist_ok=True)
            STAMP.write_text(json.dumps({"fingerprint": before}) + "\n")
        except OSError:
            _forget()


def _forget() -> None:
    try:
        STAMP.unlink(missing_ok=True)
    except OSError:
        pass


if __name__ == "__main__":
    main()
