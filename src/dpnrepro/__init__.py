"""dpnrepro: a reproducibility harness for Dual PatchNorm (Kumar, Dehghani, Houlsby, TMLR 2023)."""

from dpnrepro.determinism import cpu as _cpu_determinism

# Before numpy, torch or cv2 load: pin the kernels they dispatch to, so CPU results do not depend on the
# CPU model or vendor (src/dpnrepro/determinism/cpu.py). Where they cannot take effect any more, this
# warns once; the places where results are made refuse (determinism.cpu.require_pins).
_cpu_determinism.pin_instruction_sets()

__version__ = "0.1.0"

# Nothing else is imported here: a stage that turns JSON into Markdown loads neither torch nor timm. The
# ViT family registers with timm when `dpnrepro.models` is imported, as timm's own families do.
