"""A LiT text-tower training job for tests/test_lit_distributed.py, started as a plain process: with
``--devices 2`` it spreads itself over 2 gloo processes through the stage launch path
(training/launch.py: torchrun's agent in process), as `lit_train` does.

    python tests/lit_worker.py OUT --devices N [--steps S] [--chunk C] [--grads | --stage]

Rank 0 writes ``OUT/text.safetensors`` and ``OUT/history.json`` (or, with ``--grads``, the gradients of
the first step in ``OUT/grads.safetensors``). Checkpoints go to ``OUT/ckpt`` (resumed when present).
``--stage``: the `lit_train` stage's own code (``lit_session`` + ``train_lit``) in OUT as the project
directory, on :func:`stage_params` with the tower and corpus of :func:`fake_stage_inputs`.
"""

from __future__ import annotations

import dpnrepro  # noqa: F401,I001  (first: its CPU pins must be in place before numpy and torch load)

import argparse
import json
from pathlib import Path

import torch

from dpnrepro.cli import stage


def tiny_problem(pairs: int = 64):
    """A tiny LiT (locked Mu/7 DPN tower, 1-layer text tower) and a synthetic corpus: unit image
    embeddings and random captions of 3-14 BPE tokens between <start> and <end>."""
    from dpnrepro.lit.towers import LiT, LockedImageTower, build_text_tower, l2_normalize
    from dpnrepro.models import build_vit

    torch.manual_seed(0)
    vit = build_vit("Mu/7", stem="dpn", num_classes=14, img_size=28, in_chans=1, rep_size=True)
    tower = LockedImageTower(vit)
    text = build_text_tower(embed_dim=tower.embed_dim, context_length=16, width=32, heads=2, layers=1)
    lit = LiT(tower, text, temperature_init=10.0)
    g = torch.Generator().manual_seed(1)
    zimg = l2_normalize(torch.randn(pairs, tower.embed_dim, generator=g))
    tokens = torch.zeros(pairs, 16, dtype=torch.long)
    for i in range(pairs):
        n = int(torch.randint(3, 15, (1,), generator=g))
        tokens[i, 0], tokens[i, n + 1] = 49406, 49407
        tokens[i, 1:n + 1] = torch.randint(1, 49000, (n,), generator=g)
    return lit, zimg, tokens


def train_cfg(steps: int, batch: int = 32):
    from dpnrepro.config.lit import LitTrainParams

    return LitTrainParams(lr=3e-3, weight_decay=0.01, batch_size=batch, steps=steps, warmup_steps=2,
                          grad_clip=1.0, device="cpu")


class Corpus:
    """What train_lit reads of a caption corpus: ``len``, ``["image"]``, ``["text"]``."""

    def __init__(self, images, texts):
        self.cols = {"image": images, "text": texts}

    def __len__(self):
        return len(self.cols["text"])

    def __getitem__(self, key):
        return self.cols[key]


def fake_stage_inputs():
    """(corpus, load_tower): 48 random 28-px grey images with 4 captions, and tiny_problem's locked tower."""
    import numpy as np
    import torchvision.transforms.functional as TF
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8)) for _ in range(48)]
    texts = [f"a photo of a {w}" for w in ["shoe", "bag", "coat", "shirt"] * 12]
    return Corpus(images, texts), lambda path: (tiny_problem()[0].image, TF.to_tensor)


def stage_params(devices: int = 1) -> dict:
    """The repo's params with 2 LiT runs on one tower (6 steps, batch 16, a checkpoint every 2 steps)."""
    import yaml

    p = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    p["lit"]["towers"] = {"sweeps": ["jft_220k"], "archs": ["Mu-7"], "stems": ["dpn"], "seed": 0}
    p["lit"]["seeds"] = [0, 1]
    p["lit"]["train"].update(batch_size=16, steps=6, warmup_steps=1)
    p["runtime"].update(ckpt_every=2, log_every=1, devices=devices)
    return p


def run_stage(out: Path, devices: int) -> None:
    import os

    import yaml

    from dpnrepro.config.params import load_params
    from dpnrepro.lit import data, run

    os.chdir(out)
    if "WORLD_SIZE" not in os.environ:
        (out / "params.yaml").write_text(yaml.safe_dump(stage_params(devices)))
    corpus, load_tower = fake_stage_inputs()
    data.load_caption_corpus, run.load_tower = (lambda *a, **k: corpus), load_tower
    params = load_params()
    with run.lit_session(params) as ctx:
        run.train_lit(params, ctx=ctx, progress=False)


@stage
def main() -> None:
    from safetensors.torch import save_file

    from dpnrepro.config.runtime import RuntimeParams
    from dpnrepro.lit.run import text_state
    from dpnrepro.lit.train import _sync_gradients, lit_loss, text_step, train_text_tower
    from dpnrepro.training import launch

    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=0)
    ap.add_argument("--grads", action="store_true")
    ap.add_argument("--stage", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.stage:
        return run_stage(args.out.resolve(), args.devices)
    with launch.stage_session(RuntimeParams(devices=args.devices), "cpu") as ctx:
        lit, zimg, tokens = tiny_problem()
        cfg = train_cfg(args.steps)
        if args.grads:  # one step on the first global batch: this rank's shard, the gradient averaged
            local = cfg.batch_size // ctx.world_size
            shard = slice(ctx.rank * local, (ctx.rank + 1) * local)
            loss = text_step(lit, zimg[shard], tokens[shard], lit_loss(ctx), chunk_size=args.chunk)
            params = [p for _, p in lit.trainable_named_parameters()]
            if ctx.distributed:
                _sync_gradients(params, ctx)
            grads = {n: p.grad.contiguous() for n, p in lit.trainable_named_parameters()}
            if ctx.is_main:
                save_file({**grads, "loss": loss.reshape(1)}, str(args.out / "grads.safetensors"))
            return
        stats = train_text_tower(lit, zimg, tokens, cfg, seed=0, device=ctx.device, progress=False, ctx=ctx,
                                 chunk_size=args.chunk, ckpt_dir=args.out / "ckpt", fingerprint="tiny",
                                 ckpt_every=2, log_every=1)
        if ctx.is_main:
            save_file(text_state(lit), str(args.out / "text.safetensors"))
            (args.out / "history.json").write_text(json.dumps(stats))


if __name__ == "__main__":
    main()
