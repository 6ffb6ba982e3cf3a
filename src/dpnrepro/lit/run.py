"""LiT runs from validated params: train every (tower, seed) text tower (stage `lit_train`; scored by
``lit/evaluate.py``, stage `lit_evaluate`). One process group per stage (``runtime.devices`` processes,
launched as every training stage is); image embeddings once per tower.

A LiT run lives in ``runs/lit/<sweep>/<arch>_<stem>_s<tower seed>/lit_s<seed>/``: ``text.safetensors``
(the text tower and ``log_temperature``) and ``lit.json`` (what it was trained on and with, including the
sha256 of the image tower's weights, checked unchanged after training and again before evaluation, and the
run's fingerprint) and ``dvclive/`` (loss, lr, temperature). Each run directory is written atomically on
its own, so a failing run leaves the finished ones in place; resumable state in ``checkpoints/lit/...``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from dpnrepro.artifacts import load_run_model, read_config, run_dir, run_name
from dpnrepro.config.lit import LitParams
from dpnrepro.errors import UserError
from dpnrepro.lit.towers import LiT, LockedImageTower, build_text_tower, state_digest, tokenizer

LIT_RUNS = Path("runs/lit")
LIT_CHECKPOINTS = Path("checkpoints/lit")  # resumable state per run (a local resume cache, as checkpoints/<sweep>)
TEXT_FILE, SPEC_FILE = "text.safetensors", "lit.json"


# The smoke towers are tiny (a 1-layer, 32-wide text transformer): a second intra-op thread only adds
# OpenMP synchronisation (measured on the shared 2-core VM: 20 ms vs 233 ms of CPU per LiT step). The LiT
# stages therefore run on one thread unless DPNREPRO_CPU_THREADS says otherwise; a fixed count either way,
# so the bits stay reproducible, and result labels (cli.hardware_label) name the count used.
LIT_CPU_THREADS = 1


def pin_lit_threads() -> int:
    from dpnrepro.determinism.cpu import pin_threads

    return pin_threads(LIT_CPU_THREADS)


def tower_runs(lit_params) -> list[tuple[str, str, str]]:
    """(sweep, arch, stem) of every locked image tower, in stage order."""
    t = lit_params.towers
    return [(sweep, arch, stem) for sweep in t.sweeps for arch in t.archs for stem in t.stems]


def lit_run_dir(sweep: str, arch: str, stem: str, tower_seed: int, seed: int, root: Path = LIT_RUNS) -> Path:
    return root / sweep / run_name(arch, stem, tower_seed) / f"lit_s{seed}"


def load_tower(path: Path) -> tuple[LockedImageTower, object]:
    """The locked tower of a pretraining run and its eval preprocessing (its own input config), to uint8:
    :func:`dpnrepro.lit.train.embed_images` scales each batch."""
    from dpnrepro.data.loader import build_transform

    tower = LockedImageTower(load_run_model(path))
    return tower, build_transform(read_config(path)["input"], train=False, uint8=True)


def build_lit(tower: LockedImageTower, lit_params, arch: str) -> LiT:
    t = lit_params.text[arch]
    text = build_text_tower(embed_dim=tower.embed_dim, context_length=lit_params.context_length,
                            width=t.width, heads=t.heads, layers=t.layers)
    return LiT(tower, text, lit_params.temperature_init)


def text_state(lit: LiT) -> dict[str, torch.Tensor]:
    """The trained text tower and ``log_temperature`` as saved tensors (``text.safetensors``)."""
    from dpnrepro.lit.train import TextState

    return {k: v.detach().contiguous().cpu() for k, v in TextState(lit).state_dict().items()}


def lit_session(params):
    """The launch and the one process group of the `lit_train` stage (training/launch.py): with
    ``runtime.devices > 1`` outside torchrun it starts the job's processes and exits; in each of them
    (or the only process) it yields the context every LiT run of the stage shares."""
    from dpnrepro.training import launch

    pin_lit_threads()
    return launch.stage_session(params.runtime, params.lit.train.device, params.lit.train.deterministic)


def run_fingerprint(lp, *, arch: str, tower_digest: str, seed: int, corpus: str) -> str:
    """Everything a LiT run's result depends on: a checkpoint or run directory with another is redone."""
    from dpnrepro.codedeps import ROOT, code_files
    from dpnrepro.training.trainer import fingerprint

    # the code `lit_train` runs (what its DVC fingerprint lists): after a code change a rerun retrains
    # instead of restoring a checkpoint written by the old code (training/trainer.py does the same for
    # the train stages, over stages/train.py's files)
    code = {rel: hashlib.sha256((ROOT / rel).read_bytes()).hexdigest() for rel in code_files("stages/train_lit.py")}
    return fingerprint(lp.data.model_dump(), lp.context_length, lp.text[arch].model_dump(), lp.temperature_init,
                       lp.train.model_dump(), tower_digest, seed, corpus, code)


def _complete(out: Path, fp: str) -> bool:
    import json

    try:
        return json.loads((out / SPEC_FILE).read_text()).get("fingerprint") == fp and (out / TEXT_FILE).exists()
    except (OSError, ValueError):
        return False


def train_lit(params, *, ctx=None, progress: bool = True) -> list[Path]:
    """Train every LiT run of ``params.lit`` into its own ``runs/lit/...`` directory (each written
    atomically by rank 0; a complete one with the same fingerprint is kept, not retrained), resumable
    from ``checkpoints/lit/...``. Under torchrun every rank trains its shard of each global batch.
    ``ctx``: the stage's session (:func:`lit_session`); without one, a session of this call's own."""
    from dpnrepro.lit.data import load_caption_corpus
    from dpnrepro.lit.train import embed_images
    from dpnrepro.training import distributed

    lp: LitParams = params.lit
    cfg = lp.train
    pin_lit_threads()
    distributed.check_layout(cfg.batch_size, params.runtime.model_copy(update={"accum_steps": 1}),
                             distributed.env_world()[1])
    corpus = load_caption_corpus(lp.data.source, split=lp.data.split, image_column=lp.data.image_column,
                                 text_column=lp.data.text_column, examples=lp.data.examples)
    if len(corpus) < cfg.batch_size:
        raise UserError(f"image-caption corpus has {len(corpus)} pairs, fewer than lit.train.batch_size "
                        f"({cfg.batch_size})")
    tokens = tokenizer(lp.context_length)(corpus["text"])
    corpus_id = hashlib.sha256(tokens.numpy().tobytes() + getattr(corpus, "_fingerprint", "").encode()).hexdigest()
    images = corpus["image"]
    written = []
    with distributed.joined(ctx, cfg.device, cfg.deterministic) as ctx:
        for sweep, arch, stem in tower_runs(lp):
            path = run_dir(sweep, arch, stem, lp.towers.seed)
            tower, transform = load_tower(path)
            digest = state_digest(tower)
            image_emb = None
            for seed in lp.seeds:
                out = lit_run_dir(sweep, arch, stem, lp.towers.seed, seed)
                fp = run_fingerprint(lp, arch=arch, tower_digest=digest, seed=seed, corpus=corpus_id)
                if distributed.broadcast_object(ctx, _complete(out, fp) if ctx.is_main else None):
                    if ctx.is_main:
                        print(f"{out}: complete, kept")
                    written.append(out)
                    continue
                if image_emb is None:
                    image_emb = embed_images(tower, images, transform, batch_size=params.runtime.eval_batch_size,
                                             device=ctx.device, desc=f"embed {sweep}/{path.name}",
                                             progress=progress and ctx.is_main)
                job = LitJob(params, sweep=sweep, arch=arch, stem=stem, seed=seed, tower=tower, tower_path=path,
                             digest=digest, fingerprint=fp, pairs=len(corpus))
                written.append(job.run(image_emb, tokens, ctx, progress=progress))
                distributed.barrier(ctx)  # the other ranks go on once rank 0 has written the run
    return written


class LitJob:
    """One (tower, seed) LiT run: trains (every rank) and writes its run directory (rank 0, atomically)."""

    def __init__(self, params, *, sweep, arch, stem, seed, tower, tower_path, digest, fingerprint, pairs):
        self.params, self.lp = params, params.lit
        self.sweep, self.arch, self.stem, self.seed = sweep, arch, stem, seed
        self.tower, self.tower_path, self.digest, self.fp, self.pairs = tower, tower_path, digest, fingerprint, pairs
        self.out = lit_run_dir(sweep, arch, stem, self.lp.towers.seed, seed)
        self.ckpt = LIT_CHECKPOINTS / self.out.relative_to(LIT_RUNS)

    def fit(self, image_emb, tokens, ctx, live, progress):
        from dpnrepro.lit.train import train_text_tower

        torch.manual_seed(self.seed)
        lit = build_lit(self.tower, self.lp, self.arch)
        rt = self.params.runtime
        stats = train_text_tower(lit, image_emb, tokens, self.lp.train, seed=self.seed, device=ctx.device,
                                 progress=progress, desc=f"lit {self.sweep}/{self.tower_path.name} s{self.seed}",
                                 ctx=ctx, chunk_size=self.lp.runtime.chunk_size, ckpt_dir=self.ckpt,
                                 fingerprint=self.fp, ckpt_every=rt.ckpt_every, log_every=rt.log_every, live=live)
        if state_digest(self.tower) != self.digest:
            raise RuntimeError(f"the locked image tower {self.tower_path} changed during LiT training")
        return lit, stats

    def run(self, image_emb, tokens, ctx, *, progress: bool = True) -> Path:
        from dvclive import Live
        from safetensors.torch import save_file

        from dpnrepro.cli import hardware_label
        from dpnrepro.io import atomic_dir, write_json_atomic

        if not ctx.is_main:
            self.fit(image_emb, tokens, ctx, None, False)
            return self.out
        lp, cfg = self.lp, self.lp.train
        with atomic_dir(self.out) as tmp:
            with Live(dir=str(tmp / "dvclive"), save_dvc_exp=False, dvcyaml=None, report=None) as live:
                lit, stats = self.fit(image_emb, tokens, ctx, live, progress)
            save_file(text_state(lit), str(tmp / TEXT_FILE))
            write_json_atomic(tmp / SPEC_FILE, {
                "profile": self.params.profile, "sweep": self.sweep, "arch": self.arch, "stem": self.stem,
                "tower": str(self.tower_path), "tower_seed": lp.towers.seed, "tower_sha256": self.digest,
                "seed": self.seed, "embed_dim": self.tower.embed_dim, "context_length": lp.context_length,
                "text": lp.text[self.arch].model_dump(), "temperature_init": lp.temperature_init,
                "train": cfg.model_dump(), "data": {**lp.data.model_dump(), "pairs": self.pairs},
                "hardware": hardware_label(), "fingerprint": self.fp, **stats})
        print(f"{self.out}: loss {stats['loss_first']:.3f} -> {stats['loss_last']:.3f}, t {stats['temperature']:.2f}")
        return self.out


def describe_lit(lp) -> str:
    """One line saying how the LiT runs were trained (the report prints it)."""
    t = lp.train
    texts = "; ".join(f"{a}: {v.layers} layer{'s' if v.layers > 1 else ''}, width {v.width}, {v.heads} heads" for a, v in lp.text.items())
    return (f"text tower from scratch (open_clip TextTransformer, BPE, {lp.context_length} tokens; {texts}), "
            f"image tower locked; {t.optimizer} lr {t.lr:g}, wd {t.weight_decay:g} (decoupled, kernels only), "
            f"batch {t.batch_size}, {t.steps} steps ({t.warmup_steps} warm-up, {t.schedule}), clip {t.grad_clip:g}, "
            f"temperature init {lp.temperature_init:g} (learned), symmetric softmax contrastive loss, "
            f"L2-normalised embeddings; corpus {lp.data.source} ({lp.data.split})")
