"""DVC stage `train@<arch>-<stem>-<seed>`: train one model of a sweep, resumably.

Writes ``runs/<sweep>/<arch>_<stem>_s<seed>/`` (weights, model spec, dvclive logs, run summary);
the resumable training state lives in ``checkpoints/<sweep>/...`` (a persistent DVC output).

One process: ``python stages/train.py --arch Mu-7 --stem dpn --seed 0``. Several (GPUs, nodes): the
same arguments under torchrun, with ``train.devices`` = the total number of processes, e.g.
``torchrun --nproc_per_node=8 stages/train.py --arch B-16 --stem dpn --seed 0`` or, on each of M nodes,
``torchrun --nnodes=M --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 --rdzv-id=JOB
stages/train.py ...`` (see src/dpnrepro/training/distributed.py). Rank 0 writes the outputs.
"""

import argparse

from dpnrepro.cli import stage
from dpnrepro.config import load_params
from dpnrepro.training.run import train_run


@stage
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sweep", default="table1")
    ap.add_argument("--arch", required=True)
    ap.add_argument("--stem", required=True)
    ap.add_argument("--seed", type=int, required=True)
    args = ap.parse_args()
    train_run(load_params(), sweep=args.sweep, arch=args.arch, stem=args.stem, seed=args.seed)


if __name__ == "__main__":
    main()
