"""tools/lock_diff.py: the outputs whose hashes differ between two dvc.lock files."""

from __future__ import annotations

import subprocess
import sys

import yaml
from helpers import REPO


def _lock(path, **stages):
    path.write_text(yaml.safe_dump({"schema": "2.0", "stages": {
        name: {"cmd": "x", "deps": [{"path": "in", "md5": "dep-differs-" + name}],
               "outs": [{"path": p, "md5": h} for p, h in outs.items()]} for name, outs in stages.items()}}))
    return path


def _diff(a, b, *extra):
    return subprocess.run([sys.executable, str(REPO / "tools/lock_diff.py"), str(a), str(b), *extra],
                          capture_output=True, text=True)


def test_lists_each_output_whose_hash_differs_or_is_missing_and_ignores_deps(tmp_path):
    a = _lock(tmp_path / "a.lock", train={"runs/t": "1.dir", "metrics/t.json": "2"}, table={"reports/t.md": "3"})
    b = _lock(tmp_path / "b.lock", train={"runs/t": "9.dir", "metrics/t.json": "2"}, extra={"x": "4"})
    proc = _diff(a, b, "--json", str(tmp_path / "d.json"))
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == ["table reports/t.md: 3 != missing", "train runs/t: 1.dir != 9.dir",
                                        "extra x: missing != 4"]
    same = _diff(a, _lock(tmp_path / "c.lock", train={"runs/t": "1.dir", "metrics/t.json": "2"},
                          table={"reports/t.md": "3"}))
    assert same.returncode == 0 and same.stdout.strip() == "none: 3 outputs, every hash equal"
    assert _diff(a, tmp_path / "nope.lock").returncode == 2
