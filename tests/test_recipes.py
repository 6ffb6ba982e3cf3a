"""The full profile's Table 1 recipe equals the paper's appendix C (big_vision AugReg config)."""

from __future__ import annotations

import re

import pytest
import yaml

from dpnrepro.config import load_params, resolve_run
from helpers import REPO

SEEDS = REPO.parent / "shared" / "seeds"


@pytest.fixture(scope="module")
def appendix_c() -> str:
    papers = sorted(SEEDS.glob("000_*.txt"))
    if not papers:
        pytest.skip(f"paper text not found under {SEEDS}")
    text = papers[0].read_text()
    start, end = text.index("C ViT AugReg: Training Conﬁgurations"), text.index("D ViT AugReg: High Res Finetuning")
    # The PDF extraction spaces out tokens ("config .lr = 0.001"); normalise spacing and quotes.
    return re.sub(r"\s+", "", text[start:end].replace("/quotesingle.ts1", "'"))


@pytest.fixture(scope="module")
def full():
    return load_params(REPO / "profiles" / "full.yaml")


@pytest.mark.parametrize(
    "printed, getter",
    [
        ("config.lr=0.001", lambda p: p.train.lr == 0.001),
        ("config.wd=0.0001", lambda p: p.train.weight_decay == 0.0001),
        ("config.input.batch_size=4096", lambda p: p.train.batch_size == 4096),
        ("warmup_steps=10_000", lambda p: p.train.warmup_steps == 10_000),
        ("decay_type='cosine'", lambda p: p.train.schedule == "cosine"),
        ("config.grad_clip_norm=1.0", lambda p: p.train.grad_clip == 1.0),
        ("config.loss='sigmoid_xent'", lambda p: p.train.loss == "sigmoid_xent"),
        ("config.optax_name='scale_by_adam'", lambda p: p.train.optimizer == "adam"),
        ("config.init_head_bias=-6.9", lambda p: p.model.head_bias_init == -6.9),
        ("config.num_classes=1000", lambda p: p.data.num_classes == 1000),
        ("pool_type='tok'", lambda p: p.model.pool == "tok"),
        ("rep_size=True", lambda p: p.model.rep_size is True),
        ("dropout=0.1", lambda p: p.model.dropout == 0.1),
        ("stoch_depth=0.1", lambda p: p.model.stoch_depth == 0.1),
        ("decode_jpeg_and_inception_crop(224)", lambda p: p.input.image_size == 224 and p.input.inception_crop),
        ("flip_lr", lambda p: p.input.flip),
        ("resize_small(256)|central_crop(224)", lambda p: p.input.eval_resize == 256),
        ("split='train[:99%]'", lambda p: p.data.minival_fraction == 0.01),
        ("get_eval('train[99%:]')", lambda p: p.data.minival_fraction == 0.01),
        ("get_eval('validation')", lambda p: p.data.eval_split == "validation"),
        ("config.log_training_steps=50", lambda p: p.train.log_every == 50),
        ("config.ckpt_steps=1000", lambda p: p.train.ckpt_every == 1000),
    ],
)
def test_full_profile_matches_appendix_c(appendix_c, full, printed, getter):
    assert printed in appendix_c, f"{printed!r} not in appendix C: the test's transcription is wrong"
    assert getter(full), f"profiles/full.yaml disagrees with appendix C's {printed!r}"


# Appendix C: aug_setting per variant, RANDAUG_DEF / MIXUP_DEF, and the text below the config.
AUG = {"Ti-16": "light1", "S-32": "medium1", "S-16": "medium2", "B-32": "medium2", "B-16": "medium2"}
RANDAUG = {"light1": (2, 0), "medium1": (2, 15), "medium2": (2, 15)}
MIXUP = {"light1": 0.0, "medium1": 0.2, "medium2": 0.5}


def test_per_arch_augmentation_matches_appendix_c(appendix_c, full):
    for arch, setting in AUG.items():
        assert f"'{arch.replace('-', '/')}':'{setting}'" in appendix_c
        n, m = RANDAUG[setting]
        assert f"'{setting}':'randaug({n},{m})'" in appendix_c
        assert f"'{setting}':dict(p={MIXUP[setting]},fold_in=None)" in appendix_c
        model, inp = resolve_run(full, "table1", arch)
        assert inp.randaug.startswith(f"rand-n{n}-m{m}-"), (arch, inp.randaug)
        assert inp.mixup == MIXUP[setting], arch
        is_b = arch.startswith("B-")
        assert (model.dropout, model.stoch_depth) == ((0.1, 0.1) if is_b else (0.0, 0.0)), arch
        assert model.rep_size is (arch != "S-32"), arch


def test_93k_steps_is_300_epochs_of_train_99_percent(full):
    # Sec. 5.1 trains for 93000 steps; appendix C says 300 epochs of train[:99%] (1,281,167 images).
    assert full.train.steps == 93_000
    assert abs(300 * 1_281_167 * 0.99 / 4096 - full.train.steps) / full.train.steps < 0.01


def test_profiles_validate_and_smoke_is_active():
    active = yaml.safe_load((REPO / "params.yaml").read_text())
    assert active == yaml.safe_load((REPO / "profiles" / "smoke.yaml").read_text())
    for name in ("smoke", "mini", "full"):
        assert load_params(REPO / "profiles" / f"{name}.yaml").profile == name
