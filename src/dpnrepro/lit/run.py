"""LiT runs from validated params: train every (tower, seed) text tower (stage `lit_train`; scored by
``lit/evaluate.py``, stage `lit_evaluate`). One process per stage; image embeddings once per tower.

A LiT run lives in ``runs/lit/<sweep>/<arch>_<stem>_s<tower seed>/lit_s<seed>/``: ``text.safetensors``
(the text tower and ``log_temperature``) and ``lit.json`` (what it was trained on and with, including the
sha256 of the image tower's weights, checked unchanged after training and again before evaluation).
"""

from __future__ import annotations

from pathlib import Path

import torch
from dpnrepro.artifacts import load_run_model, read_config, run_dir, run_name
from dpnrepro.errors import UserError
from dpnrepro.lit.towers import LiT, LockedImageTower, build_text_tower, state_digest, tokenizer

LIT_RUNS = Path("runs/lit")
TEXT_FILE, SPEC_FILE = "text.safetensors", "lit.json"


# The smoke towers are tiny (a 1-layer, 32-wide text transformer): a second intra-op thread only adds
# OpenMP synchronisation (measured on the shared 2-core VM: 20 ms vs 233 ms of CPU per LiT step). The LiT
# stages therefore run on one thread unless DPNREPRO_CPU_THREADS says otherwise; a fixed count either way,
# so the bits stay reproducible, and result labels (cli.hardware_label) name the count used.
LIT_CPU_THREADS = 1


def pin_lit_threads() -> int:
    import os

    from dpnrepro.cpu_determinism import THREADS_ENV

    n = int(os.environ.get(THREADS_ENV, LIT_CPU_THREADS))
    torch.set_num_threads(n)
    return n


def tower_runs(lit_params) -> list[tuple[str, str, str]]:
    """(sweep, arch, stem) of every locked image tower, in stage order."""
    t = lit_params.towers
    return [(sweep, arch, stem) for sweep in t.sweeps for arch in t.archs for stem in t.stems]


def lit_run_dir(sweep: str, arch: str, stem: str, tower_seed: int, seed: int, root: Path = LIT_RUNS) -> Path:
    return root / sweep / run_name(arch, stem, tower_seed) / f"lit_s{seed}"


def load_tower(path: Path) -> tuple[LockedImageTower, object]:
    """The locked tower of a pretraining run and its eval preprocessing (its own input config)."""
    from dpnrepro.data.loader import build_transform

    tower = LockedImageTower(load_run_model(path))
    return tower, build_transform(read_config(path)["input"], train=False)


def build_lit(tower: LockedImageTower, lit_params, arch: str) -> LiT:
    t = lit_params.text[arch]
    text = build_text_tower(embed_dim=tower.embed_dim, context_length=lit_params.context_length,
                            width=t.width, heads=t.heads, layers=t.layers)
    return LiT(tower, text, lit_params.temperature_init)


def text_state(lit: LiT) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous().cpu() for k, v in lit.state_dict().items() if not k.startswith("image.")}


def train_lit(params, *, progress: bool = True) -> list[Path]:
    """Train every LiT run of ``params.lit`` into ``runs/lit`` (atomically replaced)."""
    from safetensors.torch import save_file

    from dpnrepro.cli import hardware_label
    from dpnrepro.io import atomic_dir, write_json_atomic
    from dpnrepro.lit.data import load_caption_corpus
    from dpnrepro.lit.train import embed_images, train_text_tower
    from dpnrepro.training import determinism
    from dpnrepro.training.distributed import resolve_device

    lp = params.lit
    cfg = lp.train
    pin_lit_threads()
    determinism.configure(cfg.deterministic)
    device = resolve_device(cfg.device)
    corpus = load_caption_corpus(lp.data.source, split=lp.data.split, image_column=lp.data.image_column,
                                 text_column=lp.data.text_column, examples=lp.data.examples)
    if len(corpus) < cfg.batch_size:
        raise UserError(f"image-caption corpus has {len(corpus)} pairs, fewer than lit.train.batch_size "
                        f"({cfg.batch_size})")
    tokens = tokenizer(lp.context_length)(corpus["text"])
    images = corpus["image"]
    written = []
    with atomic_dir(LIT_RUNS) as tmp:
        for sweep, arch, stem in tower_runs(lp):
            path = run_dir(sweep, arch, stem, lp.towers.seed)
            tower, transform = load_tower(path)
            digest = state_digest(tower)
            image_emb = embed_images(tower, images, transform, batch_size=params.runtime.eval_batch_size,
                                     device=device, desc=f"embed {sweep}/{path.name}", progress=progress)
            for seed in lp.seeds:
                torch.manual_seed(seed)
                lit = build_lit(tower, lp, arch)
                stats = train_text_tower(lit, image_emb, tokens, cfg, seed=seed, device=device, progress=progress,
                                         desc=f"lit {sweep}/{path.name} s{seed}")
                if state_digest(tower) != digest:
                    raise RuntimeError(f"the locked image tower {path} changed during LiT training")
                out = lit_run_dir(sweep, arch, stem, lp.towers.seed, seed, tmp)
                out.mkdir(parents=True)
                save_file(text_state(lit), str(out / TEXT_FILE))
                write_json_atomic(out / SPEC_FILE, {
                    "profile": params.profile, "sweep": sweep, "arch": arch, "stem": stem,
                    "tower": str(path), "tower_seed": lp.towers.seed, "tower_sha256": digest, "seed": seed,
                    "embed_dim": tower.embed_dim, "context_length": lp.context_length,
                    "text": lp.text[arch].model_dump(), "temperature_init": lp.temperature_init,
                    "train": cfg.model_dump(), "data": {**lp.data.model_dump(), "pairs": len(corpus)},
                    "hardware": hardware_label(), **stats})
                written.append(lit_run_dir(sweep, arch, stem, lp.towers.seed, seed))
                print(f"{written[-1]}: loss {stats['loss_first']:.3f} -> {stats['loss_last']:.3f}, "
                      f"t {stats['temperature']:.2f}")
    return written


def describe_lit(lp) -> str:
    """One line saying how the LiT runs were trained (the report prints it)."""
    t = lp.train
    texts = "; ".join(f"{a}: {v.layers} layer{'s' if v.layers > 1 else ''}, width {v.width}, {v.heads} heads" for a, v in lp.text.items())
    return (f"text tower from scratch (open_clip TextTransformer, BPE, {lp.context_length} tokens; {texts}), "
            f"image tower locked; {t.optimizer} lr {t.lr:g}, wd {t.weight_decay:g} (decoupled, kernels only), "
            f"batch {t.batch_size}, {t.steps} steps ({t.warmup_steps} warm-up, {t.schedule}), clip {t.grad_clip:g}, "
            f"temperature init {lp.temperature_init:g} (learned), symmetric softmax contrastive loss, "
            f"L2-normalised embeddings; corpus {lp.data.source} ({lp.data.split})")
