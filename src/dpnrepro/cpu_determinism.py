"""CPU results that do not depend on the CPU model: one instruction set and one thread count.

The same program on the same inputs gives different bits on different x86 CPUs because three libraries
pick their kernels by CPU: ATen (torch's own kernels: AVX2 or AVX-512 builds of reductions, softmax,
LayerNorm, ...), MKL (GEMMs: a code path per CPU family, and a thread-dependent split unless told
otherwise) and oneDNN (convolutions). Each has a documented switch, set here for every process that
imports :mod:`dpnrepro` (all stages, torchrun workers, tests) before torch runs a kernel:

- ``ATEN_CPU_CAPABILITY=avx2``: torch's dispatch (``aten/src/ATen/native/DispatchStub.cpp``);
- ``MKL_CBWR=AVX2,STRICT``: MKL's Conditional Numerical Reproducibility, AVX2 code path on every CPU
  that has it, STRICT = also independent of the thread count;
- ``ONEDNN_MAX_CPU_ISA=AVX2``: oneDNN's ISA cap.

ATen's parallel reductions split the work by thread count, so stages also run with a fixed number of
intra-op threads (:data:`CPU_THREADS`). Measured effect of each switch: README, Determinism.
Values a user sets in the environment win (``setdefault``); the run's hardware label records what
was in force. The guarantee covers x86-64 CPUs with AVX2 (Intel Haswell / AMD Zen and later).
"""

from __future__ import annotations

import os

INSTRUCTION_SET_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
}

# Intra-op threads of every stage: the CI machine's 2 cores. Another value changes ATen's reduction
# order, hence the bits; DPNREPRO_CPU_THREADS overrides it (for speed, at the cost of that guarantee).
CPU_THREADS = 2
THREADS_ENV = "DPNREPRO_CPU_THREADS"


def pin_instruction_sets() -> None:
    for key, value in INSTRUCTION_SET_ENV.items():
        os.environ.setdefault(key, value)


def pin_threads() -> int:
    """Fix torch's intra-op thread count (stage entry points call this); returns it."""
    import torch

    n = int(os.environ.get(THREADS_ENV, CPU_THREADS))
    torch.set_num_threads(n)
    return n


def describe() -> str:
    """What decides CPU bits in this process: ISA, MKL mode, threads."""
    import torch

    return (f"{torch.backends.cpu.get_cpu_capability()} kernels, MKL_CBWR={os.environ.get('MKL_CBWR', 'unset')}, "
            f"{torch.get_num_threads()} threads")
