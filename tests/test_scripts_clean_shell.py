"""Every script runs as its users run it: from a fresh shell (tests/helpers.clean_env: PATH with the venv
first, HOME, LANG; no CPU pins or thread settings inherited from this test process).

Found by globbing, so a new script is covered without editing this file: every ``tools/*.py``, every
``python -m dpnrepro.*`` module with a ``__main__`` block. Each must answer ``--help`` with exit 0 (one
test, whose failure lists every script with its exit code); a tiny real run follows wherever a cheap one
exists (the GPU check's dry run, ``benchmarks/measured/gpu_check.sh``, is tests/test_gpu_check.py's). Every stage and tool imports dpnrepro before
numpy, torch or cv2, so that none refuses for want of the CPU pins."""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from helpers import REPO, clean_env

TOOLS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tools").glob("*.py"))
MODULES = sorted(
    ".".join(p.relative_to(REPO / "src").with_suffix("").parts)
    for p in (REPO / "src" / "dpnrepro").rglob("*.py")
    if 'if __name__ == "__main__":' in p.read_text()
)


def _run(cmd: list[str], cwd: Path = REPO, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=timeout)


def test_the_globs_find_the_scripts():
    assert {"tools/gpu_check.py", "tools/photo_folder.py", "tools/gpu_carry.py", "tools/lock_diff.py"} <= set(TOOLS)
    assert "dpnrepro.pipeline" in MODULES and "dpnrepro.determinism.fingerprint" in MODULES


def test_every_script_answers_help_from_a_clean_shell():
    commands = {tool: [sys.executable, tool, "--help"] for tool in TOOLS}
    commands |= {f"python -m {mod}": [sys.executable, "-m", mod, "--help"] for mod in MODULES}
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = dict(zip(commands, pool.map(lambda cmd: _run(cmd, timeout=120), commands.values())))
    table = "\n".join(f"  {name}: exit {proc.returncode}" for name, proc in procs.items())
    failed = {name: proc for name, proc in procs.items() if proc.returncode != 0 or "usage" not in proc.stdout.lower()}
    assert not failed, f"--help from a clean shell:\n{table}\n" + "\n".join(
        f"--- {name}:\n{proc.stderr.strip()[-600:]}" for name, proc in failed.items())


def test_the_photo_folder_writes_jpegs_from_a_clean_shell(tmp_path):
    proc = _run([sys.executable, "tools/photo_folder.py", str(tmp_path / "photos"), "--train", "3", "--val", "1"])
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "photos").rglob("*.jpg"))) == 4


def test_lock_diff_and_set_params_run_from_a_clean_shell(tmp_path):
    same = _run([sys.executable, "tools/lock_diff.py", "dvc.lock", "dvc.lock"])
    assert same.returncode == 0, same.stderr
    params = tmp_path / "params.yaml"
    params.write_bytes((REPO / "params.yaml").read_bytes())
    edit = _run([sys.executable, "tools/set_params.py", "--file", str(params), "runtime.workers=3"])
    assert edit.returncode == 0, edit.stderr
    assert "workers: 3" in params.read_text()


def _imports_before_dpnrepro(path: Path) -> str:
    """The module-level imports of ``path`` that run before its first import of dpnrepro, as code."""
    tree = ast.parse(path.read_text())
    prefix = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(n.split(".")[0] == "dpnrepro" for n in names):
                break
            prefix.append(ast.get_source_segment(path.read_text(), node))
    return "\n".join(prefix)


def test_every_stage_and_tool_imports_dpnrepro_before_the_libraries_that_read_the_pins():
    """The test suite's worker scripts too. Else they would refuse to run (determinism.cpu.require_pins); only the imports before dpnrepro run here."""
    from dpnrepro.determinism.cpu import READS_AT_LOAD

    workers = [p for p in (REPO / "tests").glob("*.py") if 'if __name__ == "__main__":' in p.read_text()]
    files = sorted([*(REPO / "stages").glob("*.py"), *(REPO / "tools").glob("*.py"), *workers])
    probe = f"\nimport sys\nprint(' '.join(m for m in {READS_AT_LOAD!r} if m in sys.modules))"

    def early(path: Path) -> str:
        proc = _run([sys.executable, "-c", _imports_before_dpnrepro(path) + probe], cwd=path.parent, timeout=120)
        return proc.stdout.strip() if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"

    with ThreadPoolExecutor(max_workers=2) as pool:
        found = dict(zip((p.relative_to(REPO).as_posix() for p in files), pool.map(early, files)))
    assert not {name: libs for name, libs in found.items() if libs}, found
