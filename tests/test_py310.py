"""pyproject says ``requires-python >= 3.10``: no tracked Python file uses syntax or a standard-library name
that only 3.11+ has, unless guarded (inside ``if sys.version_info >= ...`` or a ``try`` that catches the
ImportError / AttributeError). A cheap stand-in for running the suite on 3.10."""

from __future__ import annotations

import ast
import subprocess

import pytest

from helpers import REPO

# module -> names it gained in 3.11 or later (the ones this code base could plausibly reach for)
NEW_NAMES = {
    "contextlib": {"chdir"},
    "hashlib": {"file_digest"},
    "datetime": {"UTC"},
    "typing": {"Self", "Never", "LiteralString", "assert_never", "assert_type", "reveal_type", "Required",
               "NotRequired", "TypeVarTuple", "Unpack", "dataclass_transform", "override"},
    "enum": {"StrEnum", "verify", "member", "nonmember", "global_enum", "EnumCheck", "ReprEnum"},
    "asyncio": {"TaskGroup", "timeout", "Runner"},
    "logging": {"getLevelNamesMapping"},
    "math": {"exp2", "cbrt"},
    "operator": {"call"},
    "re": {"NOFLAG"},
    "itertools": {"batched"},
}
NEW_MODULES = {"tomllib", "wsgiref.types"}
NEW_BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}
GUARD_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError", "NameError"}


def _tracked_python() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [p for p in out.split() if (REPO / p).is_file()]


def _guarded(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node, child = parents[node], node
        if isinstance(node, ast.If) and "version_info" in ast.unparse(node.test):
            return True
        if isinstance(node, ast.Try) and child in node.body:
            caught = {n.id for h in node.handlers if h.type is not None for n in ast.walk(h.type)
                      if isinstance(n, ast.Name)}
            if caught & GUARD_ERRORS:
                return True
    return False


def uses_of_newer_python(source: str) -> list[str]:
    """``line: what`` of each unguarded 3.11+ syntax or standard-library name in ``source``."""
    try:
        tree = ast.parse(source, feature_version=(3, 10))
    except SyntaxError as exc:
        return [f"{exc.lineno}: syntax 3.10 cannot parse ({exc.msg})"]
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    imported = {}  # local name -> module, for `import contextlib as cl`
    hits = []
    for node in ast.walk(tree):
        found = None
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported[alias.asname or alias.name] = alias.name
                if alias.name in NEW_MODULES:
                    found = f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in NEW_MODULES:
                found = f"from {node.module} import ..."
            new = {a.name for a in node.names} & NEW_NAMES.get(node.module, set())
            if new:
                found = f"from {node.module} import {', '.join(sorted(new))}"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = imported.get(node.value.id, node.value.id)
            if node.attr in NEW_NAMES.get(module, set()):
                found = f"{module}.{node.attr}"
        elif isinstance(node, ast.Name) and node.id in NEW_BUILTINS:
            found = node.id
        if found and not _guarded(node, parents):
            hits.append(f"{node.lineno}: {found}")
    return hits


@pytest.mark.parametrize("source, hit", [
    ("import contextlib\nwith contextlib.chdir('.'):\n    pass\n", "contextlib.chdir"),
    ("import hashlib\nhashlib.file_digest(f, 'sha256')\n", "hashlib.file_digest"),
    ("import tomllib\n", "import tomllib"),
    ("from typing import Self\n", "from typing import Self"),
    ("from datetime import UTC\n", "from datetime import UTC"),
    ("raise ExceptionGroup('x', [])\n", "ExceptionGroup"),
    ("try:\n    pass\nexcept* ValueError:\n    pass\n", "syntax 3.10 cannot parse"),
])
def test_the_scan_finds_each_kind_of_newer_python(source, hit):
    assert any(hit in h for h in uses_of_newer_python(source)), uses_of_newer_python(source)


def test_guarded_uses_are_allowed():
    guarded = ("import sys, hashlib\n"
               "if sys.version_info >= (3, 11):\n    d = hashlib.file_digest(f, 'sha256')\n"
               "try:\n    import tomllib\nexcept ModuleNotFoundError:\n    tomllib = None\n")
    assert uses_of_newer_python(guarded) == []


def test_no_tracked_python_file_needs_python_311():
    hits = {path: found for path in _tracked_python()
            if (found := uses_of_newer_python((REPO / path).read_text(encoding="utf-8")))}
    assert not hits, f"3.11+ only (pyproject: requires-python >= 3.10): {hits}"
