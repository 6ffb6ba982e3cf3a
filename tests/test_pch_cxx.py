"""tools/pch_cxx.sh, the C++ compiler of mmcv's build: each unit gets torch's tensor headers precompiled once,
with its own compile's flags; everything else reaches the real compiler unchanged. The real build (objects
byte-identical with and without it): docs/pins.md."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess

import pytest

from helpers import REPO

TOOL = REPO / "tools/pch_cxx.sh"
# What torch's ninja rule runs for one unit: `$cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags`, where
# cflags itself ends in -c.
FLAGS = ["-DNDEBUG", "-O3", "-fPIC", "-I/inc/common", "-I/torch/include"]
POST = ["-std=c++20", "-DTORCH_EXTENSION_NAME=_ext"]


def _unit(src: str, out: str) -> list[str]:
    return ["-MMD", "-MF", f"{out}.d", *FLAGS, "-c", "-c", src, "-o", out, *POST]


@pytest.fixture
def compiler(tmp_path):
    """A stand-in compiler that logs each call's arguments and writes its -o file (it fails on a header when
    FAIL_HEADER is set); returns (env, calls)."""
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "fake-c++"
    fake.write_text(
        '#!/usr/bin/env python3\n'
        'import json, os, sys\n'
        'args = sys.argv[1:]\n'
        'open(os.environ["CALLS"], "a").write(json.dumps(args) + "\\n")\n'
        'if os.environ.get("FAIL_HEADER") and "c++-header" in args: sys.exit(1)\n'
        'if "-o" in args: open(args[args.index("-o") + 1], "w").write("object")\n')
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "PCH_REAL_CXX": str(fake), "PCH_DIR": str(tmp_path / "pch"), "CALLS": str(log)}

    def calls() -> list[list[str]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return env, calls


def _cxx(env: dict, args: list[str], **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(TOOL), *args], env={**env, **extra}, capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(env["PCH_DIR"]))  # the test's folder: relative -o there


def test_the_first_unit_builds_the_header_with_its_own_flags_and_every_unit_includes_it(compiler, tmp_path):
    env, calls = compiler
    header = f"{env['PCH_DIR']}/torch_types.hpp"
    assert _cxx(env, _unit("/src/cpu/nms.cpp", str(tmp_path / "nms.o"))).returncode == 0
    assert _cxx(env, _unit("/src/unity_0.cpp", str(tmp_path / "unity_0.o"))).returncode == 0
    build, nms, unity = calls()
    assert build == [*FLAGS, *POST, "-x", "c++-header", header, "-o", f"{header}.gch.partial"]
    assert nms == ["-MMD", "-MF", f"{tmp_path}/nms.o.d", "-include", header, *FLAGS, *POST,
                   "-c", "/src/cpu/nms.cpp", "-o", f"{tmp_path}/nms.o"]
    assert unity[:5] == ["-MMD", "-MF", f"{tmp_path}/unity_0.o.d", "-include", header]  # built once
    assert "#include <torch/types.h>" in open(header).read()


@pytest.mark.parametrize("args", [
    ["-v"],  # the compiler checks of setuptools and torch
    _unit("/src/pybind.cpp", "pybind.o"),  # its object differs with <torch/types.h> first
    _unit("/src/_pybind.cpp", "_pybind.o"),  # the same, renamed to compile first (tools/mmcv_unity.py)
    ["-shared", "a.o", "b.o", "-o", "_ext.so", "-L/torch/lib", "-lc10"],  # the link
], ids=["version", "pybind", "pybind renamed", "link"])
def test_other_calls_reach_the_compiler_unchanged(compiler, args):
    env, calls = compiler
    assert _cxx(env, args).returncode == 0
    assert calls() == [args]


def test_a_header_that_cannot_be_built_leaves_every_unit_as_it_is(compiler, tmp_path):
    env, calls = compiler
    first, second = _unit("/src/a.cpp", str(tmp_path / "a.o")), _unit("/src/b.cpp", str(tmp_path / "b.o"))
    assert _cxx(env, first, FAIL_HEADER="1").returncode == 0
    assert _cxx(env, second).returncode == 0
    assert calls()[1:] == [first, second]  # after the failed header build: as called, and never tried again


def test_a_unit_that_finds_the_header_being_built_compiles_as_it_is(compiler, tmp_path):
    env, calls = compiler
    os.makedirs(env["PCH_DIR"])
    with open(f"{env['PCH_DIR']}/.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another compile is building it
        unit = _unit("/src/a.cpp", str(tmp_path / "a.o"))
        assert _cxx(env, unit).returncode == 0
    assert calls() == [unit]


def test_naming_itself_as_the_real_compiler_is_one_error_line(compiler):
    env, _ = compiler
    done = _cxx(env, ["-v"], PCH_REAL_CXX=str(TOOL))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "PCH_REAL_CXX" in done.stderr
