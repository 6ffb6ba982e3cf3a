"""The CPU pins cannot be silently off: a library loaded before dpnrepro, or an inherited value that
differs from the pinned one, stops the process in one line (exit 2); the label says what the libraries
report they run."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import stage_env

from dpnrepro.determinism.cpu import INSTRUCTION_SET_ENV, KERNELS_ENV


def _python(code: str, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in stage_env().items() if k not in INSTRUCTION_SET_ENV and k != KERNELS_ENV}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True)


@pytest.mark.parametrize("first", ["numpy", "torch", "cv2"])
def test_importing_dpnrepro_after_a_library_that_reads_the_pins_is_refused(first):
    proc = _python(f"import {first}; import dpnrepro")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and f"{first} loaded before dpnrepro" in proc.stderr


def test_a_library_loaded_first_is_fine_when_the_environment_holds_the_pins():
    proc = _python("import numpy, dpnrepro", **INSTRUCTION_SET_ENV)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("key, value", [("OMP_DYNAMIC", "TRUE"), ("OPENBLAS_CORETYPE", "SkylakeX"),
                                        ("NPY_DISABLE_CPU_FEATURES", ""), ("MKL_CBWR", "AUTO")])
def test_an_inherited_value_that_differs_is_refused(key, value):
    proc = _python("import dpnrepro", **{key: value})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and f"{key}={value!r}" in proc.stderr and KERNELS_ENV in proc.stderr


def test_the_same_value_in_another_case_is_accepted():
    assert _python("import dpnrepro", OMP_DYNAMIC="false").returncode == 0


def test_native_opts_out_and_the_label_says_so():
    proc = _python("import numpy, dpnrepro; from dpnrepro.determinism.cpu import describe; print(describe())",
                   OMP_DYNAMIC="TRUE", **{KERNELS_ENV: "native"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("native kernels (this machine only)")


def test_the_label_is_what_the_libraries_report():
    """Under the pins the label names MKL's and NumPy's choices as read back; with MKL's branch set otherwise
    (the environment taken as set), the label shows that branch, not the pinned one."""
    code = "import dpnrepro; from dpnrepro.determinism.cpu import describe, pin_threads; pin_threads(); print(describe())"
    pinned = _python(code)
    assert pinned.returncode == 0, pinned.stderr
    assert "ATen AVX2, MKL COMPATIBLE,STRICT, NumPy X86_V3, OpenBLAS Haswell, convolutions im2col, " in pinned.stdout
    other = _python(code, **{**INSTRUCTION_SET_ENV, "MKL_CBWR": "AUTO", KERNELS_ENV: "environment"})
    assert "MKL AUTO," in other.stdout, other.stderr


def test_the_label_follows_the_convolution_path_set_after_it_was_first_read():
    """The label is read again when a process reroutes its convolutions at the same thread count (a label
    cached before the pins named oneDNN for im2col runs)."""
    code = ("import dpnrepro, torch; from dpnrepro.determinism.cpu import describe, route_convolutions\n"
            "torch.backends.mkldnn.enabled = True; print(describe()); route_convolutions(); print(describe())")
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    before, after = proc.stdout.splitlines()
    assert "convolutions oneDNN" in before and "convolutions im2col" in after


@pytest.mark.parametrize("entry", ["from dpnrepro.lit.run import pin_lit_threads as pin; pin()",
                                   "from dpnrepro.determinism.cpu import pin_threads as pin; pin(3)"])
def test_every_thread_pin_also_routes_the_convolutions(entry):
    """LiT's own thread count (called by library users of train_lit, not only by the stage) pins the
    convolution path too, as the stages' pin does."""
    proc = _python(f"import dpnrepro, torch; {entry}; print(torch.backends.mkldnn.enabled)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_a_study_worker_pins_its_convolution_path_before_it_builds_anything():
    """The study's runs go to spawned worker processes, which start with oneDNN on: the worker pins the
    path itself (stopped here at its first use of the job, after the pin)."""
    code = ("import dpnrepro, torch\n"
            "import dpnrepro.config.core as core\n"
            "class Seen(Exception): pass\n"
            "class Spy:\n"
            "    @staticmethod\n"
            "    def model_validate(_):\n"
            "        raise Seen(torch.backends.mkldnn.enabled, torch.get_num_threads())\n"
            "core.InputParams = Spy\n"
            "from dpnrepro.study.run import train_and_score\n"
            "try:\n"
            "    train_and_score({'threads': 1, 'data_dir': '.', 'input': {}, 'train': {}})\n"
            "except Seen as seen:\n"
            "    print(*seen.args)\n")
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "1"]
