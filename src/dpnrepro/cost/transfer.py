"""What Tables 3 and 7 cost at a profile's settings: runs, training images and FLOPs per arch
(:mod:`dpnrepro.cost.gpu_hours` turns them into GPU-hours).

FLOPs are the analytic matmul FLOPs of :mod:`dpnrepro.benchmarks.flops` (training = 3 × forward).
Evaluation passes (val200 / test, a forward each) are counted as well. Table 7's step-2 grid re-uses
step 1's winner when its (mixup 0, RandAugment 0) setting is in the grid, as the search does.
"""

from __future__ import annotations

from dpnrepro.benchmarks.flops import vit_forward_flops
from dpnrepro.config.core import arch_name
from dpnrepro.config.params import Params
from dpnrepro.config.transfer import transfer_config, vtab_config


def _flops(arch: str, img: int, classes: int) -> float:
    return float(vit_forward_flops(arch_name(arch), img_size=img, num_classes=classes).total)


def vtab_cost(params: Params, *, eval_examples: dict[str, int] | None = None) -> dict:
    """{arch: {runs, train_images, train_flops, eval_flops}} of Table 3 (every task, stem, lr, seed)."""
    vp = params.vtab
    inp, _, train = vtab_config(params, vp.lrs[0])
    runs_per_task = len(vp.stems) * (len(vp.lrs) * len(vp.seeds) + (len(vp.seeds) if vp.retrain_on_train800val200 else 0))
    out = {}
    for arch in vp.archs:
        fwd = _flops(arch, inp.image_size, 100)
        n_eval = sum((eval_examples or {}).get(t, 0) for t in vp.tasks)
        out[arch] = {"runs": runs_per_task * len(vp.tasks),
                     "train_images": runs_per_task * len(vp.tasks) * train.steps * train.batch_size,
                     "train_flops": 3 * fwd * runs_per_task * len(vp.tasks) * train.steps * train.batch_size,
                     "eval_flops": fwd * len(vp.stems) * len(vp.seeds) * (len(vp.lrs) * 200 * len(vp.tasks) + n_eval)}
    return out


def scratch_cost(params: Params, *, eval_images: int = 0) -> dict:
    """{arch: {runs, train_images, train_flops, eval_flops}} of Table 7 (the three-step search per stem)."""
    sp = params.sun397_scratch
    inp, _, train = transfer_config(params, sp.recipe)
    g, a = sp.grid, sp.aug_grid
    step1 = len(g.lr) * len(g.weight_decay) * len(g.dropout)
    step2 = len(a.mixup) * len(a.randaug_magnitude) - (0.0 in a.mixup and 0 in a.randaug_magnitude)
    per_stem = (step1 + step2) * train.steps * train.batch_size + sp.longer_steps * train.batch_size
    out = {}
    for arch in sp.archs:
        fwd = _flops(arch, inp.image_size, 397)
        out[arch] = {"runs": len(sp.stems) * (step1 + step2 + 1), "train_images": len(sp.stems) * per_stem,
                     "train_flops": 3 * fwd * len(sp.stems) * per_stem,
                     "eval_flops": fwd * len(sp.stems) * (step1 + step2 + 1) * eval_images}
    return out
