"""tools/setup_env.sh (`make env`) chooses its installer, falls back and keeps its stamp as it says: run on a copy
of the repository's set-up files with a stand-in venv whose ``python`` and ``uv`` only record what they are asked
(a real install takes minutes; benchmarks/measured/setup_*.json times one)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import REPO

PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$FAKE_LOG"
case "$1 $2 $3" in
  "-m pip config") echo "global.extra-index-url='file:///mirror/a file:///mirror/b'"; echo ":env:.find-links='/wheels'"
    [ -z "${FAKE_PIP_CERT:-}" ] || echo "global.cert='$FAKE_PIP_CERT'"; exit 0;;
  "-m pip install")
    if [ "$5" = --target ]; then  # the uv bootstrap
      [ -n "${FAKE_UV:-}" ] || exit 1
      mkdir -p "$6/bin" && cp "$FAKE_UV" "$6/bin/uv"
    fi
    exit 0;;
  "-m pip download") exit 1;;  # no network: an mmcv build fails
  "-m pip wheel")  # mmcv's build: record its compile flags, leave a wheel in -w DIR
    echo "CFLAGS=$CFLAGS" >> "$FAKE_LOG"
    echo "CXX=$CXX PCH_REAL_CXX=$PCH_REAL_CXX" >> "$FAKE_LOG"
    while [ $# -gt 0 ]; do [ "$1" = -w ] && { mkdir -p "$2"; touch "$2/mmcv-2.1.0-cp311-cp311-linux_x86_64.whl"; }; shift; done
    exit 0;;
esac
if [ "$1" = -c ]; then
  case "$2" in
    *"import mmcv, mmcv.ops; assert"*) [ -z "${FAKE_NO_MMCV:-}" ] || exit 1;;
    *"import sys, torch"*) echo "2.14.1 cp311";;
    *sysconfig*) echo "-Wsign-compare -DNDEBUG -g -fwrapv -O3 -Wall";;
    *print*) echo "torch 2.14.1 (stand-in)";;
  esac
fi
exit 0
"""

UV = """#!/usr/bin/env bash
[ "$1" = --version ] && { echo "uv 0.13.9"; exit 0; }
echo "uv $*" >> "$FAKE_LOG"
echo "uv-env SSL_CERT_FILE=${SSL_CERT_FILE:-}" >> "$FAKE_LOG"
case "$*" in *"${FAKE_UV_FAILS:-no such step}"*) exit 1;; esac
exit 0
"""


@pytest.fixture
def scratch(tmp_path):
    """A copy of the set-up files, a stand-in venv and the stand-in uv; returns (root, env, log)."""
    root = tmp_path / "repo"
    for rel in ("tools/setup_env.sh", "tools/build_mmcv.sh", "tools/mmcv_unity.py", "tools/pch_cxx.sh",
                "pyproject.toml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, root / rel)
    shutil.copytree(REPO / "requirements", root / "requirements")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for path, text in ((venv / "bin/python", PYTHON), (tmp_path / "uv", UV)):
        path.write_text(text)
        path.chmod(0o755)
    log = tmp_path / "calls.log"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DPNREPRO_", "FAKE_", "VIRTUAL_ENV")) and k != "SSL_CERT_FILE"}
    env.update(VENV=str(venv), FAKE_LOG=str(log), FAKE_UV=str(tmp_path / "uv"),
               DPNREPRO_WHEEL_CACHE=str(tmp_path / "wheels"))
    if not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").is_file() \
            or not Path("/usr/share/wordnet/data.noun").is_file():
        pytest.skip("the Debian data packages are not installed (make env installs them)")
    return root, env, log


def setup(root: Path, env: dict, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(root / "tools/setup_env.sh")], env=dict(env, **extra), capture_output=True,
                          text=True, timeout=120)


STEPS = {"setuptools wheel": "tools", "requirements/torch.txt": "torch", "requirements/base.txt": "pins",
         "requirements/data-nodeps.txt": "data", "-e .": "editable"}


def installs(log: Path) -> list[str]:
    """The install steps recorded, in order, as "<uv|pip> <step>"."""
    out = []
    for line in log.read_text().splitlines():
        tool = "uv" if line.startswith("uv pip install") else "pip" if line.startswith("python -m pip install") else ""
        if tool and "--target" not in line:
            out += [f"{tool} {step}" for needle, step in STEPS.items() if needle in line]
    return out


def test_uv_installs_every_step_with_pip_s_sources_and_the_lock(scratch):
    root, env, log = scratch
    done = setup(root, env)
    assert done.returncode == 0, done.stderr
    uv_calls = [line for line in log.read_text().splitlines() if line.startswith("uv pip install")]
    assert len(uv_calls) == 5, uv_calls  # tools, torch, pins, data wheels, editable
    assert installs(log) == ["uv tools", "uv torch", "uv pins", "uv data", "uv editable"], installs(log)
    for call in uv_calls:  # the same sources pip is configured with, pip's choice among them
        assert ("--index-strategy unsafe-best-match --extra-index-url file:///mirror/a --extra-index-url "
                "file:///mirror/b --find-links /wheels") in call, call
    assert [c for c in uv_calls if "-c requirements/constraints.txt" in c] == uv_calls[:3]
    assert "[setup] done with uv 0.13.9" in done.stdout
    assert (Path(env["VENV"]) / ".dpnrepro-installed").read_text().splitlines()[1] == "uv 0.13.9"
    for step in ("tools (uv)", "torch (uv)", "pins (uv)", "data wheels (uv)", "editable (uv)", "bytecode", "mmcv wait"):
        assert f"[setup] {step}: " in done.stdout, step
    calls = log.read_text().splitlines()
    compiles = [i for i, line in enumerate(calls) if line.startswith("python -m compileall")]
    editable = next(i for i, line in enumerate(calls) if line.startswith("uv pip install") and "-e ." in line)
    assert len(compiles) == 1 and compiles[0] > editable, calls  # once, after the last install uv makes
    assert calls[compiles[0]].endswith(" src") and "-x /tests?/" in calls[compiles[0]], calls[compiles[0]]


def test_uv_trusts_the_ca_bundle_pip_is_configured_with(scratch):
    """Behind a TLS-intercepting proxy pip is given its CA bundle (`cert`); uv, which reads no pip configuration,
    refused every https index as an unknown issuer and the whole set-up fell back to pip."""
    root, env, log = scratch
    done = setup(root, env, FAKE_PIP_CERT="/etc/proxy-ca.crt")
    assert done.returncode == 0, done.stderr
    seen = {line for line in log.read_text().splitlines() if line.startswith("uv-env ")}
    assert seen == {"uv-env SSL_CERT_FILE=/etc/proxy-ca.crt"}, seen
    assert installs(log)[0] == "uv tools"
    log.unlink()
    (Path(env["VENV"]) / ".dpnrepro-installed").unlink()  # install again
    done = setup(root, env, FAKE_PIP_CERT="/etc/proxy-ca.crt", SSL_CERT_FILE="/etc/own.crt")  # the user's own wins
    assert {line for line in log.read_text().splitlines() if line.startswith("uv-env ")} == {
        "uv-env SSL_CERT_FILE=/etc/own.crt"}


def test_pip_installs_the_same_steps_where_uv_cannot_be_had(scratch):
    root, env, log = scratch
    env.pop("FAKE_UV")
    done = setup(root, env)
    assert done.returncode == 0, done.stderr
    assert "uv could not be installed; pip installs instead" in done.stdout
    assert installs(log) == ["pip tools", "pip torch", "pip pins", "pip data", "pip editable"], installs(log)
    assert "[setup] done with pip" in done.stdout


def test_the_pip_installer_asked_for_is_used_without_uv(scratch):
    root, env, log = scratch
    done = setup(root, env, DPNREPRO_INSTALLER="pip")
    assert done.returncode == 0, done.stderr
    assert installs(log) == ["pip tools", "pip torch", "pip pins", "pip data", "pip editable"], installs(log)
    assert "--target" not in log.read_text() and "[setup] done with pip" in done.stdout


def test_a_failing_uv_step_is_redone_by_pip_and_pip_finishes(scratch):
    root, env, log = scratch
    done = setup(root, env, FAKE_UV_FAILS="requirements/base.txt")
    assert done.returncode == 0, done.stderr
    assert "uv failed on pins; pip installs from here on" in done.stdout
    assert installs(log) == ["uv tools", "uv torch", "uv pins", "pip pins", "pip data", "pip editable"], installs(log)
    assert "[setup] done with pip" in done.stdout


def test_the_second_run_only_checks_and_a_changed_pin_reinstalls(scratch):
    root, env, log = scratch
    assert setup(root, env).returncode == 0
    log.unlink()
    again = setup(root, env)
    assert again.returncode == 0 and "environment up to date" in again.stdout and "installed with uv 0.13.9" in again.stdout
    assert not log.exists() or not installs(log)
    assert "compileall" not in (log.read_text() if log.exists() else "")  # compiled at install: not again
    base = root / "requirements/base.txt"
    base.write_text(base.read_text() + "# a changed pin\n")
    changed = setup(root, env)
    assert changed.returncode == 0 and "up to date" not in changed.stdout and len(installs(log)) == 5


def test_an_unknown_installer_and_a_failed_mmcv_build_are_one_error_line_and_no_stamp(scratch):
    root, env, _ = scratch
    stamp = Path(env["VENV"]) / ".dpnrepro-installed"
    bad = setup(root, env, DPNREPRO_INSTALLER="conda")
    assert bad.returncode == 2 and bad.stderr == "error: DPNREPRO_INSTALLER=conda: use uv or pip\n", bad
    failed = setup(root, env, FAKE_NO_MMCV="1")
    assert failed.returncode == 1, failed
    assert failed.stderr.splitlines()[-1].startswith("error: building mmcv failed (log: "), failed.stderr
    assert not stamp.exists()  # the next `make env` tries again


def _pins(path: Path) -> dict[str, str]:
    import re

    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, _, version in
            (line.split("#")[0].strip().partition("==") for line in path.read_text().splitlines()) if version}


def test_the_lock_holds_every_direct_pin_at_its_version_and_the_installers():
    lock = _pins(REPO / "requirements/constraints.txt")
    for rel in ("requirements/base.txt", "requirements/data-nodeps.txt"):
        pins = _pins(REPO / rel)
        assert pins and {n: v for n, v in pins.items() if lock.get(n) != v} == {}, rel
    assert {"uv", "pip", "setuptools", "wheel", "triton", "nvidia-cudnn-cu13"} <= lock.keys()
    assert not {"torch", "torchvision", "mmcv"} & lock.keys()  # requirements/torch.txt, tools/build_mmcv.sh


def test_mmcv_builds_with_python_s_flags_less_debug_information_into_the_cache(scratch, tmp_path):
    root, env, log = scratch
    src = tmp_path / "src/mmcv-2.1.0"
    src.mkdir(parents=True)
    (src / "setup.py").write_text("extra_compile_args = ['-std=c++14']\n")
    sdist = tmp_path / "mmcv-2.1.0.tar.gz"
    subprocess.run(["tar", "-czf", str(sdist), "-C", str(tmp_path / "src"), "mmcv-2.1.0"], check=True)
    build = subprocess.run(["bash", str(root / "tools/build_mmcv.sh"), "--wheel-only"], capture_output=True, text=True,
                           env=dict(env, PY=str(Path(env["VENV"]) / "bin/python"), FAKE_NO_MMCV="1",
                                    MMCV_SDIST=str(sdist)), timeout=60)
    assert build.returncode == 0, build
    flags = [line for line in log.read_text().splitlines() if line.startswith("CFLAGS=")]
    assert flags == ["CFLAGS=-Wsign-compare -DNDEBUG -g -fwrapv -O3 -Wall -g0"], flags  # -O3 kept, -g0 last
    # the compiler: tools/pch_cxx.sh (torch's headers precompiled once) in front of the one CXX names, else c++
    assert f"CXX={root}/tools/pch_cxx.sh PCH_REAL_CXX=c++" in log.read_text().splitlines()
    calls = log.read_text().splitlines()
    unity = [i for i, line in enumerate(calls) if line.startswith(f"python {root}/tools/mmcv_unity.py ")]
    assert unity and unity[0] < calls.index(flags[0]), calls  # the wrappers are grouped before the compile
    cached = sorted(p.name for p in (Path(env["DPNREPRO_WHEEL_CACHE"]) / "mmcv-2.1.0-torch2.14.1").iterdir())
    assert cached == ["mmcv-2.1.0-cp311-cp311-linux_x86_64.whl"], cached  # no partial copy left
    assert "python -m pip install" not in log.read_text()  # --wheel-only installs nothing


CANDIDATE = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$FAKE_LOG"
case "$1" in
  --version) echo "Python 3.11.0";;
  -c) [ "$(basename "$0")" != no-headers ];;  # the check: ensurepip and Python.h
  -m) mkdir -p "$3/bin" && cp "$STAND_IN" "$3/bin/python";;  # -m venv DIR: the stand-in venv
esac
"""


def test_a_new_venv_takes_the_first_interpreter_that_can_make_it_and_build_mmcv(scratch, tmp_path):
    """The distribution's Python (PGO + LTO) is tried first, but only where it can make a venv and compile mmcv;
    $PYTHON, where set, is taken as it is."""
    root, env, log = scratch
    stand_in = tmp_path / "stand-in"
    shutil.move(Path(env["VENV"]) / "bin/python", stand_in)
    shutil.rmtree(env["VENV"])
    pythons = []
    for name in ("missing", "no-headers", "good", "later"):
        pythons.append(tmp_path / "bin" / name)
        if name != "missing":
            pythons[-1].parent.mkdir(exist_ok=True)
            pythons[-1].write_text(CANDIDATE)
            pythons[-1].chmod(0o755)
    env.update(STAND_IN=str(stand_in), DPNREPRO_PYTHONS=" ".join(map(str, pythons)))
    done = setup(root, env)
    assert done.returncode == 0, done.stderr
    assert f"[setup] creating {env['VENV']} with Python 3.11.0 ({pythons[2]})" in done.stdout, done.stdout
    made = [line.split()[0] for line in log.read_text().splitlines() if " -m venv " in line]
    assert made == ["good"], log.read_text()
    shutil.rmtree(env["VENV"])
    done = setup(root, env, PYTHON=str(pythons[3]))
    assert done.returncode == 0 and f"Python 3.11.0 ({pythons[3]})" in done.stdout, done.stdout


def test_a_venv_installed_before_the_set_up_compiled_bytecode_is_compiled_once(scratch):
    """uv writes no .pyc and PYTHONDONTWRITEBYTECODE=1 (this project's machines set it) keeps imports from
    writing them: a venv set up before the bytecode step gets it from the next `make env`, once."""
    root, env, log = scratch
    assert setup(root, env).returncode == 0
    (Path(env["VENV"]) / ".dpnrepro-bytecode").unlink()  # as a venv of the previous set-up has it
    log.unlink()
    first = setup(root, env)
    assert first.returncode == 0 and "environment up to date" in first.stdout and "[setup] bytecode: " in first.stdout
    assert not installs(log) and sum(line.startswith("python -m compileall") for line in log.read_text().splitlines()) == 1
    log.unlink()
    second = setup(root, env)
    assert "[setup] bytecode" not in second.stdout and (not log.exists() or "compileall" not in log.read_text())
