"""Same bits on every x86 CPU: the CPU kernels this machine runs give the committed bits, op by op
(src/dpnrepro/determinism/fingerprint.py), and the vendor-neutral kernel choices are the ones in force.

A machine whose GEMM, convolution, LayerNorm, NumPy or OpenCV kernels differ from the machine that wrote
tests/fixtures/kernel_fingerprint.json fails here in a minute, naming the op, instead of in the
end-to-end hash comparison of tests/test_pipeline.py."""

from __future__ import annotations

import json

import pytest
from helpers import stage_env

from dpnrepro.determinism.cpu import INSTRUCTION_SET_ENV, KERNELS_ENV
from dpnrepro.determinism.fingerprint import COMMITTED, diff, in_fresh_process, pin_changes

PROBE = ("import json, dpnrepro.determinism.fingerprint as k; "
         "print(json.dumps({'in_force': k.in_force(), 'hashes': k.fingerprint(), 'versions': k.versions()}))")


def _fresh_process(**env) -> dict:
    """The fingerprint in a new process started as a stage is (the project's pins, its 2 threads)."""
    base = {k: v for k, v in stage_env(no_thread_pin=True).items() if k not in INSTRUCTION_SET_ENV and k != KERNELS_ENV}
    return in_fresh_process(PROBE, {**base, **env})


@pytest.fixture(scope="module")
def pinned():
    return _fresh_process()


def test_every_cpu_op_gives_the_committed_bits(pinned):
    committed = json.loads(COMMITTED.read_text())
    found = pinned
    assert not pin_changes(found["versions"], committed["versions"]), (
        f"versions {found['versions']} differ from the fingerprint's {committed['versions']}: a pin changed (a library, "
        "Python or the C library), not this CPU's kernels; record it again with "
        "`python -m dpnrepro.determinism.fingerprint --write` and regenerate the results")
    differ = diff(found["hashes"], committed["hashes"])
    assert not differ, (f"this CPU's kernels give other bits than {committed['machine']} in: {', '.join(differ)} "
                        f"(kernel choices here: {found['in_force']}; there: {committed['in_force']})")


def test_the_vendor_neutral_kernel_choices_are_in_force(pinned):
    """What each library reports it runs, not what the environment asks: an AMD CPU asked for MKL's AVX2
    branch runs AUTO, which only MKL_VERBOSE shows."""
    seen = pinned["in_force"]
    assert seen["mkl_branch"] == "COMPATIBLE,STRICT"
    assert seen["aten"] == "AVX2"
    assert seen["mkldnn_conv"] == "False"
    assert seen["numpy_dispatch"] == "X86_V3", "NumPy dispatches past AVX2: NPY_DISABLE_CPU_FEATURES not in force"
    assert seen["openblas_core"] == "Haswell"
    assert seen["threads"] == "2"


def test_the_version_check_names_python_and_the_c_library(pinned):
    """A machine with another Python or libc fails as 'a pin changed', before any hash is compared."""
    import platform

    assert pinned["versions"]["python"] == platform.python_version()
    assert pinned["versions"]["libc"] == " ".join(platform.libc_ver()) and platform.libc_ver()[0]


def test_a_changed_library_libc_or_python_feature_version_is_a_pin_change_a_micro_release_is_not():
    committed = {"torch": "2.14.1+cu130", "numpy": "2.4.6", "python": "3.11.7", "libc": "glibc 2.36"}
    assert pin_changes(dict(committed, python="3.11.2"), committed) == []
    assert pin_changes(dict(committed, python="3.12.7"), committed) == ["python"]
    assert pin_changes(dict(committed, python="3.1.17"), committed) == ["python"]
    assert pin_changes(dict(committed, numpy="2.4.7", libc="glibc 2.41"), committed) == ["libc", "numpy"]
    assert pin_changes({k: v for k, v in committed.items() if k != "torch"}, committed) == ["torch"]


def test_the_optimizer_is_split_into_its_parts(pinned):
    assert {"adamw_decay", "adamw_moments", "adamw_update", "adamw_bias_correction", "sgd_momentum"} <= set(pinned["hashes"])
    assert "adamw" not in pinned["hashes"]


# What MKL's branch (the choice that differs between Intel and AMD CPUs) may change: the GEMMs and MKL's
# vector math. The optimizers must not depend on it: torch's default CPU AdamW does (its sqrt is MKL's).
OPTIMIZER_PROBE = ("import dpnrepro.determinism.fingerprint as k, json, torch; from types import SimpleNamespace; "
                   "from dpnrepro.training.optim import build_optimizer; k.pin_threads(); "
                   "out = k.optimizer_ops(); m = torch.nn.Linear(64, 256, bias=False); "
                   "o = build_optimizer(m, SimpleNamespace(optimizer='adamw', lr=1e-3, weight_decay=1e-4), fused=False); "
                   "m.weight.grad = torch.randn(256, 64, generator=torch.Generator().manual_seed(3)); o.step(); o.step(); "
                   "out['torch_default_adamw'] = k._sha(m.weight); print(json.dumps(out))")


def test_the_optimizer_does_not_follow_mkls_cpu_dependent_branch():
    base = {k: v for k, v in stage_env(no_thread_pin=True).items() if k != KERNELS_ENV}
    runs = {branch: in_fresh_process(OPTIMIZER_PROBE, {**base, **INSTRUCTION_SET_ENV, "MKL_CBWR": branch,
                                                       KERNELS_ENV: "environment"})
            for branch in ("COMPATIBLE,STRICT", "AUTO", "AVX2")}
    ours = {b: {k: v for k, v in r.items() if k != "torch_default_adamw"} for b, r in runs.items()}
    assert ours["AUTO"] == ours["COMPATIBLE,STRICT"] == ours["AVX2"], ours
    # the evidence for the choice: torch's default CPU path gives other bits under another branch
    assert len({r["torch_default_adamw"] for r in runs.values()}) > 1


def test_the_native_opt_out_gives_the_cpus_own_kernels():
    seen = _fresh_process(**{KERNELS_ENV: "native"})["in_force"]
    assert seen["mkl_branch"] != "COMPATIBLE,STRICT" and seen["mkldnn_conv"] == "True"


def test_writing_or_checking_the_fingerprint_without_the_pins_is_refused():
    """A conflicting inherited switch leaves the pins out of force: `--write` would commit another machine
    class's kernels as the reference, `--check` would compare the wrong ones; both refuse in one line."""
    import subprocess
    import sys

    from helpers import REPO, clean_env

    before = COMMITTED.read_bytes()
    for flag in ("--write", "--check"):
        proc = subprocess.run([sys.executable, "-m", "dpnrepro.determinism.fingerprint", flag], cwd=REPO,
                              env=clean_env(OPENBLAS_CORETYPE="SkylakeX"), capture_output=True, text=True)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert proc.returncode == 2 and len(errors) == 1 and "OPENBLAS_CORETYPE" in errors[0], proc.stderr
        assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert COMMITTED.read_bytes() == before
