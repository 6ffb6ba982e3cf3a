"""Fine-tuning initialisation from a pre-trained run: posemb resampled, head re-initialised, rest copied."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch

from dpnrepro.errors import CheckpointError
from dpnrepro.models import build_vit
from dpnrepro.models.posemb import resample_posemb
from dpnrepro.training.checkpoint import MODEL_FILE, save_weights
from dpnrepro.training.finetune import HEAD_KEYS, finetune_model_from_run, init_from_pretrained
from dpnrepro.training.trainer import ModelSpec

KW = dict(stem="dpn", in_chans=1, rep_size=True, head_bias_init=-2.2)


def _pretrained(tmp_path, **over):
    """A 'trained' Mu/7 @ 28: random init plus noise on every tensor, the head included."""
    torch.manual_seed(0)
    model = build_vit("Mu/7", img_size=28, num_classes=10, **{**KW, **over})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path / MODEL_FILE
    save_weights(model, path)
    return model.eval(), path


def test_new_resolution_resamples_posemb_and_keeps_the_rest(tmp_path):
    src, path = _pretrained(tmp_path)
    torch.manual_seed(1)
    dst = build_vit("Mu/7", img_size=42, num_classes=10, **KW)
    fresh_head = {k: v.clone() for k, v in dst.state_dict().items() if k in HEAD_KEYS}
    init_from_pretrained(dst, path)

    s, d = src.state_dict(), dst.state_dict()
    assert s.keys() == d.keys()
    assert s["pos_embed"].shape == (1, 16, 64) and d["pos_embed"].shape == (1, 36, 64)
    torch.testing.assert_close(d["pos_embed"], resample_posemb(s["pos_embed"], (6, 6)), rtol=0, atol=0)
    for k in s:
        if k not in HEAD_KEYS and k != "pos_embed":
            assert torch.equal(s[k], d[k]), k
    assert "pre_logits.fc.weight" in d  # representation layer is kept
    for k in HEAD_KEYS:
        assert torch.equal(d[k], fresh_head[k]), k
        assert not torch.equal(d[k], s[k]), k
    assert torch.count_nonzero(d["head.weight"]) == 0
    assert torch.all(d["head.bias"] == -2.2)
    dst.eval()
    with torch.no_grad():
        assert dst(torch.randn(2, 1, 42, 42)).shape == (2, 10)


def test_same_resolution_gives_identical_pre_logits(tmp_path):
    src, path = _pretrained(tmp_path)
    torch.manual_seed(5)
    dst = init_from_pretrained(build_vit("Mu/7", img_size=28, num_classes=10, **KW), path).eval()
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        f_src = src.forward_head(src.forward_features(x), pre_logits=True)
        f_dst = dst.forward_head(dst.forward_features(x), pre_logits=True)
        assert torch.equal(f_src, f_dst)
        # head re-initialised: zero weight -> every logit is the bias
        assert torch.all(dst(x) == -2.2)


def test_other_num_classes_and_reinit_head_false(tmp_path):
    src, path = _pretrained(tmp_path)
    dst = init_from_pretrained(build_vit("Mu/7", img_size=28, num_classes=37, **{**KW, "head_bias_init": 0.0}), path)
    assert dst.head.weight.shape == (37, 64)
    assert torch.count_nonzero(dst.head.weight) == 0 and torch.count_nonzero(dst.head.bias) == 0

    kept = init_from_pretrained(build_vit("Mu/7", img_size=42, num_classes=10, **KW), path, reinit_head=False)
    assert torch.equal(kept.head.weight, src.head.weight) and torch.equal(kept.head.bias, src.head.bias)
    with pytest.raises(CheckpointError, match="shape of head"):
        init_from_pretrained(build_vit("Mu/7", img_size=28, num_classes=37, **KW), path, reinit_head=False)


@pytest.mark.parametrize("over", [
    dict(stem="conv"),        # stem differs: unexpected/missing patch_embed tensors
    dict(pool="gap"),         # no class token
    dict(rep_size=False),     # no pre-logits layer
    dict(arch="Mu/4"),        # patch size differs: shape of patch_embed.proj.weight
])
def test_mismatched_architecture_is_refused(tmp_path, over):
    _, path = _pretrained(tmp_path)
    arch = over.pop("arch", "Mu/7")
    model = build_vit(arch, img_size=28, num_classes=10, **{**KW, **over})
    with pytest.raises(CheckpointError) as err:
        init_from_pretrained(model, path)
    msg = str(err.value)
    assert "\n" not in msg and "do not match" in msg


def test_missing_or_unsafe_file(tmp_path):
    model = build_vit("Mu/7", img_size=28, num_classes=10, **KW)
    with pytest.raises(CheckpointError, match="does not exist"):
        init_from_pretrained(model, tmp_path / "nope.safetensors")
    pt = tmp_path / "w.pt"
    pt.write_bytes(b"x")
    with pytest.raises(CheckpointError, match="only .safetensors"):
        init_from_pretrained(model, pt)


def test_finetune_model_from_run(tmp_path):
    src, _ = _pretrained(tmp_path)
    spec = ModelSpec(arch="Mu/7", stem="dpn", placement="pre-pre", num_classes=10, img_size=28, in_chans=1,
                     pool="tok", rep_size=True, head_bias_init=-2.2, pos_drop_rate=0.0, proj_drop_rate=0.0,
                     drop_path_rate=0.0)
    (tmp_path / "model_spec.json").write_text(json.dumps(asdict(spec)))
    model, new_spec = finetune_model_from_run(tmp_path, img_size=42, num_classes=5, head_bias_init=0.0)
    assert new_spec.img_size == 42 and new_spec.num_classes == 5
    assert model.pos_embed.shape == (1, 36, 64) and model.head.weight.shape == (5, 64)
    assert torch.equal(model.blocks[0].attn.qkv.weight, src.blocks[0].attn.qkv.weight)
    with pytest.raises(ValueError, match="unknown model spec"):
        finetune_model_from_run(tmp_path, image_size=42)


def test_sincos_posemb_is_recomputed_not_resampled(tmp_path):
    torch.manual_seed(0)
    src = build_vit("Mu/7", img_size=28, num_classes=10, posemb="sincos2d", **KW)
    save_weights(src, tmp_path / MODEL_FILE)
    dst = init_from_pretrained(build_vit("Mu/7", img_size=42, num_classes=10, posemb="sincos2d", **KW),
                               tmp_path / MODEL_FILE)
    fresh = build_vit("Mu/7", img_size=42, num_classes=10, posemb="sincos2d", **KW)
    assert torch.equal(dst.pos_embed, fresh.pos_embed)  # sin-cos of the 6x6 grid
    assert torch.equal(dst.blocks[1].mlp.fc1.weight, src.blocks[1].mlp.fc1.weight)
