"""Top-1 classification accuracy on a prepared split (big_vision's ``classification`` evaluator)."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from dpnrepro.data.loader import eval_batches
from dpnrepro.evaluation.base import RunEvaluator


# The most weights one evaluation pass holds (runs sharing a pass are scored batch by batch; more weights than
# this take further passes): a sweep of ViT-B/16s is ~6 runs a pass, a smoke sweep one pass.
PASS_PARAM_BYTES = 2 * 2**30


@torch.no_grad()
def evaluate_top1(model: torch.nn.Module, ds, input_cfg: dict, *, batch_size: int, device: torch.device,
                  desc: str = "eval", progress: bool = True) -> dict:
    """Top-1 accuracy (%) and example count of ``model`` on ``ds`` with the eval preprocessing. Inside a
    ``torchrun`` session (training/distributed.py) each rank scores its shard of the split and the counts
    are summed over ranks: every rank returns what one process returns (integers: exactly)."""
    return evaluate_top1_together([model], ds, input_cfg, batch_size=batch_size, device=device, desc=desc,
                                  progress=progress)[0]


@torch.no_grad()
def evaluate_top1_together(models: list[torch.nn.Module], ds, input_cfg: dict, *, batch_size: int,
                           device: torch.device, desc: str = "eval", progress: bool = True) -> list[dict]:
    """:func:`evaluate_top1` of each of ``models`` in one pass over ``ds``: every batch is decoded and
    preprocessed once and scored by each model in turn. A model sees the batches it would see alone, so each
    result is the one of its own pass; the split is streamed all the same (host memory holds a batch)."""
    from dpnrepro.training import distributed

    ctx = distributed.current()
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    for model in models:
        model.eval().to(device)
    loader = eval_batches(ds, input_cfg, batch_size, rank, world)
    correct = torch.zeros(len(models), dtype=torch.long, device=device)
    total = 0
    use_bf16 = device.type == "cuda"
    for images, labels in tqdm(loader, desc=desc, unit="batch", disable=not progress, leave=False):
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        for i, model in enumerate(models):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
                logits = model(images)
            correct[i] += (logits.argmax(-1) == labels).sum()
        total += labels.numel()
    if world > 1:
        counts = torch.cat([correct.cpu(), torch.tensor([total])]).to(device)
        torch.distributed.all_reduce(counts)  # a sum of integers: the same on every rank, in any order
        correct, total = counts[:-1], int(counts[-1])
    return [{"top1": 100.0 * int(c) / max(total, 1), "examples": total} for c in correct]


def evaluate_run(run_path, prepared_dir, input_cfg: dict, *, splits=("minival", "val"), batch_size: int = 256,
                 device: str = "auto", progress: bool = True) -> dict:
    """Rebuild a trained run from its directory (spec + safetensors) and score it on ``splits``."""
    return evaluate_runs([run_path], prepared_dir, input_cfg, splits=splits, batch_size=batch_size, device=device,
                         progress=progress)[0]


def evaluate_runs(run_paths, prepared_dir, input_cfg: dict, *, splits=("minival", "val"), batch_size: int = 256,
                  device: str = "auto", progress: bool = True) -> list[dict]:
    """:func:`evaluate_run` of each run in ``run_paths`` (in order), the runs scored together
    (:func:`evaluate_top1_together`) in passes of at most :data:`PASS_PARAM_BYTES` of weights."""
    from pathlib import Path

    from dpnrepro.artifacts import load_run_model, read_summary
    from dpnrepro.data.loader import load_split
    from dpnrepro.training.distributed import pick_device

    dev = pick_device(device)
    out = []
    for paths in _passes([Path(p) for p in run_paths]):
        models = [load_run_model(p) for p in paths]
        names = paths[0].name if len(paths) == 1 else f"{len(paths)} runs"
        scores = {split: evaluate_top1_together(models, load_split(prepared_dir, split), input_cfg,
                                                batch_size=batch_size, device=dev, desc=f"eval {names} {split}",
                                                progress=progress)
                  for split in splits}
        for i, path in enumerate(paths):
            summary = read_summary(path)
            out.append({**{k: summary[k] for k in ("arch", "stem", "seed", "variant", "hardware", "params_m") if k in summary},
                        **{f"{split}_top1": s[i]["top1"] for split, s in scores.items()},
                        **{f"{split}_examples": s[i]["examples"] for split, s in scores.items()}})
        del models
    return out


def _passes(paths: list) -> list[list]:
    """``paths`` cut, in order, into passes whose weights files sum to at most :data:`PASS_PARAM_BYTES`
    (a run alone may exceed it)."""
    from dpnrepro.artifacts import MODEL_FILE

    passes, size = [], 0
    for path in paths:
        weights = (path / MODEL_FILE).stat().st_size if (path / MODEL_FILE).exists() else 0
        if not passes or size + weights > PASS_PARAM_BYTES:
            passes.append([])
            size = 0
        passes[-1].append(path)
        size += weights
    return passes


class Evaluator(RunEvaluator):
    """The ``top1`` evaluator of the sweeps: :func:`evaluate_run` on minival and val (no settings); the runs
    of one call to :meth:`run_all` in shared passes (:func:`evaluate_runs`)."""

    def run(self, run_dir) -> dict:
        return self.run_all([run_dir])[0]

    def run_all(self, run_dirs) -> list[dict]:
        return evaluate_runs(run_dirs, self.prepared_dir, self.input_cfg, batch_size=self.batch_size,
                             device=self.device, progress=self.progress)
