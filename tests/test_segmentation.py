"""Table 5 segmentation through mmsegmentation + mmengine: backbone registry, checkpoint conversion,
appendix G recipe, data fractions and layout, Runner training + IoUMetric, kill/resume, report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpnrepro.artifacts import ModelSpec, save_weights
from dpnrepro.data.segmentation import (FASHION_CLASSES, check_layout, compose_canvases, export_canvases,
                                        fraction_indices, parse_fraction)
from dpnrepro.errors import CheckpointError, DatasetError
from dpnrepro.models import STEMS
from dpnrepro.models.posemb import resample_posemb
from paper_text import PAPER, source_text

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "segmentation"
FULL, SMOKE = CONFIGS / "ade20k_b16_linear.py", CONFIGS / "canvas_mu7_linear.py"
FMNIST = "/usr/share/datasets/fashion-mnist"


# --- pretraining checkpoint -> backbone ----------------------------------------------------------------

def _pretraining_run(tmp_path, stem="dpn", posemb="learn"):
    torch.manual_seed(0)
    spec = ModelSpec(arch="Mu/7", stem=stem, placement="pre-pre", num_classes=10, img_size=28, in_chans=1,
                     pool="tok", rep_size=True, head_bias_init=-2.2, pos_drop_rate=0.0, proj_drop_rate=0.0,
                     drop_path_rate=0.0, posemb=posemb)
    model = spec.build()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    run = tmp_path / f"run_{stem}"
    run.mkdir()
    save_weights(model, run / "model.safetensors")
    (run / "model_spec.json").write_text(spec.to_json())
    return model.eval(), run


def _backbone(stem="dpn", img_size=28, pretrained=None, posemb="learn"):
    from dpnrepro.segmentation import DPNVisionTransformer

    torch.manual_seed(1)
    return DPNVisionTransformer(arch="Mu-7", stem=stem, img_size=img_size, in_channels=1, posemb=posemb,
                                pretrained=pretrained and str(pretrained))


@pytest.mark.parametrize("stem", STEMS)
def test_conversion_round_trips_features(tmp_path, stem):
    """Same grid: the backbone's map is the classifier's last-block tokens, bit for bit, for every stem."""
    model, run = _pretraining_run(tmp_path, stem)
    bb = _backbone(stem, pretrained=run)
    bb.init_weights()
    bb.eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        ref = model.forward_intermediates(x, indices=[3], norm=False, output_fmt="NCHW", intermediates_only=True)
        (ours,) = bb(x)
    assert ours.shape == (2, 64, 4, 4)
    assert torch.equal(ours, ref[0])
    own = {k[len("vit."):]: v for k, v in bb.state_dict().items()}
    src = model.state_dict()
    assert set(src) - set(own) == {k for k in src if k.startswith(("head.", "pre_logits."))} != set()
    assert all(torch.equal(own[k], src[k]) for k in own)


def test_conversion_resizes_position_embeddings_to_the_segmentation_grid(tmp_path):
    from dpnrepro.segmentation.convert import backbone_state_from_run

    model, run = _pretraining_run(tmp_path)
    bb = _backbone(img_size=56)
    state = backbone_state_from_run(run / "model.safetensors", bb)
    assert state["vit.pos_embed"].shape == (1, 64, 64)  # 56 / 7 = 8 x 8 grid
    assert torch.equal(state["vit.pos_embed"], resample_posemb(model.pos_embed, (8, 8)))
    bb.load_state_dict(state)  # strict
    (feat,) = bb.eval()(torch.randn(1, 1, 56, 56))
    assert feat.shape == (1, 64, 8, 8)


def test_conversion_refuses_another_stem_or_arch(tmp_path):
    from dpnrepro.segmentation import DPNVisionTransformer
    from dpnrepro.segmentation.convert import backbone_state_from_run

    _, run = _pretraining_run(tmp_path, "conv")
    with pytest.raises(CheckpointError, match="stem 'conv'"):
        backbone_state_from_run(run, _backbone("dpn"))
    (run / "model_spec.json").unlink()
    with pytest.raises(CheckpointError, match="do not fit"):
        backbone_state_from_run(run, DPNVisionTransformer(arch="Mu/4", stem="conv", img_size=28, in_channels=1))


# --- registry, config files, appendix G ----------------------------------------------------------------

def test_backbone_is_found_through_custom_imports_in_a_config_file(tmp_path):
    """A fresh interpreter that never imported dpnrepro.segmentation builds our backbone from a config file."""
    cfg = tmp_path / "cfg.py"
    cfg.write_text(f"_base_ = [{str(SMOKE)!r}]\nmodel = dict(backbone=dict(stem='post_posemb'))\n")
    code = ("import sys; from mmengine.config import Config; from mmseg.registry import MODELS; "
            "assert 'dpnrepro.segmentation' not in sys.modules; "
            f"cfg = Config.fromfile({str(cfg)!r}); "
            "assert 'dpnrepro.segmentation' in sys.modules; "
            "from mmseg.utils import register_all_modules; register_all_modules(); "
            "m = MODELS.build(cfg.model); print(type(m.backbone).__name__, m.backbone.vit.stem, "
            "type(m.decode_head).__name__, m.decode_head.num_convs)")
    from helpers import clean_env

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=clean_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["DPNVisionTransformer", "post_posemb", "FCNHead", "0"]


def _paper_config_text() -> str:
    text = source_text(PAPER)
    return text[text.index("G Semantic Segmentation Hyperparameter"):text.index("H Gradient Norm Scale")]


def _paper(pattern: str) -> str:
    m = re.search(pattern, _paper_config_text())
    assert m, pattern
    return m.group(1)


def test_full_config_is_appendix_g():
    """Every recipe value of the full config, checked against appendix G's text (the paper's text)."""
    _paper_config_text()  # skips here, before any import, without the paper's text
    from mmengine.config import Config

    cfg = Config.fromfile(str(FULL))
    bb, head = cfg.model.backbone, cfg.model.decode_head
    assert float(_paper(r"base_learning_rate = ([0-9.]+)")) == cfg.optim_wrapper.optimizer.lr == 3e-5
    assert _paper(r"config \. optimizer = \S+?([a-z]+) ") == cfg.optim_wrapper.optimizer.type.lower() == "adamw"
    assert float(_paper(r"weight_decay = ([0-9.]+)")) == cfg.optim_wrapper.optimizer.weight_decay == 0.01
    assert _paper(r"skip_scale_and_bias_regularization = (\w+)") == "True"
    assert cfg.optim_wrapper.paramwise_cfg.flat_decay_mult == 0.0   # every 1-D tensor: scales and biases
    assert _paper(r"max_grad_norm = (\w+)") == "None" and cfg.optim_wrapper.clip_grad is None
    batch = int(_paper(r"config \. batch_size = ([0-9]+)"))
    assert batch == cfg.train_dataloader.batch_size == 16
    epochs, images = int(_paper(r"num_training_epochs = ([0-9]+)")), int(_paper(r"steps_per_epoch = ([0-9]+)"))
    assert (epochs, images) == (128, 20210)
    assert cfg.train_cfg.max_iters == epochs * (images // batch) == 161664
    (sched,) = cfg.param_scheduler
    assert sched.type == "PolyLR" and sched.end == cfg.train_cfg.max_iters and sched.by_epoch is False
    assert float(_paper(r"power = ([0-9.]+)")) == sched.power == 0.9
    assert float(_paper(r"end_factor = ([0-9.]+)")) == sched.eta_min == 0.0
    assert int(_paper(r"warmup_steps = ([0-9]+)")) == 0 and sched.begin == 0
    assert float(_paper(r"stochastic_depth = ([0-9.]+)")) == bb.drop_path_rate == 0.1
    assert re.search(r"VARIANT \. split", _paper_config_text()) and bb.arch == "B/16"  # Sec. 6.3: B/16
    assert _paper(r"out_with_norm = (\w+)") == "False" and bb.final_norm is False
    assert _paper(r"model \.fcn = (\w+)") == "True" and _paper(r"upernet = (\w+)") == "False"
    assert head.type == "FCNHead" and head.num_convs == 0 and head.concat_input is False  # Segmenter-linear
    assert head.num_classes == 150 and head.in_channels == head.channels == 768
    assert head.loss_decode.type == "CrossEntropyLoss" and head.loss_decode.avg_non_ignore  # Sec. 6.3: per-pixel CE
    crop = int(_paper(r"random_crop_with_mask \( size =([0-9]+)"))
    assert crop == 512 == bb.img_size and cfg.crop_size == (512, 512)
    assert _paper(r"posembs = \(([0-9]+) , [0-9]+\)") == str(512 // 16)
    assert int(_paper(r"window_stride = ([0-9]+)")) == 341
    assert cfg.model.test_cfg.mode == "slide" and cfg.model.test_cfg.stride == (341, 341)
    assert cfg.model.test_cfg.crop_size == (512, 512)
    train = {t.type: t for t in cfg.train_dataloader.dataset.pipeline}
    assert _paper(r"img_scale =\((\d+ , \d+)\)") == "2048 , 512" and train["RandomResize"].scale == (2048, 512)
    assert _paper(r"ratio_range =\(([0-9. ,]+)\)") == "0.5 , 2.0" and train["RandomResize"].ratio_range == (0.5, 2.0)
    assert float(_paper(r"cat_max =([0-9.]+)")) == train["RandomCrop"].cat_max_ratio == 0.75
    assert "flip_with_mask" in _paper_config_text() and train["RandomFlip"].prob == 0.5
    assert "photometricdistortion" in _paper_config_text() and "PhotoMetricDistortion" in train
    assert _paper(r"ignore_label =(\d)") == "0" and train["LoadAnnotations"].reduce_zero_label is True
    mean = [float(v) for v in _paper(r"mean_std = \S*?\[([0-9., ]+)\]").split(",")]
    assert cfg.model.data_preprocessor.mean == pytest.approx([255 * m for m in mean])
    # pp_eval: no resize before the sliding windows
    assert [t.type for t in cfg.val_dataloader.dataset.pipeline] == ["LoadImageFromFile", "LoadAnnotations",
                                                                      "PackSegInputs"]
    assert cfg.custom_imports.imports == ["dpnrepro.segmentation"] and not cfg.custom_imports.allow_failed_imports


def test_full_config_builds_b16_on_the_512_grid():
    from mmengine.config import Config
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    register_all_modules()
    model = MODELS.build(Config.fromfile(str(FULL)).model)
    vit = model.backbone.vit
    assert model.backbone.grid_size == (32, 32) and vit.pos_embed.shape == (1, 1024, 768)
    assert vit.stem == "dpn" and len(vit.blocks) == 12 and model.backbone.out_indices == (11,)
    assert model.decode_head.conv_seg.weight.shape == (150, 768, 1, 1)
    assert isinstance(model.decode_head.convs, torch.nn.Identity)  # num_convs=0: features go straight to conv_seg


def test_full_config_evaluates_sides_that_are_not_multiples_of_16_as_padding_by_hand():
    """ADE20K's validation images come in any size (e.g. 375 x 500): evaluation must not raise in the
    backbone, and must give what padding the image right / bottom to 384 x 512 by hand, sliding the
    windows over it and cutting the padding off the logits gives."""
    import torch.nn.functional as F
    from mmengine.config import Config
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample
    from mmseg.utils import register_all_modules

    register_all_modules()
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(str(FULL)).model).eval()
    img = torch.randint(0, 256, (3, 375, 500), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    sample = SegDataSample(metainfo=dict(ori_shape=(375, 500), img_shape=(375, 500)))
    with torch.no_grad():
        (out,) = model.test_step(dict(inputs=[img], data_samples=[sample]))
        pre = model.data_preprocessor
        x = (img[[2, 1, 0]].float() - pre.mean) / pre.std                      # bgr_to_rgb, standardize
        padded = F.pad(x, (0, 512 - 500, 0, 384 - 375))[None]                  # pad value 0 (pad_val)
        meta = dict(ori_shape=(384, 512), img_shape=(384, 512), pad_shape=(384, 512), padding_size=[0] * 4)
        by_hand = model.inference(padded, [meta])[0, :, :375, :500]
    assert out.seg_logits.data.shape == (150, 375, 500)
    torch.testing.assert_close(out.seg_logits.data, by_hand)


def test_smoke_config_inherits_the_recipe():
    from mmengine.config import Config

    full, smoke = Config.fromfile(str(FULL)), Config.fromfile(str(SMOKE))
    for key in ("type", "betas", "weight_decay"):
        assert smoke.optim_wrapper.optimizer[key] == full.optim_wrapper.optimizer[key]
    assert smoke.optim_wrapper.paramwise_cfg == full.optim_wrapper.paramwise_cfg
    assert smoke.model.backbone.drop_path_rate == 0.1 and smoke.model.backbone.final_norm is False
    assert smoke.model.decode_head.num_convs == 0 and smoke.model.test_cfg.mode == "slide"
    # appendix G's stride : crop ratio (341 / 512) at the smoke crop
    assert smoke.model.test_cfg.stride[0] == round(56 * 341 / 512)


def test_no_weight_decay_on_norms_and_biases():
    """flat_decay_mult=0 gives wd 0.01 to matrices, embeddings and tokens, 0 to every scale and bias."""
    from mmengine.config import Config
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules
    from mmengine.optim import build_optim_wrapper

    register_all_modules()
    cfg = Config.fromfile(str(SMOKE))
    model = MODELS.build(cfg.model)
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    wd = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in wrapper.optimizer.param_groups:
        for p in group["params"]:
            wd[names[id(p)]] = group["weight_decay"]
    assert wd["backbone.vit.patch_embed.norm_in.weight"] == 0 and wd["backbone.vit.blocks.0.norm1.bias"] == 0
    assert wd["decode_head.conv_seg.bias"] == 0
    assert wd["backbone.vit.blocks.0.attn.qkv.weight"] == 0.01 and wd["backbone.vit.pos_embed"] == 0.01
    assert wd["decode_head.conv_seg.weight"] == 0.01


# --- data ----------------------------------------------------------------------------------------------

def test_fractions_are_seeded_nested_subsets():
    assert parse_fraction("1/16") == parse_fraction(0.0625)
    for bad in ("0", "3/2", "x"):
        with pytest.raises(ValueError):
            parse_fraction(bad)
    a, b = fraction_indices(160, "1/16", 0), fraction_indices(160, "1/4", 0)
    assert len(a) == 10 and len(b) == 40 and set(a) <= set(b) and a == sorted(a)
    assert fraction_indices(160, "1/16", 0) == a and fraction_indices(160, "1/16", 1) != a
    assert fraction_indices(160, "1", 3) == list(range(160))
    assert len(fraction_indices(5, "1/16", 0)) == 1


def test_canvas_labels_follow_each_items_silhouette():
    items = np.zeros((2, 28, 28), np.uint8)
    items[0, 5:20, 5:20] = 200     # a square of class 3
    items[1, 10:12, :] = 100       # a bar of class 7
    canvases, maps = compose_canvases(items, np.array([3, 7]), 20, size=40, items=(1, 3), seed=0)
    assert canvases.shape == maps.shape == (20, 40, 40)
    assert set(np.unique(maps)) <= {0, 4, 8} and (maps == 4).any() and (maps == 8).any()
    # a labelled pixel shows its item's grey value; a later item occludes an earlier one
    assert np.all(canvases[maps == 4] == 200) and np.all(canvases[maps == 8] == 100)
    assert np.all(canvases[maps == 0] < 24)  # background noise only


def test_layout_errors_are_one_line(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        check_layout(tmp_path / "ADEChallengeData2016")
    (tmp_path / "images" / "training").mkdir(parents=True)
    with pytest.raises(DatasetError, match="annotations/training is missing"):
        check_layout(tmp_path)
    for d in ("annotations/training", "images/validation", "annotations/validation"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "images/training/a.jpg").write_bytes(b"")
    (tmp_path / "images/validation/b.jpg").write_bytes(b"")
    (tmp_path / "annotations/validation/b.png").write_bytes(b"")
    with pytest.raises(DatasetError, match="have no annotation"):
        check_layout(tmp_path)
    (tmp_path / "annotations/training/a.png").write_bytes(b"")
    assert check_layout(tmp_path) == {"train": 1, "val": 1}


# --- Runner, IoUMetric, resume -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def canvases(tmp_path_factory):
    root = tmp_path_factory.mktemp("seg") / "canvases"
    export_canvases(FMNIST, root, train_images=16, val_images=3, size=84, items=(2, 4), seed=0)
    return root


def _cfg(canvases, work, pretrained=None, **options):
    from dpnrepro.segmentation.experiment import run_config

    opts = {"train_cfg.max_iters": 4, "param_scheduler.0.end": 4, "default_hooks.checkpoint.interval": 2,
            "train_dataloader.batch_size": 4, **options}
    return run_config(SMOKE, arch="Mu-7", stem="dpn", fraction="1/2", seed=3, data_root=canvases, work_dir=work,
                      pretrained=pretrained, options=opts)


def test_runner_trains_and_iou_metric_evaluates(canvases, tmp_path):
    from dpnrepro.segmentation.experiment import train_and_evaluate

    cfg = _cfg(canvases, tmp_path / "work")
    assert len(cfg.train_dataloader.dataset.indices) == 8
    out = train_and_evaluate(cfg)
    assert set(out) >= {"mIoU", "mAcc", "aAcc", "state_dict"} and out["iters"] == 4 and out["train_images"] == 8
    assert 0 <= out["mIoU"] <= 100 and 0 < out["aAcc"] <= 100
    assert (tmp_path / "work" / "iter_4.pth").exists()


@pytest.mark.parametrize("stem", ["conv", "dpn"])
def test_fine_tune_starts_from_the_pretraining_weights(canvases, tmp_path, stem):
    """The segment stage's own path (run_config -> Runner.train -> init_weights -> convert.py) puts the
    pretraining run's encoder into the backbone: with lr 0 the trained backbone is the checkpoint's, tensor
    for tensor (position embeddings resized to the 8 x 8 crop grid), and not a fresh initialisation."""
    from safetensors.torch import load_file

    from dpnrepro.segmentation.experiment import train_and_evaluate

    model, run = _pretraining_run(tmp_path, stem)
    cfg = _cfg(canvases, tmp_path / "work", pretrained=run, **{
        "train_cfg.max_iters": 1, "param_scheduler.0.end": 1, "optim_wrapper.optimizer.lr": 0.0})
    cfg.model.backbone.stem = stem
    trained = train_and_evaluate(cfg)["state_dict"]
    backbone = {k[len("backbone.vit."):]: v for k, v in trained.items() if k.startswith("backbone.vit.")}
    source = {k: v for k, v in load_file(str(run / "model.safetensors")).items()
              if not k.startswith(("head.", "pre_logits."))}
    assert set(backbone) == set(source)
    assert torch.equal(backbone["pos_embed"], resample_posemb(source["pos_embed"], (8, 8)))
    assert all(torch.equal(backbone[k], source[k]) for k in source if k != "pos_embed")


class _Killed(Exception):
    pass


def test_killed_run_resumes_bit_identical(canvases, tmp_path):
    """Killed before iteration 4 (checkpoint after 2), resumed: it trains iterations 3 and 4 only and ends
    with the weights of an uninterrupted run, bit for bit (stochastic depth 0.1 and random crops/flips
    draw from the RNGs that the checkpoint restores)."""
    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS

    from dpnrepro.segmentation.experiment import train_and_evaluate

    probe = {"kill_at": 3, "trained": []}

    @HOOKS.register_module(force=True)
    class KillAndCount(Hook):  # the same hook config in both attempts: same fingerprint, so it resumes
        def before_train_iter(self, runner, batch_idx, data_batch=None):
            if runner.iter == probe["kill_at"]:
                raise _Killed

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            probe["trained"].append(runner.iter)

    hooks = [dict(type="ResumeStateHook"), dict(type="KillAndCount")]
    fresh = _cfg(canvases, tmp_path / "ref", custom_hooks=hooks)
    probe.update(kill_at=None)
    reference = train_and_evaluate(fresh)["state_dict"]
    probe.update(kill_at=3, trained=[])
    with pytest.raises(_Killed):
        train_and_evaluate(_cfg(canvases, tmp_path / "killed", custom_hooks=hooks))
    assert (tmp_path / "killed" / "iter_2.pth").exists() and not (tmp_path / "killed" / "iter_4.pth").exists()
    probe.update(kill_at=None, trained=[])
    again = _cfg(canvases, tmp_path / "killed", custom_hooks=hooks)
    resumed = train_and_evaluate(again)
    # the config the sweep saves (cfg.dump) is the same for the fresh and the resumed run
    assert again.pretty_text.replace(str(tmp_path / "killed"), str(tmp_path / "ref")) == fresh.pretty_text
    trained = probe["trained"]
    assert trained == [2, 3]  # 0-based iterations 3 and 4 of 4: resumed, not retrained from scratch
    assert resumed["state_dict"].keys() == reference.keys()
    assert all(torch.equal(resumed["state_dict"][k], reference[k]) for k in reference)


def test_mmengine_checkpoints_load_under_weights_only(canvases, tmp_path):
    """Our checkpoints need no code-calling global (no HistoryBuffer, no getattr); the numpy allow-list is
    scoped to the block and still refuses a crafted pickle."""
    import pickle

    from dpnrepro.segmentation.experiment import train_and_evaluate
    from dpnrepro.segmentation.resume import mmengine_safe_globals, safe_mmengine_load

    train_and_evaluate(_cfg(canvases, tmp_path / "w", **{"train_cfg.max_iters": 2, "param_scheduler.0.end": 2}))
    ckpt = tmp_path / "w" / "iter_2.pth"
    unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(ckpt))
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in mmengine_safe_globals()}
    assert unsafe <= allowed, unsafe - allowed
    assert not any("getattr" in g or "HistoryBuffer" in g for g in unsafe)
    with safe_mmengine_load():
        state = torch.load(ckpt)
    assert "message_hub" in state and "dpnrepro_rng" in state
    assert isinstance(next(iter(state["message_hub"]["log_scalars"].values())), dict)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    bad = tmp_path / "evil.pth"
    torch.save({"x": Evil()}, bad)
    with safe_mmengine_load(), pytest.raises(pickle.UnpicklingError):
        torch.load(bad)
    torch.save({"x": np.arange(3)}, bad)
    with pytest.raises(pickle.UnpicklingError):  # the numpy allow-list ends with the block
        torch.load(bad)


# --- report --------------------------------------------------------------------------------------------

def test_table5_summary_pairs_seeds(tmp_path):
    from dpnrepro.reports.table5 import build_table5, summarize

    runs = {}
    for stem, base in (("conv", 10.0), ("dpn", 11.0)):
        for frac in ("1/4", "1"):
            for seed in (0, 1, 2):
                v = base + seed + (5 if frac == "1" else 0) + (0.5 * seed if stem == "dpn" else 0)
                runs[f"{stem}{frac}{seed}"] = dict(stem=stem, fraction=frac, seed=seed, mIoU=v, mAcc=v, aAcc=v,
                                                   train_images=4, iters=2)
    metrics = dict(profile="smoke", hardware="cpu", arch="Mu-7", config="c.py", data_root="d", options={},
                   pretrained=None, chance={"mIoU": 12.0, "class": "Bag"}, runs=runs)
    s = summarize(metrics)
    assert list(s) == ["1/4", "1"]
    assert s["1"]["conv"]["mean"] == pytest.approx(16.0) and s["1/4"]["dpn"]["mean"] == pytest.approx(12.5)
    assert s["1/4"]["delta_dpn"]["mean"] == pytest.approx(1.5)  # deltas 1.0, 1.5, 2.0
    assert s["1/4"]["delta_dpn"]["ci95"] == pytest.approx(4.302653 * 0.5 / 3 ** 0.5, rel=1e-5)
    # learned: mean >= chance 12 + 5 points (conv 1/4 11.0, dpn 1/4 12.5: no; conv 1 16.0: no; dpn 1 17.5: yes)
    assert [(f, stem, e[stem]["chance"], e[stem]["learned"]) for f, e in s.items() for stem in ("conv", "dpn")] == [
        ("1/4", "conv", 12.0, False), ("1/4", "dpn", 12.0, False), ("1", "conv", 12.0, False), ("1", "dpn", 12.0, True)]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "seg.json").write_text(json.dumps(metrics))
    md, png, _ = build_table5(tmp_path / "m", tmp_path / "r")
    text = md.read_text()
    assert "27.3 ± 0.09" in text and "46.1 ± 0.11" in text and "| Δ | +0.7 | +1.1 | +1.1 | +1.1 | +0.5 |" in text
    assert "| Δ dpn − conv | +1.50 ± 1.242, no verdict | +1.50 ± 1.242, no verdict |" in text  # conv at chance
    assert s["1/4"]["delta_dpn"]["verdict"] == "better" and s["1/4"]["delta_dpn"]["training_pairs"] == 3
    assert "| chance | 12.00 | 12.00 |" in text and "not learned: conv 1/4, dpn 1/4, conv 1." in text
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_constant_prediction_miou_is_the_best_single_class_map(canvases):
    """chance.py through mmseg's IoUMetric equals max_c share_c / (classes present), counted by hand from
    the masks as the val pipeline reads them (label 0 ignored, 1..10 -> 0..9)."""
    from PIL import Image

    from dpnrepro.segmentation.chance import constant_prediction_miou
    from dpnrepro.segmentation.experiment import run_config

    cfg = run_config(SMOKE, arch="Mu-7", stem="dpn", fraction="1", seed=0, data_root=canvases, work_dir="w")
    counts = np.zeros(11, np.int64)
    for png in sorted((canvases / "annotations" / "validation").glob("*.png")):
        counts += np.bincount(np.asarray(Image.open(png)).ravel(), minlength=11)[:11]
    labelled = counts[1:]
    expected = 100 * labelled.max() / labelled.sum() / np.count_nonzero(labelled)
    chance = constant_prediction_miou(cfg)
    assert chance["mIoU"] == pytest.approx(expected, abs=0.006)  # IoUMetric rounds to 2 decimals
    assert chance["class"] == FASHION_CLASSES[int(labelled.argmax())]


def test_committed_smoke_runs_learned_above_chance():
    """Every committed Table 5 smoke run, and every cell of the summary, clears the constant-prediction
    mIoU by LEARNED_MARGIN points: a fine-tune that learned nothing (weights not loaded, labels scrambled,
    too few steps) fails here."""
    from dpnrepro.reports.table5 import LEARNED_MARGIN

    metrics = json.loads((REPO / "metrics" / "seg.json").read_text())
    assert "chance" in metrics, "metrics/seg.json predates the chance baseline: dvc repro segment table5"
    chance = metrics["chance"]["mIoU"]
    assert 0 < chance < 100 - LEARNED_MARGIN
    low = {name: r["mIoU"] for name, r in metrics["runs"].items() if r["mIoU"] < chance + LEARNED_MARGIN}
    assert not low, f"runs within {LEARNED_MARGIN} points of chance {chance}: {low}"
    summary = json.loads((REPO / "metrics" / "table5_summary.json").read_text())
    cells = [(f, stem, cell) for f, entry in summary.items() for stem, cell in entry.items()
             if not stem.startswith("delta_")]
    assert len(cells) == len({(r["stem"], r["fraction"]) for r in metrics["runs"].values()}) > 0
    for fraction, stem, cell in cells:
        assert cell["chance"] == chance and cell["learned"] is True, (fraction, stem, cell)


def test_eval_padding_that_is_not_a_multiple_of_the_patch_is_an_error(canvases, tmp_path):
    # caught when the run is configured, not in runner.val() after 161,664 steps
    from dpnrepro.errors import ParamsError

    assert _cfg(canvases, tmp_path / "ok").model.data_preprocessor.test_cfg.size_divisor == 7   # Mu/7
    with pytest.raises(ParamsError, match="multiple of the patch"):
        _cfg(canvases, tmp_path / "work", **{"model.data_preprocessor.test_cfg": {"size_divisor": 16}})
    with pytest.raises(ParamsError, match="multiple of the patch"):
        _cfg(canvases, tmp_path / "work", **{"model.data_preprocessor.test_cfg": None})
