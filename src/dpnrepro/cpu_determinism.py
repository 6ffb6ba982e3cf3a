"""CPU results that do not depend on the CPU's model or vendor: vendor-neutral kernels, one thread count.

The same program on the same inputs gives different bits on different x86 CPUs because the libraries
under the pipeline pick their kernels by CPU. Each has a documented switch, set here for every process
that imports :mod:`dpnrepro` (all stages, torchrun workers, tests) before any of them loads:

- ``ATEN_CPU_CAPABILITY=avx2``: torch's own kernels (reductions, softmax, LayerNorm, AdamW's foreach
  ops) from their AVX2 build, not AVX-512 (``aten/src/ATen/native/DispatchStub.cpp``).
- ``MKL_CBWR=COMPATIBLE,STRICT``: MKL's GEMMs on the one code branch both vendors honour. oneMKL's
  *Specifying Code Branches*: branches other than ``AUTO`` and ``COMPATIBLE`` exist only on Intel CPUs;
  on AMD, ``AVX2`` silently runs ``AUTO`` (seen here: ``MKL_VERBOSE`` prints ``CNR:AUTO,STRICT`` for
  ``MKL_CBWR=AVX2,STRICT`` on an AMD EPYC), so Intel and AMD ran different GEMMs. ``STRICT`` (thread-
  count independence) applies to the AVX2/AVX-512 branches only; the thread count is fixed below, as
  *Reproducibility Conditions* asks, with ``MKL_DYNAMIC=FALSE`` / ``OMP_DYNAMIC=FALSE``.
- Convolutions off oneDNN and NNPACK (:func:`pin_threads`): their blocking follows the CPU's cache sizes
  (an ISA cap, ``ONEDNN_MAX_CPU_ISA=AVX2``, kept for oneDNN's other uses, does not fix that), so torch
  computes them with its own im2col + MKL GEMM, on the branch above.
- ``NPY_DISABLE_CPU_FEATURES``: NumPy's runtime SIMD dispatch capped at x86-64-v3 (AVX2), the level
  every supported CPU has (NumPy's *CPU build options*: runtime dispatch and its environment variables).
- ``OPENBLAS_CORETYPE=Haswell``: NumPy's OpenBLAS (few-shot's ridge solve, statistics) on its Haswell
  (AVX2) kernels, not the kernels of the detected core (OpenBLAS's DYNAMIC_ARCH, ``OPENBLAS_CORETYPE``).
- Not pinned: OpenCV's dispatch (AVX-512 paths, Intel IPP) for the fast input backend's warps, filters
  and resizes; turning either off changes none of their bits on an AVX-512 CPU (measured as below), and
  the fingerprint hashes those ops, so a CPU where they differ fails its test.

Which ops each switch changes was measured with ``python -m dpnrepro.kernel_fingerprint --switches``
(each set alone to another CPU's choice); results and cost in docs/determinism.md#cpu-switches. Values a user sets in the
environment win (``setdefault``). ``DPNREPRO_CPU_KERNELS=native`` opts out of all of it for speed:
results are then reproducible on the same machine only, and their hardware label says so.
"""

from __future__ import annotations

import os

INSTRUCTION_SET_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "MKL_DYNAMIC": "FALSE",
    "OMP_DYNAMIC": "FALSE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_CORETYPE": "Haswell",
}

# Intra-op threads of every stage: the CI machine's 2 cores. Another value changes ATen's reduction
# order, hence the bits; DPNREPRO_CPU_THREADS overrides it (for speed, at the cost of that guarantee).
CPU_THREADS = 2
THREADS_ENV = "DPNREPRO_CPU_THREADS"
KERNELS_ENV = "DPNREPRO_CPU_KERNELS"  # "native": the CPU's own fastest kernels, no cross-machine guarantee


def native() -> bool:
    return os.environ.get(KERNELS_ENV, "").lower() == "native"


def pin_instruction_sets() -> None:
    if not native():
        for key, value in INSTRUCTION_SET_ENV.items():
            os.environ.setdefault(key, value)


def route_convolutions() -> None:
    """Convolutions through ATen's im2col + GEMM (MKL's vendor-neutral branch), not oneDNN or NNPACK."""
    import torch

    if not native():
        torch.backends.mkldnn.enabled = False
        torch.backends.nnpack.set_flags(False)


def pin_threads() -> int:
    """Fix torch's intra-op thread count and the convolution path (stage entry points call this); returns it."""
    import torch

    n = int(os.environ.get(THREADS_ENV, CPU_THREADS))
    torch.set_num_threads(n)
    route_convolutions()
    return n


def describe() -> str:
    """What decides CPU bits in this process: kernels, MKL branch, threads."""
    import torch

    if native():
        return f"native {torch.backends.cpu.get_cpu_capability()} kernels (this machine only), {torch.get_num_threads()} threads"
    return (f"{torch.backends.cpu.get_cpu_capability()} kernels, MKL_CBWR={os.environ.get('MKL_CBWR', 'unset')}, "
            f"{torch.get_num_threads()} threads")
