"""dpnrepro: a reproducibility harness for Dual PatchNorm (Kumar, Dehghani, Houlsby, TMLR 2023)."""

from dpnrepro import cpu_determinism as _cpu_determinism

# Before torch runs a kernel: pin the instruction sets ATen, MKL and oneDNN dispatch to, so CPU results
# do not depend on the CPU model (src/dpnrepro/cpu_determinism.py).
_cpu_determinism.pin_instruction_sets()

__version__ = "0.1.0"

from dpnrepro import models  # noqa: E402,F401  (registers the vit_*_{dpn,linear,conv} family with timm)
