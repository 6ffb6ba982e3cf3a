"""What the paper's runs cost on a GPU at a profile's settings, in one place.

  gpu_hours.py  every report's workloads at the full profile and their GPU-hours: measured img/s, else
                FLOPs at a measured (or an assumed) MFU
  transfer.py   Tables 3 and 7: runs, training images and FLOPs per arch
  lit.py        Table 4: FLOPs per example of a LiT step

FLOPs follow :mod:`dpnrepro.benchmarks.flops` (matmul FLOPs, training = 3 × forward). reports/README.md
(:mod:`dpnrepro.reports.index`) renders the GPU-hours.
"""
