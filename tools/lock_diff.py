"""The outputs whose hashes differ between two dvc.lock files (two runs of the same pipeline).

    python tools/lock_diff.py A/dvc.lock B/dvc.lock [--json FILE]

Prints one line per output (outs, metrics, plots of every stage) whose md5 differs or that only one lock
records, ``stage path: <md5 in A> != <md5 in B>``, or ``none`` with the number of outputs compared. Exit 0
when every output matches, 1 when some differ, 2 on an unreadable lock.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml


def output_hashes(lock: dict) -> dict[tuple[str, str], str | None]:
    """{(stage, output path): md5} of every output of every stage of a parsed dvc.lock."""
    return {(stage, out["path"]): out.get("md5") for stage, body in (lock.get("stages") or {}).items()
            for out in body.get("outs", [])}


def differing(a: dict, b: dict) -> list[dict]:
    """The outputs of two parsed locks whose hashes differ (``None``: the lock lacks that output)."""
    ha, hb = output_hashes(a), output_hashes(b)
    keys = [*ha, *(k for k in hb if k not in ha)]
    return [{"stage": s, "path": p, "a": ha.get((s, p)), "b": hb.get((s, p))} for s, p in keys
            if ha.get((s, p)) != hb.get((s, p))]


def _load(path: Path) -> dict:
    try:
        return yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        print(f"lock_diff: cannot read {path}: {exc}".splitlines()[0], file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--json", type=Path, help="also write {compared, differ: [...]} here")
    args = ap.parse_args(argv)
    a, b = _load(args.a), _load(args.b)
    diff = differing(a, b)
    compared = len(set(output_hashes(a)) | set(output_hashes(b)))
    for d in diff:
        print(f"{d['stage']} {d['path']}: {d['a'] or 'missing'} != {d['b'] or 'missing'}")
    if not diff:
        print(f"none: {compared} outputs, every hash equal")
    if args.json:
        args.json.write_text(json.dumps({"a": str(args.a), "b": str(args.b), "compared": compared, "differ": diff},
                                        indent=1) + "\n")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
