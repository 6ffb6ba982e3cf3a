"""Zero-shot scores of every trained LiT run (stage `lit_evaluate`): each run rebuilt on its locked tower
(refused if the tower's weights are not the ones it was trained on), every zero-shot set embedded once per
tower, class embeddings per run and classifier (``evaluation/zeroshot.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dpnrepro.artifacts import run_dir
from dpnrepro.config.lit import LitParams
from dpnrepro.errors import CheckpointError
from dpnrepro.lit.run import (SPEC_FILE, TEXT_FILE, build_lit, describe_lit, lit_run_dir, load_tower, pin_lit_threads,
                              tower_runs)
from dpnrepro.lit.towers import LiT, LockedImageTower, state_digest, tokenizer


def load_lit_run(path: Path, tower: LockedImageTower, tower_digest: str, lit_params) -> tuple[LiT, dict]:
    """Rebuild a trained LiT run on ``tower``, refusing it if the tower is not the one it was trained on."""
    from safetensors.torch import load_file

    spec = json.loads((path / SPEC_FILE).read_text())
    if spec["tower_sha256"] != tower_digest:
        raise CheckpointError(f"{path} was trained on another image tower than {spec['tower']} holds now; "
                              "rerun `dvc repro lit_train`")
    lit = build_lit(tower, lit_params, spec["arch"])
    missing, unexpected = lit.load_state_dict(load_file(str(path / TEXT_FILE)), strict=False)
    if unexpected or [k for k in missing if not k.startswith("image.")]:
        raise CheckpointError(f"{path / TEXT_FILE} does not match the text tower of lit.text[{spec['arch']}]")
    return lit.eval(), spec


def evaluate_lit(params, *, progress: bool = True) -> dict:
    """Zero-shot top-1 (%) of every LiT run on every ``lit.zeroshot.datasets`` set with every classifier."""
    from dpnrepro.evaluation.zeroshot import class_embeddings, zeroshot_top1
    from dpnrepro.lit.data import class_names, labelled_images
    from dpnrepro.lit.train import embed_images
    from dpnrepro.training.distributed import resolve_device

    lp: LitParams = params.lit
    zs = lp.zeroshot
    pin_lit_threads()
    device = resolve_device(lp.train.device)
    tok = tokenizer(lp.context_length)
    sets = {}
    for name, s in zs.datasets.items():
        images, labels = labelled_images(s.format, s.source, split=s.split, per_class=s.per_class)
        sets[name] = (images, torch.tensor(labels), class_names(s.class_names))
    token_cache: dict[tuple, torch.Tensor] = {}

    def embedder(lit: LiT, key: tuple):
        @torch.inference_mode()
        def embed(texts: list[str]) -> torch.Tensor:
            if key not in token_cache:
                token_cache[key] = tok(texts)
            tokens = token_cache[key]
            return torch.cat([lit.encode_text(tokens[lo:lo + 4096].to(device)).float().cpu()
                              for lo in range(0, len(tokens), 4096)])
        return embed

    runs = {}
    for sweep, arch, stem in tower_runs(lp):
        path = run_dir(sweep, arch, stem, lp.towers.seed)
        tower, transform = load_tower(path)
        digest = state_digest(tower)
        image_emb = {name: embed_images(tower, images, transform, batch_size=params.runtime.eval_batch_size,
                                        device=device, desc=f"embed {name}", progress=progress)
                     for name, (images, _, _) in sets.items()}
        for seed in tqdm(lp.seeds, desc=f"zero-shot {sweep}/{path.name}", disable=not progress, leave=False):
            lit_path = lit_run_dir(sweep, arch, stem, lp.towers.seed, seed)
            if not (lit_path / SPEC_FILE).exists():
                raise CheckpointError(f"LiT run {lit_path} does not exist; run `dvc repro lit_train` first")
            lit, spec = load_lit_run(lit_path, tower, digest, lp)
            lit.to(device)
            scores = {name: {c: zeroshot_top1(image_emb[name], labels,
                                              class_embeddings(embedder(lit, (name, c)), names, c))
                             for c in zs.classifiers}
                      for name, (_, labels, names) in sets.items()
                      if zs.datasets[name].seeds is None or seed in zs.datasets[name].seeds}
            runs[f"{sweep}/{path.name}/lit_s{seed}"] = {
                "sweep": sweep, "arch": arch, "stem": stem, "tower_seed": lp.towers.seed, "seed": seed,
                "hardware": spec["hardware"], "temperature": spec["temperature"], "zeroshot": scores}
    return {"profile": params.profile, "classifiers": list(zs.classifiers), "headline": zs.headline,
            "datasets": {name: {"format": s.format, "source": s.source, "split": s.split,
                                "images": len(sets[name][0]), "classes": len(sets[name][2]),
                                "class_names": s.class_names, "seeds": s.seeds or list(lp.seeds)}
                         for name, s in zs.datasets.items()},
            "recipe": describe_lit(lp), "runs": runs}
