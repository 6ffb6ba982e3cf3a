"""Top-1 classification accuracy on a prepared split (big_vision's ``classification`` evaluator)."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from dpnrepro.data.loader import eval_batches
from dpnrepro.evaluation.base import RunEvaluator


@torch.no_grad()
def evaluate_top1(model: torch.nn.Module, ds, input_cfg: dict, *, batch_size: int, device: torch.device,
                  desc: str = "eval", progress: bool = True) -> dict:
    """Top-1 accuracy (%) and example count of ``model`` on ``ds`` with the eval preprocessing. Inside a
    ``torchrun`` session (training/distributed.py) each rank scores its shard of the split and the counts
    are summed over ranks: every rank returns what one process returns (integers: exactly)."""
    from dpnrepro.training import distributed

    ctx = distributed.current()
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    model.eval().to(device)
    loader = eval_batches(ds, input_cfg, batch_size, rank, world)
    correct = torch.zeros((), dtype=torch.long, device=device)
    total = 0
    use_bf16 = device.type == "cuda"
    for images, labels in tqdm(loader, desc=desc, unit="batch", disable=not progress, leave=False):
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(images)
        correct += (logits.argmax(-1) == labels).sum()
        total += labels.numel()
    if world > 1:
        counts = torch.stack([correct.cpu(), torch.tensor(total)]).to(device)
        torch.distributed.all_reduce(counts)  # a sum of integers: the same on every rank, in any order
        correct, total = counts[0], int(counts[1])
    return {"top1": 100.0 * int(correct) / max(total, 1), "examples": total}


def evaluate_run(run_path, prepared_dir, input_cfg: dict, *, splits=("minival", "val"), batch_size: int = 256,
                 device: str = "auto", progress: bool = True) -> dict:
    """Rebuild a trained run from its directory (spec + safetensors) and score it on ``splits``."""
    from pathlib import Path

    from dpnrepro.data.loader import load_split
    from dpnrepro.artifacts import load_run_model, read_summary
    from dpnrepro.training.distributed import pick_device

    run_path = Path(run_path)
    model = load_run_model(run_path)
    dev = pick_device(device)
    summary = read_summary(run_path)
    scores = {
        split: evaluate_top1(model, load_split(prepared_dir, split), input_cfg, batch_size=batch_size,
                             device=dev, desc=f"eval {run_path.name} {split}", progress=progress)
        for split in splits
    }
    return {**{k: summary[k] for k in ("arch", "stem", "seed", "variant", "hardware", "params_m") if k in summary},
            **{f"{split}_top1": s["top1"] for split, s in scores.items()},
            **{f"{split}_examples": s["examples"] for split, s in scores.items()}}


class Evaluator(RunEvaluator):
    """The ``top1`` evaluator of the sweeps: :func:`evaluate_run` on minival and val (no settings)."""

    def run(self, run_dir) -> dict:
        return evaluate_run(run_dir, self.prepared_dir, self.input_cfg, batch_size=self.batch_size,
                            device=self.device, progress=self.progress)
