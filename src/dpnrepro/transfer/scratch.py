"""Table 7 (appendix F): ViTs trained from scratch on Sun397, base vs DPN, through the one trainer.

The three-step search of appendix F (transfer/protocol.py ``scratch_search``) per arch and stem:
lr × weight decay × dropout without augmentation (the top-level ``input``'s RandAugment and mixup are not
inherited: :func:`search_input`), then mixup × RandAugment magnitude with the winner, then the winner trained
for ``longer_steps``; each step chosen on Sun397's validation split, each row reported on its test split
(the task adapter's full ``train`` / ``val`` / ``test``, transfer/tasks.py). Resumable: each run keeps its
state in ``checkpoints/sun397_scratch/<arch>_<stem>/<hparams>``.
"""

from __future__ import annotations

from pathlib import Path

from tqdm.auto import tqdm

from dpnrepro.artifacts import ModelSpec
from dpnrepro.config.core import arch_name
from dpnrepro.config.params import Params
from dpnrepro.config.transfer import transfer_config
from dpnrepro.errors import ParamsError
from dpnrepro.transfer.protocol import scratch_search
from dpnrepro.transfer.sources import decoded_if_small, load_source, task_classes, test_chance, vtab_splits
from dpnrepro.transfer.tasks import get_task

CKPT_ROOT = Path("checkpoints") / "sun397_scratch"
TASK = "Sun397"


def randaug_spec(magnitude: int) -> str:
    """big_vision's ``randaug(2, m)`` (appendix C's spelling); magnitude 0 = no RandAugment."""
    return f"rand-n2-m{magnitude}-tbigvision" if magnitude else ""


def search_input(inp, hp: dict):
    """The input section of one run of the search: the recipe's, with the augmentation appendix F sets.
    Step 1 (lr × weight decay × dropout) trains without augmentation, whatever the top-level ``input``
    says (the full profile's is AugReg's RandAugment + mixup); step 2 trains with its candidate's mixup
    and RandAugment magnitude; step 3 with step 2's winner's."""
    return inp.model_copy(update={"mixup": hp.get("mixup", 0.0),
                                  "randaug": randaug_spec(hp.get("randaug_magnitude", 0))})


def without_augmentation(hp: dict) -> dict:
    """``hp`` with mixup 0 / RandAugment 0 dropped: step 2's no-augmentation candidate is step 1's winner."""
    return {k: v for k, v in hp.items() if not (k in ("mixup", "randaug_magnitude") and v == 0)}


def hp_name(hp: dict) -> str:
    short = {"lr": "lr", "weight_decay": "wd", "dropout": "do", "mixup": "mix", "randaug_magnitude": "ra",
             "steps": "steps"}
    return "_".join(f"{short[k]}{hp[k]:g}" for k in sorted(hp))


def grids(sp) -> tuple[list[dict], list[dict], dict]:
    g, a = sp.grid, sp.aug_grid
    grid = [{"lr": lr, "weight_decay": wd, "dropout": do} for lr in g.lr for wd in g.weight_decay for do in g.dropout]
    aug = [{"mixup": mx, "randaug_magnitude": m} for mx in a.mixup for m in a.randaug_magnitude]
    return grid, aug, {"steps": sp.longer_steps}


def run_scratch(params: Params, *, ctx=None, progress: bool = True) -> dict:
    """Every arch × stem of ``params.sun397_scratch``; returns the metrics (``metrics/sun397_scratch.json``).
    ``ctx``: the stage's session (launch.metrics_stage), in which every fine-tune trains."""
    from dpnrepro.cli import hardware_label
    from dpnrepro.evaluation.classification import evaluate_top1
    from dpnrepro.training.distributed import pick_device
    from dpnrepro.training.trainer import train_classifier

    sp = params.sun397_scratch
    if sp is None:
        raise ParamsError("params.yaml has no `sun397_scratch` section (Table 7)")
    task = get_task(TASK)
    classes = task_classes(task, sp.data)
    # train and val (read by every candidate) in memory when they fit; test, scored once per step, streamed
    splits = {k: v if k == "test" else decoded_if_small(v) for k, v in
              vtab_splits(task, load_source(sp.data.format, sp.data.source), names=("train", "val", "test"),
                          num_classes=classes).items()}
    inp0, model, train0 = transfer_config(params, sp.recipe)
    runtime = params.runtime
    device = pick_device(train0.device)
    grid, aug, longer = grids(sp)
    out = {"profile": params.profile, "hardware": hardware_label(), "task": TASK, "stand_in": sp.data.stand_in,
           "num_classes": classes, "examples": {k: len(v) for k, v in splits.items()},
           **test_chance(splits["test"]["label"], classes), "seed": sp.seed,
           "recipe": (f"{train0.optimizer}, batch {train0.batch_size}, {train0.steps} steps ({train0.warmup_steps} "
                      f"warm-up, {train0.schedule}), clip {train0.grad_clip:g}, {train0.loss}, {inp0.image_size}px"),
           "grid": grid, "aug_grid": aug, "longer": longer, "runs": {}}
    per_variant = len(grid) + len({repr(sorted(without_augmentation(a).items())) for a in aug}) + 1 - any(
        not without_augmentation(a) for a in aug)
    bar = tqdm(total=len(sp.archs) * len(sp.stems) * per_variant, desc="sun397 from scratch", unit="run",
               disable=not progress, dynamic_ncols=True)
    for arch in sp.archs:
        for stem in sp.stems:
            def fit(split, hp, seed, arch=arch, stem=stem):
                inp, _, cfg = transfer_config(params, sp.recipe, **{k: hp[k] for k in ("lr", "weight_decay", "steps")
                                                                   if k in hp})
                inp = search_input(inp, hp)
                dropout = hp.get("dropout", model.dropout)
                spec = ModelSpec(arch=arch_name(arch), stem=stem, placement=model.placement,
                                 num_classes=classes, img_size=inp.image_size, in_chans=inp.channels,
                                 pool=model.pool, rep_size=model.rep_size, head_bias_init=model.head_bias(classes),
                                 pos_drop_rate=dropout, proj_drop_rate=dropout, drop_path_rate=model.stoch_depth,
                                 posemb=model.posemb)
                trained = train_classifier(spec, splits[split], inp, cfg, seed=seed, runtime=runtime, progress=False,
                                           ckpt_dir=CKPT_ROOT / f"{arch}_{stem}" / hp_name(hp), ctx=ctx)
                bar.update(1)
                return trained

            def score(trained, split):
                return evaluate_top1(trained, splits[split], {**inp0.model_dump(), "workers": runtime.workers},
                                     batch_size=runtime.eval_batch_size, device=device, progress=False)["top1"]

            bar.set_postfix(arch=arch, stem=stem)
            out["runs"][f"{arch}_{stem}"] = {"arch": arch, "stem": stem,
                                             "rows": scratch_search(grid, aug, longer, sp.seed, fit, score,
                                                                                     canonical=without_augmentation)}
    bar.close()
    return out
