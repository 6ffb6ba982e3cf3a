"""The full profile's Table 1 recipe equals the paper's appendix C (big_vision AugReg config)."""

from __future__ import annotations

import re

import pytest
import yaml

from dpnrepro.config.sweeps import SWEEPS, sweep_config
from dpnrepro.config.params import load_params
from helpers import REPO
from paper_text import DEIT_THESIS, PAPER, source_text

def paper_config(start_marker: str, end_marker: str) -> str:
    """An appendix config of the paper with spacing removed and quotes restored (the PDF extraction
    spaces out tokens: "config .lr = 0.001")."""
    text = source_text(PAPER)
    start = text.index(start_marker)
    end = text.index(end_marker, start)
    return re.sub(r"\s+", "", text[start:end].replace("/quotesingle.ts1", "'"))


@pytest.fixture(scope="module")
def appendix_c() -> str:
    return paper_config("C ViT AugReg: Training Conﬁgurations", "D ViT AugReg: High Res Finetuning")


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
        ("config.log_training_steps=50", lambda p: p.runtime.log_every == 50),
        ("config.ckpt_steps=1000", lambda p: p.runtime.ckpt_every == 1000),
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
        c = sweep_config(full, "table1", arch)
        model, inp = c.model, c.input
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


# ---------------------------------------------------------------------------------------------------
# Appendix D: the 384 fine-tune (Table 1 "AugReg + 384x384 finetune" and Table 2 right).


@pytest.fixture(scope="module")
def appendix_d() -> str:
    return paper_config("D ViT AugReg: High Res Finetuning", "config . evals .val")


FINETUNES = ("ft384", "jft_220k_ft224", "jft_220k_ft384", "jft_1100k_ft224", "jft_1100k_ft384")


@pytest.mark.parametrize(
    "printed, getter",
    [
        ("config.loss='sigmoid_xent'", lambda c: c.train.loss == "sigmoid_xent"),
        ("config.total_steps=5000", lambda c: c.train.steps == 5000),
        ("config.input.batch_size=512", lambda c: c.train.batch_size == 512),
        ("config.optax_name='big_vision.momentum_hp'", lambda c: c.train.optimizer == "sgd_momentum"),
        ("config.grad_clip_norm=1.0", lambda c: c.train.grad_clip == 1.0),
        ("config.wd=None", lambda c: c.train.weight_decay == 0.0),
        ("config.lr=0.03", lambda c: c.train.lr == 0.03),
        ("warmup_steps=500", lambda c: c.train.warmup_steps == 500),
        ("decay_type='cosine'", lambda c: c.train.schedule == "cosine"),
        ("config.log_training_steps=10", lambda c: c.runtime.log_every == 10),
        ("pool_type='tok'", lambda c: c.model.pool == "tok"),
        ("rep_size=True", lambda c: c.model.rep_size is True),
        ("split='train[:99%]'", lambda c: c.data.minival_fraction == 0.01),
        ("flip_lr", lambda c: c.input.flip and c.input.inception_crop and not c.input.randaug and c.input.mixup == 0),
        # the head is re-initialised and no init_head_bias is set: its bias starts at 0 (the smoke profile differs)
        ("dont_load=['head/kernel','head/bias']", lambda c: c.model.head_bias_init == 0.0),
    ],
)
def test_finetune_recipes_match_appendix_d(appendix_d, full, printed, getter):
    assert printed in appendix_d, f"{printed!r} not in appendix D: the test's transcription is wrong"
    for sweep in FINETUNES:
        for arch in getattr(full, sweep).archs:
            assert getter(sweep_config(full, sweep, arch)), f"{sweep}/{arch} disagrees with appendix D's {printed!r}"


def test_finetune_resolutions_match_appendix_d(appendix_d, full):
    assert "decode_jpeg_and_inception_crop(384)" in appendix_d
    assert "resize_small(418)|central_crop(384)" in appendix_d
    assert "dont_load=['head/kernel','head/bias']" in appendix_d
    for sweep in ("ft384", "jft_220k_ft384", "jft_1100k_ft384"):
        c = sweep_config(full, sweep, getattr(full, sweep).archs[0])
        assert (c.input.image_size, c.input.eval_resize) == (384, 418), sweep
    for sweep in ("jft_220k_ft224", "jft_1100k_ft224"):  # the 224 fine-tune uses appendix C's eval crop
        c = sweep_config(full, sweep, getattr(full, sweep).archs[0])
        assert (c.input.image_size, c.input.eval_resize) == (224, 256), sweep
    from dpnrepro.config.sweeps import SWEEPS

    assert SWEEPS["ft384"].init_from == "table1"
    assert {SWEEPS["jft_220k_ft224"].init_from, SWEEPS["jft_220k_ft384"].init_from} == {"jft_220k"}
    assert {SWEEPS["jft_1100k_ft224"].init_from, SWEEPS["jft_1100k_ft384"].init_from} == {"jft_1100k"}


# ---------------------------------------------------------------------------------------------------
# Sec. 5.1: which models, how long, and how ImageNet-21k / JFT runs are evaluated.


@pytest.fixture(scope="module")
def section_5_1() -> str:
    text = source_text(PAPER)
    start = text.index("5.1 Setup")
    return re.sub(r"\s+", " ", text[start:text.index("5.2 DPN versus", start)])


def test_pretraining_regimes_match_section_5_1(section_5_1, full):
    assert "two training regimes: 93K and 930K steps" in section_5_1
    assert (full.i21k_93k.recipe.train["steps"], full.i21k_930k.recipe.train["steps"]) == (93_000, 930_000)
    assert "(220K and 1.1M steps) with a batch size of 4096" in section_5_1
    assert (full.jft_220k.recipe.train["steps"], full.jft_1100k.recipe.train["steps"]) == (220_000, 1_100_000)
    assert "3 variants (B/32, B/16 and L/16)" in section_5_1
    assert full.jft_220k.archs == full.jft_1100k.archs == ["B-32", "B-16", "L-16"]
    assert "we do not use any additional data augmentation or mixup regularization" in section_5_1
    for sweep in ("jft_220k", "jft_1100k"):
        for arch in getattr(full, sweep).archs:
            c = sweep_config(full, sweep, arch)
            assert c.input.randaug == "" and c.input.mixup == 0.0 and c.train.batch_size == 4096
    assert "we train each model once and report the mean 25 shot accuracy with 95%" in section_5_1
    for sweep in ("i21k_93k", "i21k_930k", "jft_220k", "jft_1100k"):
        sw = getattr(full, sweep)
        assert sw.seeds == [0] and SWEEPS[sweep].evaluate == "fewshot" and sw.fewshot is not None, sweep
        assert (sw.fewshot.shots, sw.fewshot.draws, sw.fewshot.l2_reg) == (25, 3, 2.0**10), sweep
    assert "Ti/16, S/16, S/32, B/16 and B/32" in section_5_1
    assert sorted(full.table1.archs) == sorted(["Ti-16", "S-16", "S-32", "B-16", "B-32"])
    assert "base and small DeiT variants" in section_5_1
    assert full.deit.archs == ["S-16", "B-16"]


# ---------------------------------------------------------------------------------------------------
# DeiT (seed 004, Touvron's thesis, Table 3.9, DeiT-B column), applied to S/16 and B/16.


@pytest.fixture(scope="module")
def table_3_9() -> dict[str, str]:
    text = source_text(DEIT_THESIS)
    start = text.index("Methods\tViT-B [61]\tDeiT-B")
    end = text.index("Table 3.9", start)
    rows = {}
    for line in text[start:end].splitlines():
        cells = line.split("\t")
        if len(cells) == 3:
            rows[cells[0]] = cells[2]  # the DeiT-B column
    return rows


def test_deit_recipe_matches_table_3_9(table_3_9, full):
    t = table_3_9
    assert t["Epochs"] == "300" and t["Batch size"] == "1024" and t["Optimizer"] == "AdamW"
    assert t["learning rate"] == r"$0.0005 \times \frac{\text{batchsize}}{512}$"
    assert (t["Learning rate decay"], t["Weight decay"], t["Warmup epochs"]) == ("cosine", "0.05", "5")
    assert (t["Label smoothing ε"], t["Dropout"], t["Stoch. Depth"]) == ("0.1", r"\times", "0.1")
    assert (t["Repeated Aug"], t["Gradient Clip."]) == (r"\checkmark", r"\times")
    assert (t["Rand Augment"], t["Mixup alpha."], t["Cutmix alpha."], t["Erasing prob."]) == ("9/0.5", "0.8", "1.0", "0.25")
    steps_per_epoch = 1_281_167 // 1024
    for arch in full.deit.archs:
        c = sweep_config(full, "deit", arch)
        assert c.train.optimizer == "adamw" and c.train.schedule == "cosine"
        assert c.train.batch_size == 1024
        assert c.train.lr == pytest.approx(0.0005 * c.train.batch_size / 512)
        assert c.train.weight_decay == 0.05
        assert c.train.steps == 300 * steps_per_epoch and c.train.warmup_steps == 5 * steps_per_epoch
        assert c.train.label_smoothing == 0.1 and c.train.grad_clip == 0.0
        assert c.model.dropout == 0.0 and c.model.stoch_depth == 0.1
        assert c.input.randaug == "rand-m9-mstd0.5-inc1"  # timm's spelling of magnitude 9, std 0.5
        assert (c.input.mixup, c.input.cutmix, c.input.random_erasing) == (0.8, 1.0, 0.25)
        assert c.input.repeated_aug == 3


# ---------------------------------------------------------------------------------------------------
# The sweeps that are not in the seeds cite their source; these check what the paper does say.


def test_splus_and_i21k_follow_the_shared_appendix_c_values(full):
    # S/16+ (big_vision vit_s16_i1k.py) and the 21k config (vit_i21k.py) share appendix C's optimiser.
    for sweep in ("splus", "i21k_93k", "i21k_930k"):
        for arch in getattr(full, sweep).archs:
            c = sweep_config(full, sweep, arch)
            assert (c.train.optimizer, c.train.lr, c.train.weight_decay) == ("adam", 0.001, 0.0001), sweep
            assert (c.train.warmup_steps, c.train.grad_clip, c.train.schedule) == (10_000, 1.0, "cosine"), sweep
    c = sweep_config(full, "splus", "S-16")
    assert (c.model.pool, c.model.posemb, c.train.loss, c.train.batch_size) == ("gap", "sincos2d", "softmax_xent", 1024)
    assert c.train.steps == round(300 * round(1_281_167 * 0.99) / 1024)
    assert full.data_i21k.num_classes == 21843


def test_every_profile_defines_every_sweep_dvc_yaml_uses():
    from dpnrepro.config.sweeps import SWEEPS

    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name in ("smoke", "mini", "full"):
        params = load_params(REPO / "profiles" / f"{name}.yaml")
        assert list(params.sweeps()) == list(SWEEPS), name
    for sweep in SWEEPS:
        assert f"train-{sweep}" in stages, sweep


def test_crop_sampler_matches_each_recipe_source(appendix_c, appendix_d, full):
    """big_vision's ``decode_jpeg_and_inception_crop`` (TF sampler, default area 5-100 %) in every AugReg-style
    sweep; DeiT is built on timm, whose ``RandomResizedCrop`` samples like torchvision's."""
    from dpnrepro.config.sweeps import SWEEPS

    assert "decode_jpeg_and_inception_crop(224)" in appendix_c
    assert "decode_jpeg_and_inception_crop(384)" in appendix_d
    assert "We build upon PyTorch [150] and the timm library [214]" in source_text(DEIT_THESIS)
    for sweep in SWEEPS:
        for arch in getattr(full, sweep).archs:
            inp = sweep_config(full, sweep, arch).input
            expected = ("torchvision", 0.08) if sweep == "deit" else ("big_vision", 0.05)
            assert inp.inception_crop and (inp.crop_sampler, inp.crop_min_area) == expected, (sweep, arch)


# ---------------------------------------------------------------------------------------------------
# Appendix E: VTAB fine-tuning (Table 3); appendix F: Sun397 from scratch (Table 7).


@pytest.fixture(scope="module")
def appendix_e() -> str:
    return paper_config("E VTAB Finetuneing", "F SUN397: Train from scratch")


@pytest.fixture(scope="module")
def appendix_f() -> str:
    return paper_config("F SUN397: Train from scratch", "Table 7")


@pytest.mark.parametrize(
    "printed, getter",
    [
        ("config.loss='sigmoid_xent'", lambda i, m, t: t.loss == "sigmoid_xent"),
        ("config.total_steps=2500", lambda i, m, t: t.steps == 2500),
        ("config.input.batch_size=512", lambda i, m, t: t.batch_size == 512),
        ("config.optax_name='big_vision.momentum_hp'", lambda i, m, t: t.optimizer == "sgd_momentum"),
        ("config.grad_clip_norm=1.0", lambda i, m, t: t.grad_clip == 1.0),
        ("config.wd=None", lambda i, m, t: t.weight_decay == 0.0),
        ("warmup_steps=200,", lambda i, m, t: t.warmup_steps == 200),
        ("decay_type='cosine'", lambda i, m, t: t.schedule == "cosine"),
        ("rep_size=True", lambda i, m, t: m.rep_size is True),
        ("pool_type='tok'", lambda i, m, t: m.pool == "tok"),
        # head re-initialised: finetune.HEAD_KEYS are not loaded; the fresh head's bias init is 0
        ("dont_load=['head/kernel','head/bias']", lambda i, m, t: m.head_bias_init == 0.0),
        ("variant='B/32'", lambda i, m, t: i.image_size == 224 and not i.flip and not i.randaug and not i.mixup),
    ],
)
def test_full_vtab_recipe_matches_appendix_e(appendix_e, full, printed, getter):
    from dpnrepro.config.transfer import vtab_config

    assert printed in appendix_e, f"{printed!r} not in appendix E: the test's transcription is wrong"
    for lr in full.vtab.lrs:
        assert getter(*vtab_config(full, lr)), f"profiles/full.yaml vtab disagrees with appendix E's {printed!r}"


def test_full_vtab_protocol_matches_sec_6_1(appendix_e, full):
    from dpnrepro.training.finetune import HEAD_KEYS

    assert "split='train[:800]'" in appendix_e
    assert HEAD_KEYS == ("head.weight", "head.bias")
    assert len(full.vtab.lrs) == 3 and 0.0003 in full.vtab.lrs  # "3 learning rates"; appendix E prints 0.0003
    assert "config.lr=0.0003" in appendix_e
    assert len(full.vtab.seeds) == 3                            # "mean validation accuracy across 3 seeds"
    assert set(full.vtab.archs) == {"B-32", "B-16"} and set(full.vtab.archs) <= set(full.table1.archs)
    assert len(full.vtab.tasks) == 19


def test_full_sun397_grid_matches_appendix_f(appendix_f, full):
    import re

    sp = full.sun397_scratch
    m = re.search(r"3learningrates:([\d.e,-]+),2weightdecays:([\d.,]+)andtwodropoutvalues:([\d.,]+?)\.We", appendix_f)
    lrs, wds, dos = ([float(x) for x in g.split(",")] for g in m.groups())
    assert (sp.grid.lr, sp.grid.weight_decay, sp.grid.dropout) == (lrs, wds, dos)
    m = re.search(r"3mixupvalues([\d.]+),([\d.]+)and([\d.]+)and4randaugmentdistortionmagnitudes(\d+),(\d+),(\d+)and(\d+)",
                  appendix_f)
    assert sp.aug_grid.mixup == [float(x) for x in m.groups()[:3]]
    assert sp.aug_grid.randaug_magnitude == [int(x) for x in m.groups()[3:]]
    # "We train the final config for 600 epochs": Sun397's ~76k train images at the profile's batch
    assert "600epochs" in appendix_f
    batch = full.train.model_copy(update=full.sun397_scratch.recipe.train).batch_size
    assert abs(600 * 76_128 / batch - sp.longer_steps) / sp.longer_steps < 0.01
