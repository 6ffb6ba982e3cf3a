"""dpnrepro: a reproducibility harness for Dual PatchNorm (Kumar, Dehghani, Houlsby, TMLR 2023)."""

__version__ = "0.1.0"
