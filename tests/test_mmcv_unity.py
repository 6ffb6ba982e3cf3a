"""tools/mmcv_unity.py: mmcv's op wrappers compiled as a few units, each wrapper exactly once, nothing that could
leak a macro or a namespace into its neighbours merged (the real build and its ops' outputs:
benchmarks/measured/setup_*.json)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from helpers import REPO

TOOL = REPO / "tools/mmcv_unity.py"


@pytest.fixture
def sdist(tmp_path):
    """A stand-in mmcv source tree: 9 wrappers, the bindings, a wrapper with `using namespace`, one kernel."""
    folder = tmp_path / "mmcv-2.1.0/mmcv/ops/csrc/pytorch"
    (folder / "cpu").mkdir(parents=True)
    for k in range(9):
        (folder / f"op{k}.cpp").write_text(f'#include "pytorch_cpp_helper.hpp"\nvoid op{k}_impl() {{}}\n' + "//\n" * k)
    (folder / "pybind.cpp").write_text("void op0_impl();\n")
    (folder / "contour.cpp").write_text("#include <queue>\nusing namespace std;\nvoid contour() {}\n")
    (folder / "cpu/op0_cpu.cpp").write_text("void op0_cpu() {}\n")
    return tmp_path / "mmcv-2.1.0", folder


def _run(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_every_wrapper_is_compiled_once_in_a_unit_and_the_rest_alone(sdist):
    root, folder = sdist
    done = _run(root, "--groups", 4)
    assert done.returncode == 0, done.stderr
    compiled = sorted(p.name for p in folder.glob("*.cpp"))  # what setup.py's glob('pytorch/*.cpp') builds
    assert compiled == ["_pybind.cpp", "contour.cpp", "unity_0.cpp", "unity_1.cpp", "unity_2.cpp", "unity_3.cpp"]
    # setuptools compiles the sorted sources, ninja starts them in that order: the bindings (the longest unit) first,
    # before the kernels of pytorch/cpu/ as well
    assert sorted([str(folder / "contour.cpp"), str(folder / "cpu/op0_cpu.cpp"), str(folder / "_pybind.cpp")])[0] \
        == str(folder / "_pybind.cpp")
    assert (folder / "_pybind.cpp").read_text() == "void op0_impl();\n"  # the same code
    included = [m for k in range(4)
                for m in re.findall(r'^#include "(.+)"$', (folder / f"unity_{k}.cpp").read_text(), re.M)]
    assert sorted(included) == sorted(f"op{k}.cpp.inc" for k in range(9))  # each once, none lost
    assert all((folder / name).is_file() for name in included)
    assert (folder / "cpu/op0_cpu.cpp").is_file()  # kernels share helper names: never merged
    sizes = [sum((folder / m).stat().st_size for m in re.findall(r'"(.+)"', (folder / f"unity_{k}.cpp").read_text()))
             for k in range(4)]
    assert max(sizes) - min(sizes) <= max((folder / m).stat().st_size for m in included)  # balanced


def test_a_folder_that_is_not_an_mmcv_source_fails_in_one_line(tmp_path):
    done = _run(tmp_path)
    assert done.returncode != 0 and done.stderr.strip().count("\n") == 0
    assert "is not a folder" in done.stderr and "Traceback" not in done.stderr
