"""dpnrepro: a reproducibility harness for Dual PatchNorm (Kumar, Dehghani, Houlsby, TMLR 2023)."""

from dpnrepro.determinism import cpu as _cpu_determinism

# Before numpy, torch or cv2 load: pin the kernels they dispatch to, so CPU results do not depend on the
# CPU model or vendor (src/dpnrepro/determinism/cpu.py). Where they cannot take effect any more, this
# warns once; the places where results are made refuse (determinism.cpu.require_pins).
_cpu_determinism.pin_instruction_sets()

__version__ = "0.1.0"

from dpnrepro import models  # noqa: E402,F401  (registers the vit_*_{dpn,linear,conv} family with timm)
