"""The step-indexed sampler does O(batch) work per step and gives exactly the batches of its definition
(a reference implementation: the whole global batch built per step, the permutation on the
training thread)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from dpnrepro.data import loader
from dpnrepro.data.loader import HaloBatchSampler, StepBatchSampler, _mix, _mix_last


def reference_global(n: int, batch_size: int, seed: int, step: int, repeats: int = 1) -> list[tuple[int, int]]:
    """The global batch of ``step`` as the sampler built it before (one randperm of the epoch, the whole
    batch, one Python hash per example)."""
    distinct = -(-batch_size // repeats)
    epoch, pos = divmod(step, n // distinct)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(_mix(seed, epoch)))
    idx = [i for i in perm[pos * distinct:(pos + 1) * distinct].tolist() for _ in range(repeats)][:batch_size]
    return [(i, _mix(seed, step, j)) for j, i in enumerate(idx)]


def reference_rank(n, batch_size, seed, step, rank, world, repeats, halo):
    full = reference_global(n, batch_size, seed, step, repeats)
    per = batch_size // world
    lo = rank * per
    return [full[j % batch_size] for j in range(lo - halo, lo)] + full[lo:lo + per]


LAYOUTS = [  # n, batch, repeats, world
    (50, 8, 1, 1), (97, 12, 1, 3), (97, 12, 3, 2), (64, 10, 3, 1), (41, 8, 2, 4),
]


@pytest.mark.parametrize("n,batch_size,repeats,world", LAYOUTS)
@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])
@pytest.mark.parametrize("halo", [False, True])
def test_batches_equal_the_previous_implementation_over_epochs_and_resumption(n, batch_size, repeats, world,
                                                                              seed, halo):
    distinct = -(-batch_size // repeats)
    spe = n // distinct
    total = 4 * spe + 2  # four epochs and into a fifth
    cls = HaloBatchSampler if halo else StepBatchSampler
    for start in (0, spe // 2 + 1, 2 * spe - 1, 3 * spe):  # from scratch, mid-epoch, last step of an epoch
        for rank in range(world):
            s = cls(n, batch_size, seed=seed, start_step=start, total_steps=total, rank=rank, world_size=world,
                    repeats=repeats)
            got = list(s)
            assert len(got) == total - start
            want = [reference_rank(n, batch_size, seed, step, rank, world, repeats, s.halo if halo else 0)
                    for step in range(start, total)]
            assert got == want


def test_vectorised_hash_equals_the_scalar_one():
    rng = np.random.default_rng(0)
    last = np.concatenate([np.arange(0, 5000), rng.integers(0, 2**62, size=1000)])
    for prefix in [(0, 0), (3, 17), (2**40 + 3, 10**9), (2**63 - 1, 2**64 - 5), (1,), (5, 6, 7)]:
        assert _mix_last(prefix, last) == [_mix(*prefix, int(v)) for v in last]


def test_each_rank_hashes_only_its_slice(monkeypatch):
    sizes = []
    real = loader._mix_last
    monkeypatch.setattr(loader, "_mix_last", lambda prefix, last: sizes.append(len(last)) or real(prefix, last))
    StepBatchSampler(1000, 64, seed=0, start_step=0, total_steps=3, rank=2, world_size=8).batch_for_step(1)
    HaloBatchSampler(1000, 64, seed=0, start_step=0, total_steps=3, rank=2, world_size=8,
                     repeats=2).batch_for_step(1)
    assert sizes == [8, 8 + 2]  # the rank's 64 / 8 examples (+ the halo), not the global batch


def test_the_next_epoch_is_permuted_off_the_training_thread(monkeypatch):
    where = []
    real = loader.epoch_permutation

    def recording(n, seed, epoch):
        where.append((epoch, threading.current_thread() is threading.main_thread()))
        return real(n, seed, epoch)

    monkeypatch.setattr(loader, "epoch_permutation", recording)
    s = StepBatchSampler(40, 8, seed=1, start_step=7, total_steps=19)  # 5 steps an epoch: epochs 1..3
    batches = list(s)
    assert sorted(where) == [(1, True), (2, False), (3, False)]  # only the resumed epoch on this thread
    assert batches == [reference_global(40, 8, 1, step) for step in range(7, 19)]
    assert not any(t.name == "dpnrepro-epoch-perm" for t in threading.enumerate() if t.is_alive())


def test_a_lost_prefetch_is_recomputed():
    # a forked child inherits the object but not its thread: the permutation is computed there instead
    s = StepBatchSampler(40, 8, seed=1, start_step=0, total_steps=12)
    s.batch_for_step(0)
    pending = s._perms[1]
    pending.result()
    pending._value = None  # as if the thread had never run
    assert s.batch_for_step(5) == reference_global(40, 8, 1, 5)


def test_sampler_pickles_without_its_threads():
    import pickle

    s = StepBatchSampler(40, 8, seed=1, start_step=0, total_steps=12)
    s.batch_for_step(0)
    copy = pickle.loads(pickle.dumps(s))
    assert list(copy) == list(StepBatchSampler(40, 8, seed=1, start_step=0, total_steps=12))


def test_loader_workers_forked_beside_prefetch_threads_give_the_same_batches():
    import datasets
    from PIL import Image

    from dpnrepro.data.loader import build_transform, train_loader

    imgs = [Image.fromarray(np.full((28, 28), i, np.uint8)) for i in range(40)]
    ds = datasets.Dataset.from_dict({"image": imgs, "label": [i % 10 for i in range(40)]},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "label": datasets.Value("int64")}))
    tf = build_transform({"image_size": 28, "channels": 1, "randaug": "", "inception_crop": True, "flip": True},
                         train=True, uint8=True)
    out = {}
    for workers in (0, 2):
        for start in (0, 7):  # 5 steps an epoch: 5 epochs, resumed mid-epoch
            s = StepBatchSampler(40, 8, seed=5, start_step=start, total_steps=25)
            out[workers, start] = [x for x, _ in train_loader(ds, tf, s, workers=workers)]
    assert len(out[0, 0]) == 25 and len(out[0, 7]) == 18
    for key in out:
        full = out[0, 0][key[1]:]
        assert all(torch.equal(a, b) for a, b in zip(out[key], full, strict=True)), key
