"""The project files a script runs, found from its imports: the code deps of every DVC stage
(dpnrepro.pipeline writes them into dvc.yaml) and of the trainer's run fingerprint, from one place; and
the package's import graph (:func:`import_graph`, which tests/test_imports.py keeps free of circles)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "dpnrepro"


def _module_file(module: str, src: Path) -> Path | None:
    """The source file of a ``dpnrepro`` module (a package's ``__init__.py``) under ``src``, or None."""
    base = src.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under an ``if TYPE_CHECKING:`` block (imports for annotations, never executed)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def _import_targets(path: Path, src: Path, runtime_only: bool = False) -> set[str]:
    """The ``dpnrepro`` modules a file's import statements name, anywhere in it (inside functions too):
    ``import a.b`` names ``a.b``; ``from a import b`` names ``a.b`` when that is a module, else ``a``.
    ``runtime_only`` leaves out the imports under ``if TYPE_CHECKING:`` (code deps keep them: an edit
    there can change what the annotations name)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skipped = _type_checking_only(tree) if runtime_only else set()
    package = None
    if path.is_relative_to(src):
        parts = list(path.relative_to(src).with_suffix("").parts)
        package = ".".join(parts if parts[-1] == "__init__" else parts[:-1]).removesuffix(".__init__")
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import inside the package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base != PACKAGE and not base.startswith(PACKAGE + "."):
                continue
            names = [f"{base}.{a.name}" if _module_file(f"{base}.{a.name}", src) else base for a in node.names]
        else:
            continue
        found.update(name for name in names if name == PACKAGE or name.startswith(PACKAGE + "."))
    return found


def _imported_modules(path: Path, src: Path) -> set[str]:
    """Every ``dpnrepro`` module a file imports anywhere in it, with the packages that contain them."""
    found = set()
    for name in _import_targets(path, src):
        parts = name.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {m for m in found if _module_file(m, src) is not None}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the modules it imports at run time} of every module under ``src/dpnrepro``, imports inside
    functions included, those under ``if TYPE_CHECKING:`` left out. An edge is what an import statement names, not the parent packages Python initialises on
    the way (every module would otherwise import ``dpnrepro``, whose ``__init__`` imports ``models``)."""
    src = root / "src"
    graph = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[module] = {m for m in _import_targets(path, src, runtime_only=True) if m != module and _module_file(m, src)}
    return graph


@cache
def code_files(script: str, root: Path = ROOT) -> tuple[str, ...]:
    """The project files ``script`` (a path relative to the repository ``root``) runs: itself plus the
    transitive closure of its ``dpnrepro`` imports, as sorted repository-relative paths."""
    src = root / "src"
    todo, seen = [root / script], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(_module_file(m, src) for m in _imported_modules(path, src))
    return tuple(sorted(p.relative_to(root).as_posix() for p in seen))


def module_path(module: str, root: Path = ROOT) -> str:
    """The repository-relative file of a ``dpnrepro`` module (e.g. one a stage loads by name)."""
    path = _module_file(module, root / "src")
    if path is None:
        raise ValueError(f"no module {module!r} under {root / 'src'}")
    return path.relative_to(root).as_posix()


def code_deps(script: str, *loaded: str) -> tuple[str, ...]:
    """:func:`code_files` of ``script`` and of the files it ``loaded`` by name (importlib), with every package
    directory whose ``.py`` files are all in it written as the directory (shorter dvc.yaml, same meaning:
    DVC hashes the directory's files)."""
    files = {f for path in (script, *loaded) for f in code_files(path)}
    dirs = sorted({str(Path(f).parent) for f in files if f.startswith("src/")}, key=len)
    whole = []
    for d in dirs:
        if any(d.startswith(w + "/") for w in whole) or d == "src/dpnrepro":
            continue
        if all(p.relative_to(ROOT).as_posix() in files for p in (ROOT / d).rglob("*.py")):
            whole.append(d)
    kept = [f for f in files if not any(f.startswith(w + "/") for w in whole)]
    return tuple(sorted(kept + whole))
