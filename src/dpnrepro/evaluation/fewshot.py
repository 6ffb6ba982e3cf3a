"""Few-shot linear evaluation (big_vision's ``fewshot_lsr`` evaluator), e.g. the paper's 25-shot accuracy.

The recipe, as in big_vision (``evaluators/fewshot_lsr.py`` with ``configs/common_fewshot.py``):

1. Features are the model's ``pre_logits`` representation (big_vision: ``representation_layer=
   'pre_logits'``): the pooled, encoder-normed token after the pre-logits Dense + tanh when
   ``rep_size`` is on, i.e. ``model.forward_head(model.forward_features(x), pre_logits=True)``. They
   are computed once for the whole train pool and the whole test split, both preprocessed as
   big_vision's few-shot evaluator does (:func:`fewshot_input`).
2. For each draw ``seed`` in ``0 .. draws-1``: ``np.random.default_rng(seed)`` permutes, class by
   class, the train-pool indices of that class; the first ``shots`` of each are the few-shot train set.
   The pool is a fixed subset of the train split (:func:`pool_indices`), the same for every draw.
3. Features are whitened with the few-shot train set's per-feature mean and (population) standard
   deviation plus ``1e-5``; the test features with the same statistics.
4. A constant feature of value 100 is appended (a bias that the L2 penalty hardly touches).
5. Targets are ``2 * onehot(y) - 1`` (values ±1); the weights are the closed-form ridge regression
   solution with a fixed ``l2_reg = 2**10``; the prediction is the argmax of the test scores.

big_vision solves the ridge system through an eigendecomposition of ``X^T X`` (or ``X X^T`` when
there are fewer examples than features) in float32; here the same system is solved directly in
float64 (primal or dual form, whichever is smaller), which is the same solution up to rounding.

Sources (google-research/big_vision): ``configs/common_fewshot.py`` at fa954352ca1c481c7279f6a31ce32a6b6ad12bff
preprocesses train and test alike with ``decode|resize(256)|central_crop(224)|value_range(-1,1)``
(``resize`` makes the image 256 x 256, not keeping the aspect ratio: ``pp/ops_image.py`` at
4a12790a8696c0f6df6cf975a5839e52134f9f80, bilinear) and evaluates ImageNet on ``('imagenet2012',
'train[:65000]', 'validation')``: a fixed pool of 65000 train images ("at least 30 shots per any
class"). ``evaluators/fewshot_lsr.py`` at 1475d53dd8c4cae31aa4ae612b2c7bcd1555171e draws the shots from
that pool, per seed one permutation per class (step 2; every shot count takes a prefix of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dpnrepro.errors import DatasetError
from dpnrepro.evaluation.base import RunEvaluator

BIAS_CONSTANT = 100.0  # value of the appended bias feature (big_vision's BIAS_CONSTANT)
STD_EPS = 1e-5  # added to the whitening standard deviation
L2_REG = 2.0 ** 10  # big_vision's fixed few-shot ridge strength

POOL_SEED = 0  # the seed of the fixed train pool (pool_indices)

__all__ = [
    "BIAS_CONSTANT", "STD_EPS", "L2_REG", "POOL_SEED", "LinearProbe", "fit_lsr", "fewshot_lsr_accuracy",
    "draw_shots", "pool_indices", "fewshot_input", "extract_features", "fewshot_from_features",
    "evaluate_fewshot_run", "Evaluator",
]


# ---------------------------------------------------------------------------------------------------
# Closed-form least-squares probe

@dataclass(frozen=True)
class LinearProbe:
    """A fitted few-shot probe: whitening statistics and ``(D + 1, C)`` weights (bias row last)."""
    mean: np.ndarray
    std: np.ndarray
    weights: np.ndarray

    def design(self, x: np.ndarray) -> np.ndarray:
        """Whitened features with the constant bias feature appended (float64)."""
        z = (np.asarray(x, dtype=np.float64) - self.mean) / self.std
        return np.concatenate([z, np.full((z.shape[0], 1), BIAS_CONSTANT)], axis=1)

    def scores(self, x: np.ndarray) -> np.ndarray:
        return self.design(x) @ self.weights

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.argmax(self.scores(x), axis=1)


def _check_xy(x, y, name: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y) or len(x) == 0:
        raise ValueError(f"{name}: expected features (N, D) and labels (N,) with N > 0, "
                         f"got {x.shape} and {y.shape}")
    return x, y.astype(np.int64, copy=False)


def fit_lsr(train_x: np.ndarray, train_y: np.ndarray, num_classes: int, l2_reg: float = L2_REG) -> LinearProbe:
    """Fit big_vision's few-shot least-squares probe on ``(train_x, train_y)``.

    Minimises ``||A W - Y||^2 + l2_reg ||W||^2`` with ``A`` the whitened train features plus the bias
    feature and ``Y = 2 * onehot - 1``. Solved in the primal, ``(A^T A + l2 I) W = A^T Y``, when there
    are at least as many examples as columns of ``A``, else in the dual,
    ``W = A^T (A A^T + l2 I)^{-1} Y`` (the same solution; big_vision's case split).
    """
    x, y = _check_xy(train_x, train_y, "train")
    if y.min() < 0 or y.max() >= num_classes:
        raise ValueError(f"train labels must lie in [0, {num_classes}); got {y.min()}..{y.max()}")
    if not l2_reg > 0:
        raise ValueError(f"l2_reg must be positive, got {l2_reg}")
    x = x.astype(np.float64)
    mean = x.mean(axis=0, keepdims=True)
    std = x.std(axis=0, keepdims=True) + STD_EPS
    probe = LinearProbe(mean=mean, std=std, weights=np.empty(0))
    a = probe.design(x)
    targets = 2.0 * np.eye(num_classes)[y] - 1.0
    n, d = a.shape
    if n >= d:
        w = np.linalg.solve(a.T @ a + l2_reg * np.eye(d), a.T @ targets)
    else:
        w = a.T @ np.linalg.solve(a @ a.T + l2_reg * np.eye(n), targets)
    return LinearProbe(mean=mean, std=std, weights=w)


def fewshot_lsr_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                         num_classes: int, l2_reg: float = L2_REG) -> float:
    """Accuracy (a fraction in [0, 1]) on the test set of the probe fitted on the train set."""
    test_x, test_y = _check_xy(test_x, test_y, "test")
    probe = fit_lsr(train_x, train_y, num_classes, l2_reg)
    if test_x.shape[1] != probe.mean.shape[1]:
        raise ValueError(f"test features have {test_x.shape[1]} dims, train features {probe.mean.shape[1]}")
    return float(np.mean(probe.predict(test_x) == test_y))


# ---------------------------------------------------------------------------------------------------
# Shots

def draw_shots(labels: np.ndarray, shots: int, num_classes: int, seed: int) -> np.ndarray:
    """Indices into ``labels`` of ``shots`` random examples of each class (class 0's first).

    As big_vision: ``rng = np.random.default_rng(seed)``, then for each class in order a permutation
    of that class's indices, of which the first ``shots`` are kept. A class with fewer than ``shots``
    examples raises :class:`DatasetError` (big_vision would silently use fewer).
    """
    labels = np.asarray(labels)
    if shots < 1:
        raise ValueError(f"shots must be >= 1, got {shots}")
    counts = np.bincount(labels[(labels >= 0) & (labels < num_classes)].astype(np.int64), minlength=num_classes)
    short = [c for c in range(num_classes) if counts[c] < shots]
    if short:
        raise DatasetError(
            f"{shots}-shot evaluation needs {shots} examples of every class, but class(es) {short[:5]} have "
            f"only {[int(counts[c]) for c in short[:5]]} in the train pool; use fewer shots or a larger pool")
    rng = np.random.default_rng(seed)
    per_class = [rng.permutation(np.flatnonzero(labels == c))[:shots] for c in range(num_classes)]
    return np.concatenate(per_class).astype(np.int64)


def pool_indices(n: int, pool_size: int) -> np.ndarray:
    """Sorted indices of the train pool: a fixed random subset of ``pool_size`` of the ``n`` train
    examples (seeded by :data:`POOL_SEED`), all of them when ``pool_size`` is 0 or at least ``n``.

    big_vision's pool is a prefix (``train[:65000]``) of TFDS's shuffled ImageNet records. Here a prefix
    would not do: a prepared ``imagefolder`` split is ordered by class, so its first 65000 images hold
    only the first ~50 classes; a seeded subset is, like TFDS's prefix, a fixed sample of all classes.
    """
    if pool_size < 0:
        raise ValueError(f"pool_size must be >= 0 (0 = all), got {pool_size}")
    if pool_size == 0 or pool_size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(POOL_SEED).choice(n, size=pool_size, replace=False))


# ---------------------------------------------------------------------------------------------------
# Features

def fewshot_input(input_cfg: dict, resize: int) -> dict:
    """``input_cfg`` with big_vision's few-shot preprocessing as its eval transform: resize to
    ``resize`` x ``resize`` (aspect not kept), central crop to ``image_size``, value range [-1, 1].

    The eval path of :func:`dpnrepro.data.loader.build_transform` resizes to ``eval_resize`` and then
    crops; a ``(resize, resize)`` pair makes it a fixed-size resize. Pillow's bilinear filter smooths
    when it shrinks (big_vision's ``resize`` does not antialias); torchvision rounds an odd crop margin
    where big_vision floors it (no difference for 256 -> 224 or 32 -> 28).
    """
    from dpnrepro.errors import ParamsError

    if resize < input_cfg["image_size"]:
        raise ParamsError(f"fewshot.resize ({resize}) is smaller than input.image_size "
                          f"({input_cfg['image_size']}); big_vision resizes to 256 and crops 224")
    return {**input_cfg, "eval_resize": (resize, resize)}


@torch.no_grad()
def extract_features(model: torch.nn.Module, ds, transform_cfg: dict, batch_size: int = 256,
                     device: torch.device | str = "cpu", *, progress: bool = False,
                     desc: str = "features") -> tuple[np.ndarray, np.ndarray]:
    """Pre-logit features ``(N, D)`` (float32) and labels ``(N,)`` (int64) of ``ds`` in order.

    Eval preprocessing of ``transform_cfg`` (the ``input`` params); features are
    ``model.forward_head(model.forward_features(x), pre_logits=True)``, computed in float32 (no
    autocast: the probe whitens and inverts them, so precision matters more than speed). Inside a
    ``torchrun`` session each rank extracts its shard (whole batches of one sequential pass) and every
    rank gets all of them in order: on CPU the very bits of one process (tests/test_eval_distributed.py).
    """
    from tqdm.auto import tqdm

    from dpnrepro.data.loader import eval_batches
    from dpnrepro.training import distributed

    ctx = distributed.current()
    rank, world = (ctx.rank, ctx.world_size) if ctx is not None else (0, 1)
    device = torch.device(device)
    model.eval().to(device)
    loader = eval_batches(ds, transform_cfg, batch_size, rank, world)
    feats, labels = [], []
    for images, y in tqdm(loader, desc=desc, unit="batch", disable=not progress, leave=False):
        f = model.forward_head(model.forward_features(images.to(device, non_blocking=True)), pre_logits=True)
        feats.append(f.float().cpu().numpy())
        labels.append(np.asarray(y, dtype=np.int64))
    if world > 1:  # every rank's shard, in rank order (gloo and NCCL both carry pickled objects)
        shards = [None] * world
        torch.distributed.all_gather_object(shards, (feats, labels))
        feats = [f for shard_feats, _ in shards for f in shard_feats]
        labels = [y for _, shard_labels in shards for y in shard_labels]
    if not feats:
        raise DatasetError("cannot extract features from an empty split")
    return np.concatenate(feats), np.concatenate(labels)


# ---------------------------------------------------------------------------------------------------
# Draws and runs

def fewshot_from_features(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                          num_classes: int, *, shots: int | Sequence[int] = 25, draws: int = 3,
                          l2_reg: float = L2_REG) -> dict:
    """Few-shot accuracies (%) for each ``shots`` over draws ``0 .. draws-1`` from a feature pool.

    Returns ``{shots: {"draws": [acc per draw], "mean": m, "ci95": half-width or None}}`` with the
    mean and 95 % t-interval of :func:`dpnrepro.stats.mean_ci95` over the draws: the spread of the
    evaluation, not of training (the reports average draws within a seed; docs/tables-and-figures.md#statistics).
    """
    from dpnrepro.stats import mean_ci95

    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    shot_list = [shots] if isinstance(shots, int) else list(shots)
    out = {}
    for k in shot_list:
        accs = []
        for seed in range(draws):
            idx = draw_shots(train_y, k, num_classes, seed)
            accs.append(100.0 * fewshot_lsr_accuracy(train_x[idx], train_y[idx], test_x, test_y, num_classes, l2_reg))
        mean, ci = mean_ci95(accs)
        out[k] = {"draws": accs, "mean": mean, "ci95": ci}
    return out


def _num_classes(ds, *label_arrays: np.ndarray) -> int:
    feature = getattr(ds, "features", {}).get("label") if hasattr(ds, "features") else None
    n = getattr(feature, "num_classes", None)
    return int(n) if n else int(max(int(a.max()) for a in label_arrays if len(a)) + 1)


def evaluate_fewshot_run(run_path, prepared_dir, input_cfg: dict, *, shots: int | Sequence[int] = 25,
                         draws: int = 3, train_split: str = "train", test_split: str = "val", resize: int,
                         pool_size: int = 0, l2_reg: float = L2_REG, batch_size: int = 256,
                         device: str = "auto", progress: bool = True) -> dict:
    """Rebuild a trained run (spec + safetensors) and measure its few-shot linear accuracy.

    The train pool is ``pool_size`` examples of ``train_split`` of the prepared data
    (:func:`pool_indices`; 0 = all, big_vision: 65000 for ImageNet), the test set is all of
    ``test_split``; both preprocessed by :func:`fewshot_input` with ``resize``.
    Returns the run's summary keys plus, for each ``k`` in ``shots`` (percent):
    ``fewshot{k}_top1`` (mean over draws), ``fewshot{k}_top1_ci95`` and ``fewshot{k}_top1_draws``, and
    ``fewshot_draws``, ``fewshot_l2_reg``, ``fewshot_train_pool``, ``fewshot_test_examples``.
    """
    from pathlib import Path

    from dpnrepro.data.loader import load_split
    from dpnrepro.artifacts import load_run_model, read_summary
    from dpnrepro.training.distributed import pick_device

    run_path = Path(run_path)
    model = load_run_model(run_path)
    dev = pick_device(device)
    summary = read_summary(run_path)

    fewshot_cfg = fewshot_input(input_cfg, resize)
    train_ds = load_split(prepared_dir, train_split)
    train_ds = train_ds.select(pool_indices(len(train_ds), pool_size))
    test_ds = load_split(prepared_dir, test_split)
    tr_x, tr_y = extract_features(model, train_ds, fewshot_cfg, batch_size, dev, progress=progress,
                                  desc=f"features {run_path.name} {train_split}")
    te_x, te_y = extract_features(model, test_ds, fewshot_cfg, batch_size, dev, progress=progress,
                                  desc=f"features {run_path.name} {test_split}")
    num_classes = _num_classes(train_ds, tr_y, te_y)
    results = fewshot_from_features(tr_x, tr_y, te_x, te_y, num_classes, shots=shots, draws=draws, l2_reg=l2_reg)

    out = {k: summary[k] for k in ("arch", "stem", "seed", "hardware", "params_m")}
    for k, r in results.items():
        out[f"fewshot{k}_top1"] = r["mean"]
        out[f"fewshot{k}_top1_ci95"] = r["ci95"]
        out[f"fewshot{k}_top1_draws"] = r["draws"]
    out.update(fewshot_draws=draws, fewshot_l2_reg=float(l2_reg), fewshot_train_pool=int(len(tr_y)),
               fewshot_test_examples=int(len(te_y)))
    return out


class Evaluator(RunEvaluator):
    """The ``fewshot`` evaluator of the sweeps: :func:`evaluate_fewshot_run` with the sweep's ``fewshot``
    settings (:class:`dpnrepro.config.sweeps.FewshotParams`)."""

    def run(self, run_dir) -> dict:
        c = self.config
        return evaluate_fewshot_run(run_dir, self.prepared_dir, self.input_cfg, shots=c.shots, draws=c.draws,
                                    l2_reg=c.l2_reg, train_split=c.train_split, test_split=c.test_split,
                                    resize=c.resize, pool_size=c.pool_size, batch_size=self.batch_size,
                                    device=self.device, progress=self.progress)
