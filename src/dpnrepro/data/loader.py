"""Prepared splits → augmented tensors → batches.

Train-time preprocessing follows big_vision's AugReg pipeline (appendix C): inception crop, left-right
flip, RandAugment, ``value_range(-1, 1)``; eval is ``resize_small`` then ``central_crop`` (big_vision's
ImageNet evaluation), or with ``input.squash`` the whole frame resized to ``S x S`` (VTAB's ``resize(S)``).
"""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import numpy as np
import torch

from dpnrepro.data.crop import resize_ops
from dpnrepro.errors import DatasetError, UserError


def build_transform(cfg: dict, train: bool, uint8: bool = False):
    """A transform mapping one image to a float tensor (C, S, S) in [-1, 1].

    ``uint8=True`` (the trainer's): the tensor stays uint8 in [0, 255] and
    :func:`dpnrepro.training.step.unit_range` scales it on the device, bit-identically; a recipe with
    random erasing (which works on the scaled tensor) still gets floats.

    ``input.backend: pil`` (default): torchvision v2 ops on a PIL image. ``fast`` (train only):
    :class:`dpnrepro.data.fast.FastTrainTransform` — same samplers, same RNG draws, same ops, computed
    in uint8 (see ``data/fast.py``); it also accepts undecoded images (bytes / ``datasets`` dicts).
    RandAugment's op choice comes from Python's ``random`` in both (timm draws it from NumPy's global
    RNG, which the per-example seeding does not cover).
    """
    from torchvision.transforms import v2

    from dpnrepro.data.fast import FastTrainTransform
    from dpnrepro.data.randaugment import randaugment

    size = cfg["image_size"]
    erase = []
    if train and cfg.get("random_erasing", 0) > 0:
        # DeiT's random erasing (timm, per-pixel normal noise) on the normalised tensor; its draws come
        # from Python's `random` and torch, both seeded per example.
        from timm.data.random_erasing import RandomErasing

        erase = [RandomErasing(probability=cfg["random_erasing"], mode="pixel", device="cpu")]
    as_uint8 = uint8 and not erase  # random erasing works on the scaled float tensor
    if train and cfg.get("backend", "pil") == "fast":
        fast = FastTrainTransform(size, cfg["channels"], inception_crop=cfg.get("inception_crop", True),
                                  flip=cfg.get("flip", True), randaug=cfg.get("randaug", ""),
                                  crop_min_area=cfg.get("crop_min_area", 0.05),
                                  crop_sampler=cfg.get("crop_sampler", "torchvision"),
                                  squash=cfg.get("squash", False), uint8=as_uint8)
        return v2.Compose([fast, *erase]) if erase else fast
    mode = {1: "L", 3: "RGB"}[cfg["channels"]]
    ops = [v2.Lambda(lambda im: im.convert(mode) if im.mode != mode else im)]
    if train:
        if cfg.get("inception_crop", True):
            # Inception crop, area 5-100 % (DeiT: 8-100 %): big_vision's (TF's sampler, aspect 0.75-1.33,
            # bilinear without antialias; data/crop.py) or torchvision's (aspect 3/4-4/3, antialiased).
            scale = (cfg.get("crop_min_area", 0.05), 1.0)
            if cfg.get("crop_sampler", "torchvision") == "big_vision":
                from dpnrepro.data.crop import InceptionCrop

                ops.append(InceptionCrop(size, scale))
            else:
                ops.append(v2.RandomResizedCrop(size, scale=scale, ratio=(3 / 4, 4 / 3), antialias=True))
        else:
            ops += resize_ops(size, squash=cfg.get("squash", False))
        if cfg.get("flip", True):
            ops.append(v2.RandomHorizontalFlip())
        if cfg.get("randaug"):
            ops.append(randaugment(cfg["randaug"], size, cfg["channels"]))
    else:
        ops += resize_ops(size, squash=cfg.get("squash", False), resize=cfg.get("eval_resize", size))
    ops.append(v2.PILToTensor())
    if not as_uint8:
        ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * cfg["channels"], [0.5] * cfg["channels"])]
    return v2.Compose(ops + erase)


_MISSING_OR_MISPLACED = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR)


def damaged_data(exc: BaseException) -> bool:
    """True when reading prepared data failed because the data are incomplete or damaged (a file missing or
    misplaced, truncated or malformed contents: pyarrow and datasets raise many types for these), not
    because of the machine (an OSError with another errno: permission, disk, I/O; MemoryError)."""
    from dpnrepro.errors import fault_errno

    if isinstance(exc, MemoryError) or fault_errno(exc) is not None:
        return False
    if isinstance(exc, OSError):
        return exc.errno in _MISSING_OR_MISPLACED or exc.errno is None
    return True


def load_split(prepared_dir: str | Path, split: str):
    """The prepared ``datasets.Dataset`` of one split (a :class:`~dpnrepro.data.source_index.SourceSplit`
    reading from the source folder with ``data.storage: source``)."""
    import datasets

    path = Path(prepared_dir) / split
    if not path.exists():
        raise DatasetError(f"prepared split {path} does not exist; run `dvc repro prepare` first")
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        if not damaged_data(exc):
            raise  # a fault of the machine (permission, disk, memory): the stage names it (errors.fault_message)
        from dpnrepro.restore import restore_fix

        raise DatasetError(f"prepared split {path} cannot be read ({type(exc).__name__}: {str(exc)[:200]}); "
                           f"{restore_fix(path, 'prepare')}") from exc
    if "image" in ds.column_names or "path" not in ds.column_names:
        return ds
    from dpnrepro.data.prepare import load_manifest  # data.storage: source, an index of the source's files
    from dpnrepro.data.source_index import SourceSplit

    return SourceSplit(ds, load_manifest(prepared_dir)["source"])


_MIX_SEED, _MIX_MUL, _U64 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0xFFFFFFFFFFFFFFFF


def _mix_state(ints) -> int:
    """The 64-bit state of :func:`_mix` after absorbing ``ints``."""
    h = _MIX_SEED
    for v in ints:
        h = ((h ^ (v & _U64)) * _MIX_MUL) & _U64
        h ^= h >> 31
    return h


def _mix(*ints: int) -> int:
    """A stable 63-bit hash of a few integers (seeds per epoch / per sample)."""
    return _mix_state(ints) & 0x7FFFFFFFFFFFFFFF


def _mix_last(prefix: tuple[int, ...], last: np.ndarray) -> list[int]:
    """``[_mix(*prefix, v) for v in last]`` (``last`` non-negative), the last round vectorised in uint64."""
    x = (np.uint64(_mix_state(prefix)) ^ last.astype(np.uint64)) * np.uint64(_MIX_MUL)  # wraps mod 2**64
    x ^= x >> np.uint64(31)
    return (x & np.uint64(0x7FFFFFFFFFFFFFFF)).tolist()


class _Prefetch:
    """A value computed on a background thread; :meth:`result` waits for it, or computes it here when
    the thread is gone (a forked child)."""

    def __init__(self, fn):
        self._fn, self._value = fn, None
        # not a daemon: the interpreter waits for it at exit (a daemon inside a torch op aborts the process)
        self._thread = threading.Thread(target=self._run, name="dpnrepro-epoch-perm")
        self._thread.start()

    def _run(self) -> None:
        self._value = self._fn()

    def result(self):
        self._thread.join()
        return self._fn() if self._value is None else self._value


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """Epoch ``epoch``'s order of the ``n`` examples: ``torch.randperm`` seeded by ``(seed, epoch)``
    (int32 when it fits: the same values in half the memory)."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(_mix(seed, epoch)))
    return perm.to(torch.int32) if n < 2**31 else perm


class StepBatchSampler(torch.utils.data.Sampler):
    """Batches indexed by optimisation step, so any step's batch can be recomputed from scratch.

    Step ``s`` reads positions ``[p*B, (p+1)*B)`` of epoch ``s // steps_per_epoch``'s permutation
    (seeded by ``(seed, epoch)``), and every example carries its own augmentation seed
    ``(seed, s, j)``. Resuming at step ``s`` therefore sees exactly the batches and augmentations an
    uninterrupted run would, with any number of loader workers. With ``world_size > 1`` each rank
    takes its contiguous slice of the global batch. With ``repeats`` r > 1 (DeiT's repeated
    augmentation) a batch holds ceil(B/r) distinct images, each r times (the last possibly fewer), every
    copy with its own augmentation seed.

    Work per step is O(this rank's batch): only its positions are read and hashed. The O(n) permutation
    of an epoch is computed once, the next epoch's on a background thread while this one is read, so
    the step that crosses an epoch does not wait for it.
    """

    def __init__(self, n: int, batch_size: int, *, seed: int, start_step: int, total_steps: int,
                 rank: int = 0, world_size: int = 1, repeats: int = 1):
        distinct = -(-batch_size // repeats)  # ceil: the last image may have fewer copies
        if n < distinct:
            raise DatasetError(f"training split has {n} examples, fewer than one batch ({distinct}); "
                               "lower train.batch_size or use more data")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.start_step, self.total_steps = start_step, total_steps
        self.rank, self.world_size = rank, world_size
        self.repeats, self.distinct = repeats, distinct
        self.steps_per_epoch = n // distinct
        self._perms: dict[int, _Prefetch | torch.Tensor] = {}  # this epoch's permutation and the next's

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_perms": {}}  # threads do not pickle; permutations are recomputed

    def _epoch_perm(self, epoch: int) -> torch.Tensor:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = epoch_permutation(self.n, self.seed, epoch)
        elif isinstance(perm, _Prefetch):
            perm = perm.result()
        nxt = self._perms.get(epoch + 1)
        if nxt is None and (epoch + 1) * self.steps_per_epoch < self.total_steps:  # the run reaches it
            nxt = _Prefetch(lambda: epoch_permutation(self.n, self.seed, epoch + 1))
        self._perms = {epoch: perm} if nxt is None else {epoch: perm, epoch + 1: nxt}
        return perm

    def __len__(self) -> int:
        return self.total_steps - self.start_step

    def entries(self, step: int, positions: np.ndarray) -> list[tuple[int, int]]:
        """``(example index, augmentation seed)`` at ``positions`` of step ``step``'s global batch."""
        epoch, pos = divmod(step, self.steps_per_epoch)
        perm = self._epoch_perm(epoch)
        idx = perm[torch.from_numpy(pos * self.distinct + positions // self.repeats)].tolist()
        return list(zip(idx, _mix_last((self.seed, step), positions)))

    def batch_for_step(self, step: int) -> list[tuple[int, int]]:
        per_rank = self.batch_size // self.world_size
        lo = self.rank * per_rank
        return self.entries(step, np.arange(lo, lo + per_rank, dtype=np.int64))

    def __iter__(self):
        for step in range(self.start_step, self.total_steps):
            yield self.batch_for_step(step)


class HaloBatchSampler(StepBatchSampler):
    """This rank's slice of the global batch plus, in front, the ``halo`` examples just before it (cyclically).

    Mixup pairs example ``j`` of the global batch with example ``j - halo`` (the batch rolled by
    ``halo``). With those partners loaded in front, every micro-batch on every rank can be mixed exactly
    as one process mixes the whole batch: the result does not depend on world size or accumulation.
    """

    def __init__(self, n: int, batch_size: int, *, seed: int, start_step: int, total_steps: int,
                 rank: int = 0, world_size: int = 1, repeats: int = 1):
        super().__init__(n, batch_size, seed=seed, start_step=start_step, total_steps=total_steps,
                         rank=rank, world_size=world_size, repeats=repeats)
        # The partner is `repeats` places back. big_vision rolls by one, but with repeated augmentation
        # the copies of an image are adjacent, so a roll by one would mix r-1 of every r examples with
        # another view of their own image (same label: no label mixing at all). Rolling by r pairs copy
        # c of image k with copy c of image k-1, always another image once the batch holds >= 2r
        # examples (the images of a batch are distinct); r = 1 keeps big_vision's roll by one.
        if repeats > 1 and batch_size < 2 * repeats:
            raise UserError(f"mixup / CutMix with input.repeated_aug {repeats} needs train.batch_size >= "
                            f"{2 * repeats} (two distinct images), got {batch_size}")
        self.halo = repeats

    def batch_for_step(self, step: int) -> list[tuple[int, int]]:
        per_rank = self.batch_size // self.world_size
        lo = self.rank * per_rank
        return self.entries(step, np.arange(lo - self.halo, lo + per_rank, dtype=np.int64) % self.batch_size)


def multi_hot(ids, num_classes: int) -> torch.Tensor:
    """A (num_classes,) float vector with 1 at each class id of a multi-label example."""
    out = torch.zeros(num_classes)
    out[torch.as_tensor(list(ids), dtype=torch.long)] = 1.0
    return out


class TransformedSplit(torch.utils.data.Dataset):
    """Map-style view of a prepared split; with ``(index, seed)`` keys the transform's randomness
    (torch and Python RNGs) is seeded per example and isolated from the global RNG state.

    Targets are the ``label`` id, or for multi-label splits (a ``labels`` column) a multi-hot vector of
    ``num_classes``.
    """

    def __init__(self, ds, transform, num_classes: int | None = None):
        self.ds, self.transform = ds, transform
        self.multi_label = "labels" in getattr(ds, "column_names", ())
        if self.multi_label and num_classes is None:
            raise ValueError("a multi-label split needs num_classes for its multi-hot targets")
        self.num_classes = num_classes

    def _target(self, ex):
        return multi_hot(ex["labels"], self.num_classes) if self.multi_label else ex["label"]

    def __len__(self) -> int:
        return len(self.ds)

    def _transformed(self, image, seed: int | None):
        """``transform(image)``; with a ``seed`` its torch and Python draws are seeded by it, the global RNGs
        left as they were."""
        return self._transformed_all([image], [seed])[0]

    def _transformed_all(self, images, seeds) -> list:
        """``[transform(image)]``, each image's torch and Python draws seeded by its own seed (None: the global
        RNGs' draws). The global generators are saved once and restored after the last image, not per image:
        reseeding resets a generator whole (torch's normal-sample cache and Python's ``gauss`` state
        included), so each image draws what it draws alone, at a fraction of the per-image save and restore
        (with the identity-crop skip of data/fast.py, 0.34 -> 0.10 ms an example of the smoke train batches
        on the 2-core AMD EPYC: benchmarks/measured/newcomer_amd_epyc_f25m1.json, train_batches_seeded_once)."""
        import random

        if all(seed is None for seed in seeds):
            return [self.transform(image) for image in images]
        if any(seed is None for seed in seeds):  # unseeded draws come from the global state: one at a time
            return [self._transformed_all([image], [seed])[0] for image, seed in zip(images, seeds)]
        out = []
        py_state = random.getstate()
        with torch.random.fork_rng(devices=[]):
            for image, seed in zip(images, seeds):
                torch.default_generator.manual_seed(seed)  # CPU only: torch.manual_seed also queues CUDA/XPU/MTIA seeding (~2 ms)
                random.seed(seed)
                out.append(self.transform(image))
        random.setstate(py_state)
        return out

    @staticmethod
    def _index_and_seed(key) -> tuple[int, int | None]:
        """A key's row and transform seed: ``(index, seed)`` from the training sampler, a bare index elsewhere."""
        i, seed = key if isinstance(key, tuple) else (key, None)
        return int(i), seed

    def __getitem__(self, key):
        i, seed = self._index_and_seed(key)
        ex = self.ds[i]
        return self._transformed(ex["image"], seed), self._target(ex)

    def __getitems__(self, keys: list) -> list:
        """A batch of examples (the DataLoader's batched fetch), the same tensors as :meth:`__getitem__` gives
        key by key: the rows of a ``datasets.Dataset`` are read in one Arrow call instead of one per row
        (20-40 % less time per batch of the smoke data on a 2-core AMD EPYC), other splits (decoded in
        memory, a pixel store) row by row; the batch is then transformed under one save of the RNGs."""
        import datasets

        index, seeds = zip(*map(self._index_and_seed, keys)) if keys else ((), ())
        if isinstance(self.ds, datasets.Dataset):
            rows = self.ds[list(index)]
            examples = [{column: rows[column][j] for column in rows} for j in range(len(index))]
        else:
            examples = [self.ds[i] for i in index]
        images = self._transformed_all([ex["image"] for ex in examples], seeds)
        return [(image, self._target(ex)) for image, ex in zip(images, examples)]


def train_batches(ds, input_cfg: dict, sampler: StepBatchSampler, workers: int, num_classes: int | None):
    """The trainer's train batches ``(uint8 images, targets)`` for ``input_cfg["backend"]``: ``pil`` and
    ``fast`` transform on the CPU in loader workers."""
    if input_cfg.get("backend", "pil") == "fast":  # JPEG bytes: the fast pipeline decodes at reduced scale
        from dpnrepro.data.fast import undecoded

        ds = undecoded(ds)
    return train_loader(ds, build_transform(input_cfg, train=True, uint8=True), sampler, workers, num_classes)


def train_loader(ds, transform, sampler: StepBatchSampler, workers: int = 0, num_classes: int | None = None):
    """DataLoader over the step-indexed batches of ``sampler`` (``num_classes``: for multi-label splits)."""
    return torch.utils.data.DataLoader(
        TransformedSplit(ds, transform, num_classes),
        batch_sampler=sampler,
        num_workers=workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=False,
        generator=torch.Generator().manual_seed(sampler.seed),  # keep the global RNG out of the loader
    )


def scaled_collate(batch):
    """``default_collate`` of ``(uint8 image, target)`` examples, the images scaled to ``[-1, 1]`` as one batch
    (:func:`dpnrepro.training.step.unit_range`: the floats each image's own ``ToDtype`` + ``Normalize`` give,
    at a third less time per batch of the smoke evaluation than scaling image by image)."""
    from torch.utils.data import default_collate

    from dpnrepro.training.step import unit_range

    images, targets = default_collate(batch)
    return unit_range(images), targets


def eval_loader(ds, transform, batch_size: int, workers: int = 0, collate_fn=None):
    """Sequential, non-dropping DataLoader for evaluation."""
    return torch.utils.data.DataLoader(
        TransformedSplit(ds, transform), batch_size=batch_size, shuffle=False, num_workers=workers,
        pin_memory=torch.cuda.is_available(), collate_fn=collate_fn,
    )


def eval_shard(n: int, batch_size: int, rank: int, world_size: int) -> range:
    """The examples rank ``rank`` of ``world_size`` evaluates: a contiguous run of whole batches of one
    sequential pass (the first ranks take one batch more when they do not divide evenly), so every example
    sits in the batch it sits in with one process and the ranks' results, in rank order, are that pass's."""
    batches = -(-n // batch_size)
    per, extra = divmod(batches, world_size)
    first = rank * per + min(rank, extra)
    last = first + per + (rank < extra)
    return range(min(n, first * batch_size), min(n, last * batch_size))


def eval_batches(ds, input_cfg: dict, batch_size: int, rank: int = 0, world_size: int = 1):
    """The evaluation batches ``(images, targets)`` of ``ds`` with the eval preprocessing of ``input_cfg``,
    streamed: each batch is decoded and transformed when it is consumed (``input_cfg["workers"]``, from
    ``runtime.workers``, loader processes decode ahead) and nothing of the split is kept, so host memory
    does not grow with the split. The batches are those of one sequential pass, in order, whatever the
    number of workers; glibc's free heap pages go back to the system after each (allocator.py: otherwise
    RSS creeps with the number of batches). Evaluators that need the whole split keep only its features or
    logits. Under ``torchrun`` (``world_size`` > 1) only this rank's share of that pass (:func:`eval_shard`)."""
    if world_size > 1:
        shard = eval_shard(len(ds), batch_size, rank, world_size)
        ds = ds.select(shard if len(shard) else [])  # more ranks than batches: nothing ('datasets' refuses range(n, n))
    from dpnrepro.allocator import HeapTrimmed  # the heap's free pages go back after each batch

    loader = eval_loader(ds, build_transform(input_cfg, train=False, uint8=True), batch_size,
                         input_cfg.get("workers", 0), collate_fn=scaled_collate)
    return HeapTrimmed(loader)
