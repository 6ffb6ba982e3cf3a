"""Evaluation under ``torchrun``: each rank scores its shard of the split (whole batches of one sequential pass,
data/loader.py ``eval_shard``) and the results are reduced over ranks; on CPU with gloo every rank returns the
very bits one process computes (top-1 counts, few-shot features)."""
from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch

from dpnrepro.data.loader import eval_shard

N, BATCH = 22, 4  # 6 batches, the last one partial
INPUT = {"image_size": 28, "channels": 3, "eval_resize": 32, "squash": False}


def _setup():
    from dpnrepro.benchmarks.input_pipeline import photo_split
    from dpnrepro.models import build_vit

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_vit("Mu/7", stem="dpn", num_classes=10, img_size=28, in_chans=3)
    ds = photo_split(N, 10)
    # labels the model gets right on some images and wrong on others (a random model scores ~10 %)
    with torch.no_grad():
        from dpnrepro.evaluation.fewshot import extract_features

        feats, _ = extract_features(model, ds, INPUT, BATCH)
        pred = model.head(torch.from_numpy(feats)).argmax(-1).tolist()
    ds = ds.map(lambda ex, i: {"label": pred[i] if i % 3 else (pred[i] + 1) % 10}, with_indices=True)
    return model, ds


def _others() -> list[torch.nn.Module]:
    """Two more models, scored in one pass with the first: other stems, random heads (a fresh head is zero and
    predicts one class), so the three score differently."""
    from dpnrepro.models import build_vit

    torch.manual_seed(0)
    models = [build_vit("Mu/7", stem=stem, num_classes=10, img_size=28, in_chans=3) for stem in ("conv", "dpn")]
    for model in models:
        torch.nn.init.normal_(model.head.weight, std=1.0)
    return models


def _evaluate(model, ds) -> dict:
    from dpnrepro.evaluation.classification import evaluate_top1, evaluate_top1_together
    from dpnrepro.evaluation.fewshot import extract_features

    cpu = torch.device("cpu")
    top1 = evaluate_top1(model, ds, INPUT, batch_size=BATCH, device=cpu, progress=False)
    together = evaluate_top1_together([model, *_others()], ds, INPUT, batch_size=BATCH, device=cpu, progress=False)
    feats, labels = extract_features(model, ds, INPUT, BATCH)
    return {"top1": top1, "together": together, "feats": feats, "labels": labels}


def _rank(rank: int, world: int, port: int, out: str) -> None:
    from dpnrepro.training import distributed

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    model, ds = _setup()
    with distributed.session("cpu"):
        torch.save(_evaluate(model, ds), f"{out}/rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2, 8])  # 8 ranks, 6 batches: two ranks evaluate nothing
def test_sharded_evaluation_equals_one_process_bitwise(tmp_path, world):
    model, ds = _setup()
    ref = _evaluate(model, ds)
    assert ref["top1"]["examples"] == N and 0 < ref["top1"]["top1"] < 100
    torch.multiprocessing.start_processes(_rank, args=(world, _free_port(), str(tmp_path)), nprocs=world,
                                          start_method="fork")
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert got["top1"] == ref["top1"] and got["together"] == ref["together"]
        assert got["feats"].tobytes() == ref["feats"].tobytes() and np.array_equal(got["labels"], ref["labels"])


def test_runs_scored_in_one_pass_score_what_each_scores_alone(tmp_path, monkeypatch):
    """The evaluate stage scores the runs sharing their settings in one pass over each split (each batch decoded
    once): every run's counts are those of its own pass, in any company; more weights than a pass holds take
    further passes, in order."""
    from dpnrepro.evaluation import classification
    from dpnrepro.evaluation.classification import _passes, evaluate_top1, evaluate_top1_together

    model, ds = _setup()
    models = [model, *_others()]
    cpu = torch.device("cpu")
    alone = [evaluate_top1(m, ds, INPUT, batch_size=BATCH, device=cpu, progress=False) for m in models]
    assert len({a["top1"] for a in alone}) > 1  # models that score differently
    for order in ([0, 1, 2], [2, 0, 1]):
        together = evaluate_top1_together([models[i] for i in order], ds, INPUT, batch_size=BATCH, device=cpu,
                                          progress=False)
        assert together == [alone[i] for i in order]
    runs = []
    for name, size in (("a", 5), ("b", 5), ("c", 1), ("d", 12), ("e", 2)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"x" * size)
        runs.append(tmp_path / name)
    monkeypatch.setattr(classification, "PASS_PARAM_BYTES", 10)
    assert [[p.name for p in chunk] for chunk in _passes(runs)] == [["a", "b"], ["c"], ["d"], ["e"]]


def test_shards_are_whole_batches_in_order():
    for n, b, w in [(22, 4, 2), (22, 4, 4), (22, 4, 8), (8, 4, 2), (1, 4, 3), (100, 7, 3)]:
        shards = [eval_shard(n, b, r, w) for r in range(w)]
        assert [i for s in shards for i in s] == list(range(n))  # a partition, in order
        assert all(s.start % b == 0 for s in shards if len(s))  # whole batches: the one-process batches
