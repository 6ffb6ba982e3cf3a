"""big_vision semantics in PyTorch: weight decay, decay mask, schedule, sigmoid_xent, mixup."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from dpnrepro.config.core import TrainParams
from dpnrepro.models import build_vit
from dpnrepro.training.losses import mixup, one_hot_targets, sigmoid_xent, softmax_xent, targets_of
from dpnrepro.training.optim import build_optimizer, build_scheduler, decay_mask, schedule_multiplier

LR, WD = 1e-3, 1e-4


def _cfg(**over) -> TrainParams:
    base = dict(optimizer="adam", lr=LR, weight_decay=WD, batch_size=8, steps=100, warmup_steps=10,
                schedule="cosine")
    base.update(over)
    return TrainParams(**base)


def _vit(stem="dpn"):
    torch.manual_seed(0)
    model = build_vit("Mu/7", stem=stem, num_classes=10, img_size=28, in_chans=1)
    with torch.no_grad():  # no parameter may be trivially 0 (decay of 0 is invisible)
        for p in model.parameters():
            p.add_(torch.rand_like(p) + 0.5)
    return model


def _zero_grad_step(model, cfg, schedule_step):
    """One optimizer step with all-zero gradients, taken when the schedule is at ``schedule_step``."""
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg)
    for _ in range(schedule_step):
        opt.step()  # no grads yet: a no-op, keeps the scheduler's order check happy
        sched.step()
    s = schedule_multiplier(schedule_step, total=cfg.steps, warmup=cfg.warmup_steps, kind=cfg.schedule)
    assert sched.get_last_lr()[0] == pytest.approx(cfg.lr * s, rel=1e-12)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    return before, s


@pytest.mark.parametrize("schedule_step", [5, 10, 55])
def test_adam_decay_is_not_scaled_by_lr(schedule_step):
    model = _vit()
    mask = decay_mask(model)
    before, s = _zero_grad_step(model, _cfg(), schedule_step)
    assert s > 0
    factor = 1.0 - s * WD  # big_vision: p -= s(t) * wd * p (NOT lr * wd)
    n_decayed = 0
    for name, p in model.named_parameters():
        if mask[name]:
            n_decayed += 1
            expected = (before[name].double() * factor).float()
            torch.testing.assert_close(p.detach(), expected, rtol=2e-7, atol=0, msg=name)
            assert not torch.equal(p.detach(), before[name]), name
        else:
            assert torch.equal(p.detach(), before[name]), f"{name} must not be decayed"
    assert n_decayed == 1 + 4 * 4 + 1  # stem proj, 4 blocks x (qkv, proj, fc1, fc2), head


def test_adamw_decay_is_scaled_by_lr():
    model = _vit()
    mask = decay_mask(model)
    before, s = _zero_grad_step(model, _cfg(optimizer="adamw", weight_decay=0.05), 10)
    name = "blocks.0.mlp.fc1.weight"
    assert mask[name]
    expected = (before[name].double() * (1.0 - s * LR * 0.05)).float()
    torch.testing.assert_close(model.get_parameter(name).detach(), expected, rtol=2e-7, atol=0)


def test_sgd_momentum():
    model = _vit()
    opt = build_optimizer(model, _cfg(optimizer="sgd_momentum", weight_decay=0.0))
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9


@pytest.mark.parametrize("stem", ["dpn", "conv"])
def test_decay_mask(stem):
    model = _vit(stem)
    mask = decay_mask(model)
    assert set(mask) == {n for n, _ in model.named_parameters()}
    for name in ("cls_token", "pos_embed", "blocks.0.norm1.weight", "blocks.0.norm1.bias",
                 "blocks.0.attn.qkv.bias", "blocks.3.mlp.fc2.bias", "norm.weight", "head.bias"):
        assert mask[name] is False, name
    for name in ("blocks.0.attn.qkv.weight", "blocks.0.attn.proj.weight", "blocks.2.mlp.fc1.weight",
                 "head.weight", "patch_embed.proj.weight"):
        assert mask[name] is True, name
    if stem == "dpn":
        assert not mask["patch_embed.norm_in.weight"] and not mask["patch_embed.norm_out.weight"]
    else:
        assert model.get_parameter("patch_embed.proj.weight").ndim == 4  # the conv kernel is decayed too
    # the optimizer groups follow the mask exactly
    opt = build_optimizer(model, _cfg())
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(WD / LR)
    assert opt.param_groups[1]["weight_decay"] == 0.0
    assert decayed == {id(p) for n, p in model.named_parameters() if mask[n]}
    assert len(opt.param_groups[0]["params"]) + len(opt.param_groups[1]["params"]) == len(mask)


def test_schedule_multiplier_cosine():
    total, warmup = 100, 10
    f = lambda s: schedule_multiplier(s, total=total, warmup=warmup, kind="cosine")  # noqa: E731
    assert f(0) == 0.0
    assert f(5) == pytest.approx(0.5)
    assert f(warmup) == pytest.approx(1.0)
    assert f(warmup + (total - warmup) // 2) == pytest.approx(0.5)
    assert f(total) == pytest.approx(0.0, abs=1e-12)
    assert f(total - 1) > 0
    vals = [f(s) for s in range(warmup, total + 1)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))  # monotone decay after warm-up
    assert all(a <= b for a, b in zip([f(s) for s in range(warmup + 1)], [f(s) for s in range(1, warmup + 1)]))


def test_schedule_multiplier_other_kinds():
    assert schedule_multiplier(0, total=100, warmup=10, kind="linear") == 0.0
    assert schedule_multiplier(55, total=100, warmup=10, kind="linear") == pytest.approx(0.5)
    assert schedule_multiplier(100, total=100, warmup=10, kind="linear") == pytest.approx(0.0)
    assert schedule_multiplier(3, total=100, warmup=10, kind="constant") == pytest.approx(0.3)
    assert schedule_multiplier(90, total=100, warmup=10, kind="constant") == 1.0
    assert schedule_multiplier(0, total=100, warmup=0, kind="cosine") == 1.0  # no warm-up: full lr at once


def test_scheduler_follows_multiplier():
    cfg = _cfg(steps=20, warmup_steps=4)
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg)
    for step in range(21):
        s = schedule_multiplier(step, total=20, warmup=4, kind="cosine")
        assert sched.get_last_lr()[0] == pytest.approx(LR * s, abs=1e-15)
        assert opt.param_groups[0]["lr"] == pytest.approx(LR * s, abs=1e-15)
        opt.step()
        sched.step()


# --- losses --------------------------------------------------------------------------------------------


def test_sigmoid_xent_matches_manual_formula():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, generator=g, dtype=torch.float64) * 3
    labels = torch.tensor([0, 3, 6, 3, 1])
    targets = one_hot_targets(labels, 7).double()
    p = torch.sigmoid(logits)
    manual = -(targets * torch.log(p) + (1 - targets) * torch.log(1 - p)).sum(dim=1).mean()
    got = sigmoid_xent(logits, targets)
    torch.testing.assert_close(got, manual, rtol=1e-10, atol=1e-12)
    # summed over classes, not averaged: K times the element-wise mean
    mean_bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets)
    torch.testing.assert_close(got, 7 * mean_bce)
    # numerically stable for huge logits
    big = torch.tensor([[80.0, -80.0]])
    assert torch.isfinite(sigmoid_xent(big, torch.tensor([[0.0, 1.0]])))


def test_softmax_xent_matches_cross_entropy():
    logits = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 4, 2, 2])
    torch.testing.assert_close(softmax_xent(logits, one_hot_targets(labels, 5)),
                               torch.nn.functional.cross_entropy(logits, labels))


def test_one_hot_label_smoothing():
    t = one_hot_targets(torch.tensor([1, 0]), 4, smoothing=0.2)
    torch.testing.assert_close(t.sum(1), torch.ones(2))
    torch.testing.assert_close(t[0], torch.tensor([0.05, 0.85, 0.05, 0.05]))


def test_targets_of_class_ids_and_label_sets():
    ids = torch.tensor([1, 0])
    torch.testing.assert_close(targets_of(ids, 4, 0.2), one_hot_targets(ids, 4, 0.2))
    multi_hot = torch.tensor([[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(targets_of(multi_hot, 4), multi_hot)
    # smoothing treats a label set as one-hot smoothing treats a class: (1 - s) t + s / K
    torch.testing.assert_close(targets_of(multi_hot, 4, 0.2)[0], torch.tensor([0.05, 0.85, 0.05, 0.85]))
    torch.testing.assert_close(targets_of(multi_hot[1:], 4, 0.2), one_hot_targets(ids[1:], 4, 0.2))
    with pytest.raises(ValueError, match="3 classes, the model 4"):
        targets_of(multi_hot[:, :3], 4)


def test_mixup_deterministic_and_identity():
    g = torch.Generator().manual_seed(0)
    images = torch.randn(6, 1, 8, 8, generator=g)
    targets = one_hot_targets(torch.tensor([0, 1, 2, 0, 1, 2]), 3)
    state = torch.get_rng_state()

    a_img, a_t = mixup(images, targets, 0.2, seed=3, step=7)
    b_img, b_t = mixup(images, targets, 0.2, seed=3, step=7)
    assert torch.equal(a_img, b_img) and torch.equal(a_t, b_t)
    c_img, _ = mixup(images, targets, 0.2, seed=3, step=8)
    assert not torch.equal(a_img, c_img)
    assert torch.equal(torch.get_rng_state(), state)  # no global RNG consumed

    # it is a convex combination of each example with its neighbour, one ratio per batch
    lam = float(np.random.default_rng([3, 7]).beta(0.2, 0.2))
    torch.testing.assert_close(a_img, lam * images + (1 - lam) * images.roll(1, 0))
    torch.testing.assert_close(a_t.sum(1), torch.ones(6))

    same_img, same_t = mixup(images, targets, 0.0, seed=3, step=7)
    assert torch.equal(same_img, images) and torch.equal(same_t, targets)


def test_adam_decay_translation_constant():
    # 'adam' stores wd / lr so that torch's lr * weight_decay equals big_vision's wd
    opt = build_optimizer(torch.nn.Linear(3, 3), _cfg(lr=2e-3, weight_decay=1e-4))
    g = opt.param_groups[0]
    assert g["weight_decay"] == pytest.approx(0.05)
    assert g["lr"] * g["weight_decay"] == pytest.approx(1e-4, rel=1e-12)


def test_cutmix_pastes_a_box_and_mixes_targets_by_its_area():
    images = torch.arange(4.0)[:, None, None, None].expand(4, 1, 16, 16).clone()  # image k is all k
    targets = one_hot_targets(torch.tensor([0, 1, 2, 3]), 4)
    mixed, t = mixup(images, targets, 0.0, seed=1, step=2, cutmix=1.0)
    for k in range(4):
        pasted = (mixed[k] == (k - 1) % 4).float().mean().item()  # the neighbour's pixels
        assert 0.0 <= pasted < 1.0
        assert torch.all((mixed[k] == k) | (mixed[k] == (k - 1) % 4))
        torch.testing.assert_close(t[k, (k - 1) % 4], torch.tensor(pasted), atol=1e-6, rtol=0)
        torch.testing.assert_close(t[k, k], torch.tensor(1 - pasted), atol=1e-6, rtol=0)
    again, _ = mixup(images, targets, 0.0, seed=1, step=2, cutmix=1.0)
    assert torch.equal(mixed, again)


def test_mixup_and_cutmix_take_the_partner_shift_places_back():
    """``shift`` (the repeat count under repeated augmentation) rolls the batch by that many places."""
    images = torch.arange(6.0)[:, None, None, None].expand(6, 1, 16, 16).clone()  # image k is all k
    targets = one_hot_targets(torch.arange(6), 6)
    for shift in (1, 3):
        mixed, t = mixup(images, targets, 0.4, seed=0, step=1, shift=shift)
        lam = float(np.random.default_rng([0, 1]).beta(0.4, 0.4))
        torch.testing.assert_close(mixed, lam * images + (1 - lam) * images.roll(shift, 0))
        torch.testing.assert_close(t, lam * targets + (1 - lam) * targets.roll(shift, 0))
        pasted, t = mixup(images, targets, 0.0, seed=1, step=2, cutmix=1.0, shift=shift)
        for k in range(6):
            partner = (k - shift) % 6
            assert torch.all((pasted[k] == k) | (pasted[k] == partner))
            area = (pasted[k] == partner).float().mean()
            torch.testing.assert_close(t[k, partner], area, atol=1e-6, rtol=0)


def test_mixup_cutmix_switch_uses_both_over_steps():
    images = torch.randn(4, 1, 16, 16)
    targets = one_hot_targets(torch.tensor([0, 1, 2, 3]), 4)
    kinds = set()
    for step in range(40):
        mixed, _ = mixup(images, targets, 0.8, seed=0, step=step, cutmix=1.0, switch_prob=0.5)
        box = (mixed == images) | (mixed == images.roll(1, 0))  # cutmix copies pixels verbatim
        kinds.add("cutmix" if bool(box.all()) else "mixup")
    assert kinds == {"cutmix", "mixup"}
