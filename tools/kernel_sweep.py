"""The kernel fingerprint's maintainer sweeps: which ops' bits each CPU switch changes, and what the pins cost.

``--switches`` flips each switch of :mod:`dpnrepro.determinism.cpu` alone, in a fresh process, to what
another CPU's library would choose, and reports which ops of the fingerprint
(:mod:`dpnrepro.determinism.fingerprint`) change on this CPU: the evidence for each switch
(docs/determinism.md#cpu-switches). ``--cost N`` times the pinned kernels against
``DPNREPRO_CPU_KERNELS=native`` in fresh processes, N interleaved rounds.

    python tools/kernel_sweep.py --switches --cost 3 --json FILE
"""

from __future__ import annotations

import dpnrepro  # noqa: F401,I001  (first: its CPU pins must be in place before numpy and torch load)

import argparse
import json
import os
from pathlib import Path

from dpnrepro.cli import measurement
from dpnrepro.determinism.cpu import INSTRUCTION_SET_ENV, KERNELS_ENV
from dpnrepro.determinism.fingerprint import diff, in_fresh_process, report


# What another CPU's libraries choose when nothing pins them: AVX-512 CPUs take ATen's AVX-512 build, AMD
# CPUs MKL's AUTO branch, Intel AVX-512 CPUs OpenBLAS's SkylakeX kernels, and so on.
OTHER_CPUS_CHOICE = {
    "ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AUTO", "MKL_DYNAMIC": "TRUE", "OMP_DYNAMIC": "TRUE",
    "ONEDNN_MAX_CPU_ISA": "ALL", "NPY_DISABLE_CPU_FEATURES": "", "OPENBLAS_CORETYPE": "SkylakeX",
}
# Knobs left to the library, tried too: OpenCV's AVX-512 paths and Intel IPP off (on this CPU: on).
UNPINNED_TRIED = {"OPENCV_CPU_DISABLE": "AVX512-SKX", "OPENCV_IPP": "disabled"}


def _switch_sweep() -> dict:
    """Each switch of determinism.cpu set, alone, to what another CPU's library would choose, in a fresh
    process: which ops' bits it changes (where this CPU can run that choice)."""
    pinned = {k: v for k, v in os.environ.items() if k != KERNELS_ENV}
    pinned.update(INSTRUCTION_SET_ENV, **{KERNELS_ENV: "environment"})  # each switch exactly as set below
    code = ("import json, sys, dpnrepro.determinism.fingerprint as k; "
            "print(json.dumps(k.fingerprint(onednn_convolutions=sys.argv[1] == '1')))")

    def run(env, onednn="0"):
        return in_fresh_process(code, env, onednn)

    base = run(pinned)
    report = {"convolutions on oneDNN/NNPACK": diff(run(pinned, "1"), base)}
    for key, value in INSTRUCTION_SET_ENV.items():
        other = OTHER_CPUS_CHOICE[key]
        report[f"{key}={other!r} (pinned: {value!r})"] = diff(run({**pinned, key: other}), base)
    for key, value in UNPINNED_TRIED.items():
        report[f"{key}={value!r} (not pinned)"] = diff(run({**pinned, key: value}), base)
    return report


_COST_PROBE = """
import dpnrepro.determinism.fingerprint as k
import json, time, torch, torch.nn.functional as F
k.pin_threads()
t = time.perf_counter(); k.training_run(); train = time.perf_counter() - t
x = torch.randn(8, 256, 32, 32, requires_grad=True); w = torch.randn(256, 256, 3, 3, requires_grad=True)
t = time.perf_counter()
for _ in range(3):
    F.conv2d(x, w, padding=1).sum().backward()
conv = (time.perf_counter() - t) / 3
a, b = torch.randn(1088, 64), torch.randn(64, 256)
t = time.perf_counter()
for _ in range(200):
    a @ b
gemm = (time.perf_counter() - t) / 200
print(json.dumps({"train_2x20_steps_s": train, "conv3x3_256ch_fwd_bwd_s": conv, "gemm_1088x64x256_s": gemm}))
"""


def _cost(rounds: int = 5) -> dict:
    """Seconds of a 2 x 20-step Mu/7 training, a 3x3 256-channel convolution (segmentation's heads) and a
    smoke-size GEMM, pinned vs ``DPNREPRO_CPU_KERNELS=native``, in fresh processes, rounds interleaved:
    the median of each and the ratio."""
    import statistics

    env = {k: v for k, v in os.environ.items() if k not in INSTRUCTION_SET_ENV and k != KERNELS_ENV}
    runs: dict[str, list[dict]] = {"pinned": [], "native": []}
    for _ in range(rounds):
        for mode in runs:
            extra = {KERNELS_ENV: "native"} if mode == "native" else {}
            runs[mode].append(in_fresh_process(_COST_PROBE, {**env, **extra}))
    med = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}
    return {**med, "pinned_over_native": {k: med["pinned"][k] / med["native"][k] for k in med["pinned"]},
            "rounds": rounds}


@measurement
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--switches", action="store_true", help="which ops each switch changes on this CPU")
    ap.add_argument("--cost", type=int, metavar="ROUNDS", help="time the pinned kernels against native ones")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    if not (args.switches or args.cost):
        ap.error("nothing to do: give --switches, --cost ROUNDS or both")
    result = report()
    if args.switches:
        result["switch_effects"] = _switch_sweep()
    if args.cost:
        result["cost"] = _cost(args.cost)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
