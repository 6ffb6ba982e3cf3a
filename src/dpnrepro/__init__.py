"""dpnrepro: a reproducibility harness for Dual PatchNorm (Kumar, Dehghani, Houlsby, TMLR 2023)."""

import sys as _sys

from dpnrepro.determinism import cpu as _cpu_determinism

# Before numpy, torch or cv2 load: pin the kernels they dispatch to, so CPU results do not depend on the
# CPU model or vendor (src/dpnrepro/determinism/cpu.py); refused in one line where they cannot be in force.
try:
    _cpu_determinism.pin_instruction_sets()
except _cpu_determinism.PinConflict as _e:
    print(f"dpnrepro: {_e}", file=_sys.stderr)
    raise SystemExit(2) from None

__version__ = "0.1.0"

from dpnrepro import models  # noqa: E402,F401  (registers the vit_*_{dpn,linear,conv} family with timm)
