"""CPU results that do not depend on the CPU's model or vendor: vendor-neutral kernels, one thread count.

The same program on the same inputs gives different bits on different x86 CPUs because the libraries
under the pipeline pick their kernels by CPU. Each has a documented switch, set here for every process
that imports :mod:`dpnrepro` (all stages, torchrun workers, tests) before any of them loads:

- ``ATEN_CPU_CAPABILITY=avx2``: torch's own kernels (reductions, softmax, LayerNorm, the fused AdamW)
  from their AVX2 build, not AVX-512 (``aten/src/ATen/native/DispatchStub.cpp``).
- ``MKL_CBWR=COMPATIBLE,STRICT``: MKL's GEMMs on the one code branch both vendors honour. oneMKL's
  *Specifying Code Branches*: branches other than ``AUTO`` and ``COMPATIBLE`` exist only on Intel CPUs;
  on AMD, ``AVX2`` silently runs ``AUTO`` (``MKL_VERBOSE`` prints ``CNR:AUTO,STRICT`` there), so Intel and
  AMD ran different GEMMs. ``STRICT`` (thread-count independence) applies to the AVX2/AVX-512 branches
  only; the thread count is fixed below, as *Reproducibility Conditions* asks, with
  ``MKL_DYNAMIC=FALSE`` / ``OMP_DYNAMIC=FALSE``. MKL's vector math (torch's CPU ``sqrt``) is not pinned
  by this: the optimizer avoids it (training/optim.py).
- Convolutions off oneDNN and NNPACK (:func:`pin_threads`): their blocking follows the CPU's cache sizes
  (an ISA cap, ``ONEDNN_MAX_CPU_ISA=AVX2``, kept for oneDNN's other uses, does not fix that), so torch
  computes them with its own im2col + MKL GEMM, on the branch above.
- ``NPY_DISABLE_CPU_FEATURES``: NumPy's runtime SIMD dispatch capped at x86-64-v3 (AVX2), the level
  every supported CPU has (NumPy's *CPU build options*: runtime dispatch and its environment variables).
- ``OPENBLAS_CORETYPE=Haswell``: NumPy's OpenBLAS (few-shot's ridge solve, statistics) on its Haswell
  (AVX2) kernels, not the kernels of the detected core (OpenBLAS's DYNAMIC_ARCH, ``OPENBLAS_CORETYPE``).
- Not pinned: OpenCV's dispatch (AVX-512 paths, Intel IPP) for the fast input backend's warps, filters
  and resizes; turning either off changes none of their bits on an AVX-512 CPU, and the fingerprint
  hashes those ops, so a CPU where they differ fails its test.

The switches are read when the libraries load, so they cannot be applied late. Importing dpnrepro after
numpy, torch or cv2 (unless the environment already holds the switches), or under an inherited value that
differs from a pinned one, leaves the pins out of force with one warning: the models still work as a
library, but the places where results are made (stage entry points, the study's workers, the tools that
write measurements) call :func:`require_pins`, which refuses in one line. The hardware label
(:func:`describe`) is built from what each library reports it runs (:func:`library_choices`), not from
the environment, and says when the pins were not in force. ``DPNREPRO_CPU_KERNELS=native`` opts out of
all of it for speed (results reproducible on the same machine only; the label says so);
``DPNREPRO_CPU_KERNELS=environment`` takes the switches exactly as the environment sets them (the
switch sweep of ``tools/kernel_sweep.py``). Which ops each switch changes: docs/determinism.md#cpu-switches.
"""

from __future__ import annotations

import os
import re
import sys
import warnings

from dpnrepro.errors import UserError

INSTRUCTION_SET_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "MKL_DYNAMIC": "FALSE",
    "OMP_DYNAMIC": "FALSE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Haswell",
}
# The libraries that read the switches when they load.
READS_AT_LOAD = ("numpy", "torch", "cv2")

# Intra-op threads of every stage: the CI machine's 2 cores. Another value changes ATen's reduction
# order, hence the bits; DPNREPRO_CPU_THREADS overrides it (for speed, at the cost of that guarantee).
CPU_THREADS = 2
THREADS_ENV = "DPNREPRO_CPU_THREADS"
KERNELS_ENV = "DPNREPRO_CPU_KERNELS"  # "native" | "environment" | unset (the pins)


class PinConflict(UserError):
    """The pins are not in force in this process (a library loaded first, or a conflicting value)."""


# Why the pins are not in force in this process and what to do (None: in force, or opted out by KERNELS_ENV).
_not_in_force: str | None = None


def native() -> bool:
    return os.environ.get(KERNELS_ENV, "").lower() == "native"


def _as_set() -> bool:
    return os.environ.get(KERNELS_ENV, "").lower() == "environment"


def _pin_obstacle() -> tuple[str, str] | None:
    """``(cause, fix)`` when the switches cannot take effect in this process now, or None when they can."""
    differ = {k: os.environ[k] for k, v in INSTRUCTION_SET_ENV.items() if os.environ.get(k, v).strip().upper() != v.upper()}
    if differ:
        return ("the environment sets " + ", ".join(f"{k}={v!r}" for k, v in differ.items())
                + f" where dpnrepro pins {', '.join(f'{k}={INSTRUCTION_SET_ENV[k]!r}' for k in differ)}",
                f"unset it, or set {KERNELS_ENV}=native for this machine's own kernels (no cross-machine guarantee)")
    loaded = [m for m in READS_AT_LOAD if m in sys.modules]
    if loaded and any(k not in os.environ for k in INSTRUCTION_SET_ENV):
        return (f"{', '.join(loaded)} loaded before dpnrepro, so its CPU pins cannot take effect",
                "import dpnrepro first, or set them in the environment "
                f"({' '.join(f'{k}={v!r}' for k, v in INSTRUCTION_SET_ENV.items())})")
    return None


def pin_instruction_sets() -> None:
    """Put the switches in this process's environment before the libraries that read them load; where they
    cannot take effect, record why (:func:`require_pins`) and warn once."""
    global _not_in_force
    if native() or _as_set():
        return
    obstacle = _pin_obstacle()
    if obstacle is None:
        os.environ.update(INSTRUCTION_SET_ENV)
        return
    _not_in_force = "; ".join(obstacle)
    warnings.warn(f"dpnrepro's CPU pins are not in force ({obstacle[0]}): fine for library use, but stages and "
                  "measuring tools refuse to run in this process", RuntimeWarning, stacklevel=2)


def require_pins(*, opt_out: bool = True) -> None:
    """Raise :class:`PinConflict` (one line) when the pins are not in force; the places where results are made
    call this first. ``DPNREPRO_CPU_KERNELS=native|environment`` is an explicit opt-out (the label says so),
    except with ``opt_out=False``: what is recorded as the pinned kernels' reference refuses it too."""
    if not opt_out and (native() or _as_set()):
        raise PinConflict(f"{KERNELS_ENV}={os.environ[KERNELS_ENV]!r} opts out of the pins, and the committed "
                          f"reference is of the pinned kernels; unset {KERNELS_ENV} to record it")
    if _not_in_force is not None and not native() and not _as_set():
        raise PinConflict(_not_in_force)


def thread_count(default: int = CPU_THREADS) -> int:
    """The intra-op thread count: ``DPNREPRO_CPU_THREADS`` (a positive integer), else ``default``."""
    raw = os.environ.get(THREADS_ENV)
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise UserError(f"{THREADS_ENV}={raw!r} is not a positive number of threads; unset it for the pinned {default}")
    return n


def route_convolutions() -> None:
    """Convolutions through ATen's im2col + GEMM (MKL's vendor-neutral branch), not oneDNN or NNPACK."""
    import torch

    if not native():
        torch.backends.mkldnn.enabled = False
        torch.backends.nnpack.set_flags(False)


def pin_threads(default: int = CPU_THREADS) -> int:
    """Fix torch's intra-op thread count (``DPNREPRO_CPU_THREADS``, else ``default``) and the convolution path;
    stage entry points and every worker process that computes results call this. Returns the count."""
    n = thread_count(default)
    import torch

    torch.set_num_threads(n)
    route_convolutions()
    return n


def pin_threads_when_loaded(default: int = CPU_THREADS) -> None:
    """:func:`pin_threads` now when torch is loaded, else the moment its import completes, before any caller
    can compute with it: a stage that never imports torch (the report stages) does not pay for loading it.
    A bad ``DPNREPRO_CPU_THREADS`` is refused now either way."""
    thread_count(default)
    if "torch" in sys.modules:
        pin_threads(default)
    elif not any(isinstance(f, _AfterImport) and f.name == "torch" for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport("torch", lambda: pin_threads(default)))


class _AfterImport:
    """A ``sys.meta_path`` finder that calls ``callback`` once, right after module ``name`` has run its top
    level on its first import: finds the module's spec through the other finders and wraps the loader's
    ``exec_module`` (the loader instance is the spec's own); leaves ``sys.meta_path`` when that module runs, not
    on a lookup that imports nothing."""

    def __init__(self, name: str, callback) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.util

        at = sys.meta_path.index(self)
        sys.meta_path.remove(self)  # the lookup below must not come back here
        try:
            spec = importlib.util.find_spec(fullname)
        finally:  # a probe (`importlib.util.find_spec`, as datasets does) imports nothing: stay for the import
            sys.meta_path.insert(at, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def run_then_call(module):
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            run(module)
            self.callback()

        spec.loader.exec_module = run_then_call
        return spec


# mkl_cbwr_get(MKL_CBWR_ALL) (mkl_service.h): the branch in force, plus MKL_CBWR_STRICT. Only the values a process
# shows on either vendor are named here (on AMD every ISA branch runs AUTO); any other value is read from MKL_VERBOSE.
CBWR_BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE"}
CBWR_STRICT = 0x10000


def mkl_branch() -> str:
    """MKL's code branch in force, as MKL reports it, in the words of MKL_VERBOSE's ``CNR:`` field:
    :func:`mkl_cbwr_branch` where it names it, else :func:`mkl_verbose_branch` (whose first GEMM under MKL_VERBOSE
    also measures the CPU clock: ~0.6 CPU-s a process on a 2-core AMD EPYC, against microseconds for the other)."""
    return mkl_cbwr_branch() or mkl_verbose_branch()


def mkl_cbwr_branch() -> str | None:
    """MKL's ``mkl_cbwr_get(MKL_CBWR_ALL)`` (statically linked into torch, which exports it as
    ``mkl_serv_cbwr_get``) as a ``CNR:`` string; None where torch has no such symbol or the value is not one of
    :data:`CBWR_BRANCHES`."""
    import ctypes

    import torch

    try:
        get = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")).mkl_serv_cbwr_get
    except (OSError, AttributeError):  # another build of torch (no MKL, or MKL linked otherwise)
        return None
    get.restype, get.argtypes = ctypes.c_int, [ctypes.c_int]
    value = get(-1)  # MKL_CBWR_ALL
    branch = CBWR_BRANCHES.get(value & ~CBWR_STRICT)
    if branch is None:
        return None
    return f"{branch},STRICT" if value & CBWR_STRICT else branch


def mkl_verbose_branch() -> str:
    """MKL's code branch: the ``CNR:`` field of a GEMM under ``MKL_VERBOSE`` (printed to file descriptor 1,
    captured here)."""
    import tempfile

    import torch

    with tempfile.TemporaryFile() as tmp:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(tmp.fileno(), 1)
        try:
            with torch.backends.mkl.verbose(torch.backends.mkl.VERBOSE_ON):
                torch.ones(8, 8) @ torch.ones(8, 8)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        m = re.search(r"CNR:([A-Z0-9_,]+)", tmp.read().decode(errors="replace"))
    return m.group(1) if m else "unknown"


def numpy_dispatch() -> str:
    """The SIMD targets NumPy's dispatched functions run (``numpy.lib.introspect.opt_func_info``)."""
    from numpy.lib.introspect import opt_func_info

    targets = {d["current"] for sigs in opt_func_info().values() for d in sigs.values()}
    return " ".join(sorted(t for t in targets if not t.startswith("baseline"))) or "baseline"


def openblas_core() -> str:
    """The kernel set NumPy's OpenBLAS runs, as threadpoolctl reads it from OpenBLAS."""
    import numpy  # noqa: F401  (loads its OpenBLAS)
    from threadpoolctl import threadpool_info

    cores = sorted({lib.get("architecture") or "?" for lib in threadpool_info() if lib.get("internal_api") == "openblas"})
    return " ".join(cores) or "unknown (no OpenBLAS loaded)"


def library_choices() -> dict[str, str]:
    """What decides CPU bits in this process, read back from each library."""
    import torch

    return {
        "aten": torch.backends.cpu.get_cpu_capability(),
        "mkl_branch": mkl_branch(),
        "mkldnn_conv": str(torch.backends.mkldnn.enabled),
        "numpy_dispatch": numpy_dispatch(),
        "openblas_core": openblas_core(),
        "threads": str(torch.get_num_threads()),
    }


_LABEL: dict[tuple, str] = {}


def describe() -> str:
    """The CPU part of a result's label, from :func:`library_choices` (read once per thread count and
    convolution path, the two settings a process changes after its start)."""
    import torch

    n = torch.get_num_threads()
    key = (n, torch.backends.mkldnn.enabled)
    if key not in _LABEL:
        c = library_choices()
        label = (f"ATen {c['aten']}, MKL {c['mkl_branch']}, NumPy {c['numpy_dispatch']}, "
                 f"OpenBLAS {c['openblas_core']}, convolutions {'oneDNN' if c['mkldnn_conv'] == 'True' else 'im2col'}, "
                 f"{n} threads")
        if native():
            label = f"native kernels (this machine only): {label}"
        elif _not_in_force is not None and not _as_set():
            label = f"CPU pins not in force (this machine only): {label}"
        _LABEL[key] = label
    return _LABEL[key]
