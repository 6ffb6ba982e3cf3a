"""The CPU pins cannot be silently off where results are made. A library loaded before dpnrepro, or an
inherited value that differs from the pinned one, leaves them out of force with one warning: the models
still work as a library, while stages (and every other caller of require_pins) refuse in one line (exit 2)
with nothing written. The label says what the libraries report they run. Each subprocess starts from a
clean environment (no pins inherited from this test process)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, clean_env, copy_project, stage_env

from dpnrepro.determinism.cpu import INSTRUCTION_SET_ENV, KERNELS_ENV

REQUIRE = "from dpnrepro.determinism.cpu import require_pins; require_pins(); print('in force')"


def _python(code: str, cwd=REPO, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=clean_env(**env), capture_output=True, text=True)


def test_torch_and_timm_first_then_the_models_register_and_run_with_one_warning():
    """A researcher's own code imports torch first: dpnrepro's models register and compute, with one warning."""
    code = ("import torch, timm\n"
            "import dpnrepro.models\n"
            "model = timm.create_model('vit_base_patch16_dpn', img_size=32, patch_size=16, embed_dim=24, depth=1,\n"
            "                          num_heads=2, num_classes=3).eval()\n"
            "with torch.no_grad():\n"
            "    print(tuple(model(torch.zeros(2, 3, 32, 32)).shape))\n")
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(2, 3)"
    assert proc.stderr.count("Warning") == 1 and "pins are not in force" in proc.stderr


@pytest.mark.parametrize("first", ["numpy", "torch", "cv2"])
def test_after_a_library_that_reads_the_pins_require_pins_refuses_in_one_line(first):
    proc = _python(f"import {first}; import dpnrepro; {REQUIRE}")
    assert proc.returncode == 1 and "PinConflict" in proc.stderr and f"{first} loaded before dpnrepro" in proc.stderr
    assert _python(f"import dpnrepro, {first}; {REQUIRE}").stdout.strip() == "in force"


def _files(root) -> dict:
    return {path: path.stat().st_mtime_ns for path in root.rglob("*") if path.is_file()}


def test_a_stage_started_after_a_late_import_refuses_in_one_line_and_writes_nothing(tmp_path):
    project = copy_project(tmp_path)
    before = _files(project)
    code = "import torch, runpy; runpy.run_path('stages/table4.py', run_name='__main__')"
    proc = subprocess.run([sys.executable, "-c", code], cwd=project, env=stage_env(), capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "torch loaded before dpnrepro" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert _files(project) == before


@pytest.mark.parametrize("value", ["abc", "0", "-1"])
def test_a_bad_thread_count_is_one_line_under_a_stage(tmp_path, value):
    project = copy_project(tmp_path)
    proc = subprocess.run([sys.executable, "stages/table4.py"], cwd=project,
                          env={**stage_env(), "DPNREPRO_CPU_THREADS": value}, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith(f"error: DPNREPRO_CPU_THREADS={value!r}")


def test_a_library_loaded_first_is_fine_when_the_environment_holds_the_pins():
    proc = _python(f"import numpy, dpnrepro; {REQUIRE}", **INSTRUCTION_SET_ENV)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "in force" and "Warning" not in proc.stderr


@pytest.mark.parametrize("key, value", [("OMP_DYNAMIC", "TRUE"), ("OPENBLAS_CORETYPE", "SkylakeX"),
                                        ("NPY_DISABLE_CPU_FEATURES", ""), ("MKL_CBWR", "AUTO")])
def test_an_inherited_value_that_differs_is_refused(key, value):
    proc = _python(f"import dpnrepro; {REQUIRE}", **{key: value})
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("dpnrepro.determinism.cpu.PinConflict") and f"{key}={value!r}" in last and KERNELS_ENV in last


def test_the_same_value_in_another_case_is_accepted():
    assert _python(f"import dpnrepro; {REQUIRE}", OMP_DYNAMIC="false").stdout.strip() == "in force"


def test_native_opts_out_and_the_label_says_so():
    proc = _python("import numpy, dpnrepro; from dpnrepro.determinism.cpu import describe; print(describe())",
                   OMP_DYNAMIC="TRUE", **{KERNELS_ENV: "native"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("native kernels (this machine only)")


def test_the_label_says_when_the_pins_are_not_in_force():
    proc = _python("import torch, dpnrepro; from dpnrepro.determinism.cpu import describe; print(describe())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("CPU pins not in force (this machine only): ")


def pinned_label() -> str:
    """What the libraries report under the pins, from the pins themselves: ATen's capability, MKL's branch,
    NumPy's dispatch (X86_V4 disabled: capped at x86-64-v3), OpenBLAS's core. The pins name x86 levels, so
    elsewhere (aarch64, or an x86 CPU below AVX2) the libraries report their own and the test skips."""
    import platform

    flags = set()
    if Path("/proc/cpuinfo").is_file():
        flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    if platform.machine().lower() not in {"x86_64", "amd64"} or not {"avx2", "fma", "bmi2"} <= flags:
        pytest.skip(f"NOT RUN: the CPU pins name x86-64-v3 (AVX2) kernels; this CPU is {platform.machine()} "
                    f"without {sorted({'avx2', 'fma', 'bmi2'} - flags)}")
    assert "X86_V4" in INSTRUCTION_SET_ENV["NPY_DISABLE_CPU_FEATURES"].split()
    return (f"ATen {INSTRUCTION_SET_ENV['ATEN_CPU_CAPABILITY'].upper()}, MKL {INSTRUCTION_SET_ENV['MKL_CBWR']}, "
            f"NumPy X86_V3, OpenBLAS {INSTRUCTION_SET_ENV['OPENBLAS_CORETYPE']}")


def test_the_label_is_what_the_libraries_report():
    """Under the pins the label names MKL's and NumPy's choices as read back; with MKL's branch set otherwise
    (the environment taken as set), the label shows that branch, not the pinned one."""
    code = "import dpnrepro; from dpnrepro.determinism.cpu import describe, pin_threads; pin_threads(); print(describe())"
    pinned = _python(code)
    assert pinned.returncode == 0, pinned.stderr
    assert f"{pinned_label()}, convolutions im2col, " in pinned.stdout
    other = _python(code, **{**INSTRUCTION_SET_ENV, "MKL_CBWR": "AUTO", KERNELS_ENV: "environment"})
    assert "MKL AUTO," in other.stdout, other.stderr


@pytest.mark.parametrize("cbwr", ["COMPATIBLE,STRICT", "AUTO", "AVX2,STRICT", None])  # a process each: ~6 CPU-s
def test_mkls_branch_read_through_its_api_is_what_mkl_verbose_prints(cbwr):
    """The label's MKL branch comes from MKL's mkl_cbwr_get (no clock measurement), in MKL_VERBOSE's words: under
    each setting, pinned or not, on whichever vendor runs this (an Intel CPU runs the ISA branches as set, an
    AMD one AUTO), the same string as the CNR field of a GEMM under MKL_VERBOSE."""
    code = ("import dpnrepro, torch; from dpnrepro.determinism.cpu import mkl_branch, mkl_cbwr_branch, mkl_verbose_branch; "
            "print(mkl_cbwr_branch(), mkl_branch(), mkl_verbose_branch())")
    env = {**INSTRUCTION_SET_ENV, KERNELS_ENV: "environment"}
    env.pop("MKL_CBWR", None)
    proc = _python(code, **env, **({"MKL_CBWR": cbwr} if cbwr else {}))
    assert proc.returncode == 0, proc.stderr
    api, label, verbose = proc.stdout.split()
    assert label == verbose, (cbwr, label, verbose)
    vendor_neutral = {"COMPATIBLE,STRICT": "COMPATIBLE,STRICT", "COMPATIBLE": "COMPATIBLE", "AUTO": "AUTO",
                      "AUTO,STRICT": "AUTO,STRICT", None: "OFF"}
    if cbwr in vendor_neutral:  # named by the API itself, no MKL_VERBOSE run
        assert api == verbose == vendor_neutral[cbwr], (cbwr, api, verbose)
    else:  # an ISA branch: the API's name (AMD: AUTO) or, where it names none, MKL_VERBOSE's
        assert api in (verbose, "None"), (cbwr, api, verbose)


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


def test_a_stage_pins_torch_loaded_after_a_library_probed_for_it():
    """Libraries probe for torch (`importlib.util.find_spec("torch")`, as datasets does) before anything imports
    it. The probe used to consume the stage's pin-on-import hook: torch then loaded with oneDNN convolutions and
    its default thread count, and the study's metrics were labelled so."""
    code = ("from dpnrepro.cli import stage\n"
            "@stage\n"
            "def main():\n"
            "    import importlib.util\n"
            "    assert importlib.util.find_spec('torch') is not None\n"
            "    import torch\n"
            "    print(torch.backends.mkldnn.enabled, torch.get_num_threads())\n"
            "main()\n")
    proc = _python(code, DPNREPRO_CPU_THREADS="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "1"]


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


def test_a_study_worker_refuses_without_the_pins():
    proc = _python("import torch, dpnrepro\nfrom dpnrepro.study.run import train_and_score\ntrain_and_score({'threads': 1})")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("dpnrepro.determinism.cpu.PinConflict: ") and "torch loaded" in last, proc.stderr


def test_a_measuring_tool_started_after_a_late_import_refuses_in_one_line(tmp_path):
    code = ("import sys, torch, runpy\n"
            "sys.argv = ['tools/photo_folder.py', sys.argv[1] + '/photos', '--train', '1']\n"
            "runpy.run_path('tools/photo_folder.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=stage_env(), capture_output=True,
                          text=True)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "torch loaded before dpnrepro" in errors[0] and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []
