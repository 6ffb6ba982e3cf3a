"""Model selection on validation, reporting on test: the VTAB-1k protocol (Sec. 6.1) and the three-step
search of appendix F (Table 7).

Both are written against two callables, so the selection logic is tested without training anything:
``fit(train_split, hparams, seed) -> model`` and ``score(model, split) -> accuracy``. The test split
is scored only after the choice is made, and only for the chosen setting: no selection step can see it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

Fit = Callable[[str, dict, int], Any]
Score = Callable[[Any, str], float]


def select_best(val: dict[Any, Sequence[float]]) -> Any:
    """The key with the highest mean validation accuracy over seeds; ties go to the first key listed."""
    if not val:
        raise ValueError("nothing to select from")
    best, best_mean = None, -math.inf
    for key, accs in val.items():
        mean = math.fsum(accs) / len(accs)
        if mean > best_mean:
            best, best_mean = key, mean
    return best


def vtab_protocol(lrs: Sequence[float], seeds: Sequence[int], fit: Fit, score: Score, *,
                  retrain_on_train800val200: bool = False) -> dict:
    """Sweep ``lrs`` × ``seeds`` on ``train800``, pick the lr by mean ``val200`` accuracy, report the
    chosen lr's ``test`` accuracy per seed (the models trained on ``train800``, or with
    ``retrain_on_train800val200`` new ones trained on ``train800val200`` with that lr, VTAB-1k's
    final protocol). Returns {val: {lr: [per seed]}, lr, test: [per seed], trained_on}."""
    models, val = {}, {}
    for lr in lrs:
        val[lr] = []
        for seed in seeds:
            models[lr, seed] = fit("train800", {"lr": lr}, seed)
            val[lr].append(score(models[lr, seed], "val200"))
    lr = select_best(val)
    split = "train800val200" if retrain_on_train800val200 else "train800"
    final = [fit(split, {"lr": lr}, s) if retrain_on_train800val200 else models[lr, s] for s in seeds]
    models.clear()
    return {"val": {str(k): v for k, v in val.items()}, "lr": lr,
            "test": [score(m, "test") for m in final], "trained_on": split}


def scratch_search(grid: Sequence[dict], aug_grid: Sequence[dict], longer: dict, seed: int, fit: Fit,
                   score: Score, *, canonical: Callable[[dict], dict] = dict) -> list[dict]:
    """Appendix F: (1) pick ``grid``'s best setting on validation; (2) with it, pick ``aug_grid``'s best;
    (3) train that one longer (``longer`` overrides it). One row per step with its chosen hparams, its
    validation and test accuracy and the candidates' validation accuracies; every model is trained on
    ``train``. A row's test accuracy is scored once its choice is made; later choices read only
    validation accuracies. Settings equal under ``canonical`` are trained once (step 2's "mixup 0,
    RandAugment 0" is step 1's winner)."""
    models: dict[str, Any] = {}
    vals: dict[str, float] = {}

    def key(hp: dict) -> str:
        return repr(sorted(canonical(hp).items()))

    def val_of(hp: dict) -> float:
        k = key(hp)
        if k not in vals:  # the (no-augmentation) winner of step 1 reappears in step 2's grid
            models[k] = fit("train", hp, seed)
            vals[k] = score(models[k], "val")
        return vals[k]

    rows, base = [], {}
    steps = (("from scratch", grid), ("+ Augmentation", aug_grid), ("+ Train Longer", [longer]))
    for setting, candidates in steps:
        tried = [{**base, **c} for c in candidates]
        val = {i: [val_of(hp)] for i, hp in enumerate(tried)}
        best = tried[select_best(val)]
        test = score(models[key(best)], "test")
        for k in [k for k in models if k != key(best)]:  # free the losers (B/16s on a GPU)
            del models[k]
        rows.append({"setting": setting, "hparams": best, "val": vals[key(best)], "test": test,
                     "candidates": [{"hparams": hp, "val": v[0]} for hp, v in zip(tried, val.values())]})
        base = best
    return rows
