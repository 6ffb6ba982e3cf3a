"""Table 3: VTAB-1k fine-tuning of our pretraining runs (Sec. 6.1, appendix E), task by task.

For each task, arch and stem, the run ``runs/table1/<arch>_<stem>_s<init_seed>`` is fine-tuned (head
re-initialised, position embeddings resampled: training/finetune.py) with the appendix E recipe, through
the one trainer (training/trainer.py), for every lr × seed of the VTAB-1k protocol
(transfer/protocol.py). Resumable: each fine-tune keeps its state in
``checkpoints/vtab/<task>/<arch>_<stem>/<split>_lr<lr>_s<seed>``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tqdm.auto import tqdm

from dpnrepro.artifacts import head_bias_text, read_spec, run_dir
from dpnrepro.config.runtime import RuntimeParams
from dpnrepro.config.params import Params
from dpnrepro.config.transfer import VTAB_INIT_SWEEP, vtab_config
from dpnrepro.errors import ParamsError
from dpnrepro.transfer.protocol import vtab_protocol
from dpnrepro.transfer.sources import decoded_if_small, load_source, task_classes, test_chance, vtab_splits
from dpnrepro.transfer.tasks import get_task

CKPT_ROOT = Path("checkpoints") / "vtab"


def task_slug(name: str) -> str:
    return name.lower().replace("-", "_")


def recipe_line(inp, model, train) -> str:
    return (f"{train.optimizer} (lr swept), wd {train.weight_decay:g}, batch {train.batch_size}, {train.steps} steps "
            f"({train.warmup_steps} warm-up, {train.schedule}), clip {train.grad_clip:g}, {train.loss}, "
            f"{inp.image_size}px{' inception crop (train),' if inp.inception_crop else ''} "
            f"{'whole frame resized (squash)' if inp.squash else 'resize_small | central crop'}"
            f"{', flip' if inp.flip else ''}, head re-initialised (bias {head_bias_text(model.head_bias_init)})")


def run_vtab(params: Params, *, ctx=None, progress: bool = True) -> dict:
    """Every task × arch × stem of ``params.vtab``; returns the metrics (``metrics/vtab.json``).
    ``ctx``: the stage's session (launch.metrics_stage), in which every fine-tune trains."""
    from dpnrepro.cli import hardware_label
    from dpnrepro.evaluation.classification import evaluate_top1
    from dpnrepro.training.distributed import pick_device
    from dpnrepro.training.finetune import pretrained_init
    from dpnrepro.training.trainer import train_classifier

    vp = params.vtab
    if vp is None:
        raise ParamsError("params.yaml has no `vtab` section (Table 3)")
    inp, model, train = vtab_config(params, vp.lrs[0])
    runtime: RuntimeParams = params.runtime
    device = pick_device(train.device)
    eval_cfg = {**inp.model_dump(), "workers": runtime.workers}
    tasks = {name: get_task(name) for name in vp.tasks}  # unknown names fail before any work
    out = {"profile": params.profile, "hardware": hardware_label(), "init_from": VTAB_INIT_SWEEP,
           "init_seed": vp.init_seed, "lrs": vp.lrs, "seeds": vp.seeds,
           "retrain_on_train800val200": vp.retrain_on_train800val200,
           "recipe": recipe_line(inp, model, train), "tasks": {}}
    bar = tqdm(total=len(tasks) * len(vp.archs) * len(vp.stems) * len(vp.seeds)
               * (len(vp.lrs) + vp.retrain_on_train800val200),
               desc="vtab fine-tunes", unit="run", disable=not progress, dynamic_ncols=True)
    for name, task in tasks.items():
        src = vp.tasks[name]
        classes = task_classes(task, src)
        # the fine-tune splits (at most 1000 examples) in memory; test, scored once per model, streamed
        splits = {k: v if k == "test" else decoded_if_small(v) for k, v in
                  vtab_splits(task, load_source(src.format, src.source), num_classes=classes).items()}
        entry = {"group": task.group, "num_classes": classes, "reference": task.reference,
                 "stand_in": src.stand_in, "examples": {k: len(v) for k, v in splits.items()},
                 **test_chance(splits["test"]["label"], classes), "runs": {}}
        for arch in vp.archs:
            for stem in vp.stems:
                pretrained = run_dir(VTAB_INIT_SWEEP, arch, stem, vp.init_seed)
                base = read_spec(pretrained)
                if base.in_chans != inp.channels:
                    raise ParamsError(f"vtab: input.channels {inp.channels} but {pretrained} takes {base.in_chans}")
                spec = replace(base, num_classes=classes, img_size=inp.image_size,
                               head_bias_init=model.head_bias(classes), pos_drop_rate=model.dropout,
                               proj_drop_rate=model.dropout, drop_path_rate=model.stoch_depth)
                init = pretrained_init(pretrained)

                def fit(split, hp, seed, spec=spec, init=init, arch=arch, stem=stem):
                    _, _, cfg = vtab_config(params, hp["lr"])
                    ckpt = CKPT_ROOT / task_slug(name) / f"{arch}_{stem}" / f"{split}_lr{hp['lr']:g}_s{seed}"
                    trained = train_classifier(spec, splits[split], inp, cfg, seed=seed, ckpt_dir=ckpt,
                                               runtime=runtime, init=init, progress=False, ctx=ctx)
                    bar.update(1)
                    return trained

                def score(trained, split):
                    return evaluate_top1(trained, splits[split], eval_cfg, batch_size=runtime.eval_batch_size,
                                         device=device, progress=False)["top1"]

                bar.set_postfix(task=name, stem=stem)
                entry["runs"][f"{arch}_{stem}"] = {"arch": arch, "stem": stem, **vtab_protocol(
                    vp.lrs, vp.seeds, fit, score, retrain_on_train800val200=vp.retrain_on_train800val200)}
        out["tasks"][name] = entry
    bar.close()
    return out
