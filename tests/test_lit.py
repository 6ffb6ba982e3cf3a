"""LiT (Table 4): locked image tower, open_clip text tower / tokenizer / loss, zero-shot classifiers,
the recipe against its sources, the caption corpus and the report's statistics."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
import torch

from dpnrepro.evaluation.zeroshot import (canonicalize, class_embeddings, class_prompts, clip_templates,
                                          zeroshot_top1)
from dpnrepro.lit.towers import (TEXT_NO_DECAY, LiT, LockedImageTower, build_text_tower, contrastive_loss,
                                 l2_normalize, state_digest, tokenizer)
from dpnrepro.training.optim import decay_mask
from helpers import REPO
from paper_text import PAPER, source_text


def tiny_lit(seed: int = 0) -> LiT:
    from dpnrepro.models import build_vit

    torch.manual_seed(seed)
    vit = build_vit("Mu/7", stem="dpn", num_classes=14, img_size=28, in_chans=1, rep_size=True)
    tower = LockedImageTower(vit)
    text = build_text_tower(embed_dim=tower.embed_dim, context_length=16, width=32, heads=2, layers=1)
    return LiT(tower, text, temperature_init=10.0)


# ---------------------------------------------------------------------------------------------------
# tokenizer


def test_tokenizer_works_offline_from_the_vocab_in_the_wheel():
    """A fresh interpreter with the hub offline and no proxy reachable tokenises with open_clip's BPE."""
    code = ("from dpnrepro.lit.towers import tokenizer\n"
            "t = tokenizer(16)(['a photo of a sandal', 'ankle boot'])\n"
            "print(t.shape[0], t.shape[1], int(t[0, 0]), int(t[1, 3]), int(t[1, 4]))\n")
    from helpers import clean_env

    env = clean_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", https_proxy="http://127.0.0.1:9",
                    http_proxy="http://127.0.0.1:9", PYTHONPATH=str(REPO / "src"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    # <start>=49406 first; "ankle boot" is two BPE tokens, then <end>=49407, then 0-padding
    assert out.stdout.split() == ["2", "16", "49406", "49407", "0"]


def test_tokenizer_truncates_to_the_context_keeping_the_end_token():
    tok = tokenizer(16)
    t = tok([" ".join(["shoe"] * 40)])[0]
    assert t.shape == (16,) and int(t[0]) == 49406 and int(t[-1]) == 49407
    assert tok.decode(tok(["a canvas shoe"])[0, 1:4].tolist()).strip() == "a canvas shoe"


# ---------------------------------------------------------------------------------------------------
# loss


def test_loss_is_the_symmetric_infonce_formula():
    torch.manual_seed(0)
    zi, zt = l2_normalize(torch.randn(5, 8)), l2_normalize(torch.randn(5, 8))
    t = torch.tensor(7.5)
    logits = t * zi @ zt.T
    i2t = -torch.stack([logits[i, i] - torch.logsumexp(logits[i, :], 0) for i in range(5)]).mean()
    t2i = -torch.stack([logits[j, j] - torch.logsumexp(logits[:, j], 0) for j in range(5)]).mean()
    torch.testing.assert_close(contrastive_loss(zi, zt, t), (i2t + t2i) / 2)


def test_loss_on_a_hand_computed_pair():
    """Two orthogonal pairs at temperature 2: each row's softmax is (e^2, e^0) -> loss log(1 + e^-2)."""
    z = torch.eye(2)
    assert contrastive_loss(z, z, torch.tensor(2.0)).item() == pytest.approx(math.log(1 + math.exp(-2)), rel=1e-6)


# ---------------------------------------------------------------------------------------------------
# locked image tower


def test_image_tower_gets_no_gradient_and_does_not_change():
    from types import SimpleNamespace

    from dpnrepro.lit.train import train_text_tower
    from dpnrepro.training.optim import build_optimizer

    lit = tiny_lit()
    before = state_digest(lit.image)
    lit.train()
    assert not lit.image.training and not lit.image.vit.training  # locked: eval mode whatever .train() says
    assert all(not p.requires_grad for p in lit.image.parameters())
    images = torch.randn(6, 1, 28, 28)
    tokens = tokenizer(16)([f"caption {i}" for i in range(6)])
    loss = contrastive_loss(lit.encode_image(images), lit.encode_text(tokens), lit.temperature)
    loss.backward()
    assert all(p.grad is None for p in lit.image.parameters())
    assert lit.log_temperature.grad is not None and lit.text.token_embedding.weight.grad is not None
    cfg = SimpleNamespace(optimizer="adam", lr=1e-3, weight_decay=1e-2, batch_size=4, steps=3, warmup_steps=1,
                          schedule="cosine", grad_clip=1.0)
    groups = build_optimizer(lit, cfg, no_decay=TEXT_NO_DECAY).param_groups
    named, mask = lit.trainable_named_parameters(), decay_mask(lit.trainable_named_parameters(), TEXT_NO_DECAY)
    # the text tower's parameters in their own order, kernels first: what LiT's checkpoints were written with
    assert [[id(p) for p in g["params"]] for g in groups] == [[id(p) for n, p in named if mask[n] is decay]
                                                              for decay in (True, False)]
    optimized = {id(p) for g in groups for p in g["params"]}
    assert not optimized & {id(p) for p in lit.image.parameters()}
    assert optimized == {id(p) for _, p in lit.trainable_named_parameters()}
    text_before = {k: v.clone() for k, v in lit.text.state_dict().items()}
    with torch.no_grad():
        emb = lit.encode_image(images)
    train_text_tower(lit, emb, tokens, cfg, seed=0, device=torch.device("cpu"), progress=False)
    assert state_digest(lit.image) == before
    assert any(not torch.equal(v, lit.text.state_dict()[k]) for k, v in text_before.items())


def test_decay_mask_is_big_vision_kernels_only():
    lit = tiny_lit()
    mask = decay_mask(lit.trainable_named_parameters(), TEXT_NO_DECAY)
    assert not mask["text.token_embedding.weight"] and not mask["text.positional_embedding"]
    assert not mask["log_temperature"] and not mask["text.ln_final.weight"]
    assert mask["text.text_projection"] and mask["text.transformer.resblocks.0.mlp.c_fc.weight"]
    assert mask["text.transformer.resblocks.0.attn.in_proj_weight"]
    assert not mask["text.transformer.resblocks.0.mlp.c_fc.bias"]


# ---------------------------------------------------------------------------------------------------
# zero-shot classifiers


def test_canonicalize_follows_big_vision():
    assert canonicalize("Great_White  Shark, white shark", keep=",") == "great white shark, white shark"
    assert canonicalize("a photo of the {}.", keep="{}") == "a photo of the {}"
    assert canonicalize("T-shirt/top") == "tshirttop"
    templates = clip_templates()
    assert len(templates) == 80 and all(t.count("{}") == 1 for t in templates)
    assert "a bad photo of a {}" in templates


def _fake_embedder(calls):
    """Each text -> a fixed unit vector (seeded by its characters); records what was embedded."""
    def vec(text):
        g = torch.Generator().manual_seed(sum((i + 1) * ord(c) for i, c in enumerate(text)))
        return l2_normalize(torch.randn(4, generator=g, dtype=torch.float64))

    def embed(texts):
        calls.append(list(texts))
        return torch.stack([vec(t) for t in texts])
    return embed, vec


def test_label_classifier_embeds_each_class_label():
    calls = []
    embed, vec = _fake_embedder(calls)
    names = ["Ankle boot", "Bag"]
    emb = class_embeddings(embed, names, "label")
    assert calls == [names]
    torch.testing.assert_close(emb, torch.stack([vec("Ankle boot"), vec("Bag")]).float())


def test_template_classifier_averages_normalised_prompt_embeddings_and_renormalises():
    calls = []
    embed, vec = _fake_embedder(calls)
    names = ["Great_White shark, white shark", "Bag."]
    templates = ["a photo of a {}", "art of the {}"]
    texts, labels = class_prompts(names, "templates", templates)
    assert texts == ["a photo of a great white shark", "art of the great white shark", "a photo of a bag",
                     "art of the bag"] and labels == [0, 0, 1, 1]
    emb = class_embeddings(embed, names, "templates", templates)
    for c, name in enumerate(["great white shark", "bag"]):
        mean = (vec(f"a photo of a {name}") + vec(f"art of the {name}")) / 2
        torch.testing.assert_close(emb[c], (mean / (mean.norm() + 1e-8)).float())
    assert len(class_prompts(["x"], "templates")[0]) == 80  # CLIP's templates by default


def test_zeroshot_top1_picks_the_nearest_class_embedding():
    classes = torch.eye(3)
    images = l2_normalize(torch.tensor([[0.9, 0.1, 0.0], [0.0, 0.2, 0.8], [0.6, 0.7, 0.0], [0.1, 0.0, 0.2]]))
    assert zeroshot_top1(images, torch.tensor([0, 2, 1, 0]), classes) == 75.0


# ---------------------------------------------------------------------------------------------------
# recipe


# big_vision configs/proj/image_text/lit_coco.py at 4cf5c026b5dc88fc7bfeb17684935752dd699513 (cited,
# not shipped): token_len=16, temperature_init=10.0, scale_by_adam, lr 0.001, wd 0.01, grad_clip_norm 1.0,
# cosine with warmup max(int(0.03 * total_steps), 100), schedule ('img/.*', None) = image tower frozen.
BIG_VISION_LIT = {"context_length": 16, "temperature_init": 10.0, "optimizer": "adam", "lr": 0.001,
                  "weight_decay": 0.01, "grad_clip": 1.0, "schedule": "cosine"}


def test_full_recipe_is_the_papers_and_big_visions():
    from dpnrepro.config.params import load_params

    lit = load_params(REPO / "profiles" / "full.yaml").lit
    paper = re.sub(r"\s+", " ", source_text(PAPER))
    m = re.search(r"train only the text encoder using a contrastive loss for (\d+) steps with a batch-size of (\d+)", paper)
    assert m and lit.train.steps == int(m.group(1)) == 55000 and lit.train.batch_size == int(m.group(2)) == 16384
    assert "2 architectures (B/32 and L/16) trained with 2 schedules (220K and 1.1M steps)" in paper
    assert lit.towers.archs == ["B-32", "L-16"] and lit.towers.sweeps == ["jft_220k", "jft_1100k"]
    assert lit.towers.stems == ["conv", "dpn"] and len(lit.seeds) == 3
    got = {"context_length": lit.context_length, "temperature_init": lit.temperature_init,
           "optimizer": lit.train.optimizer, "lr": lit.train.lr, "weight_decay": lit.train.weight_decay,
           "grad_clip": lit.train.grad_clip, "schedule": lit.train.schedule}
    assert got == BIG_VISION_LIT
    assert lit.train.warmup_steps == max(int(0.03 * lit.train.steps), 100)
    assert lit.zeroshot.classifiers[0] == "label" and lit.zeroshot.datasets[lit.zeroshot.headline].class_names == "imagenet"


def test_weight_decay_is_decoupled_from_the_learning_rate():
    """big_vision: p -= s(t) * (lr * adam + wd * p); torch AdamW with weight_decay = wd / lr does that."""
    from types import SimpleNamespace

    from dpnrepro.training.optim import build_optimizer

    lit = tiny_lit()
    cfg = SimpleNamespace(optimizer="adam", lr=1e-3, weight_decay=1e-2)
    opt = build_optimizer(lit, cfg, fused=True, no_decay=TEXT_NO_DECAY)
    w = lit.text.text_projection
    before = w.detach().clone()
    for p in lit.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    opt.step()
    torch.testing.assert_close(w.detach(), before * (1 - 1e-2))


# ---------------------------------------------------------------------------------------------------
# data


def test_wordnet_gloss_of_the_class_noun():
    from dpnrepro.lit.captions import head_noun, wordnet_glosses

    if not os.path.exists("/usr/share/wordnet/data.noun"):
        pytest.skip("Debian wordnet-base not installed")
    assert [head_noun(n) for n in ("T-shirt/top", "Ankle boot", "Bag")] == ["t-shirt", "boot", "bag"]
    g = wordnet_glosses("/usr/share/wordnet", ["sandal", "bag", "boot"])
    assert g["sandal"] == "a shoe consisting of a sole fastened by straps to the foot"
    assert g["bag"] == "a flexible container with a single opening"  # the artifact sense, not "the quantity a bag holds"
    assert g["boot"].startswith("footwear")


def test_caption_corpus_from_labels(idx_dataset, tmp_path):
    from dpnrepro.data.sources import FASHION_MNIST_CLASSES
    from dpnrepro.lit.captions import CAPTION_FORMS, fashion_mnist_captions, head_noun, wordnet_glosses
    from dpnrepro.lit.data import load_caption_corpus

    if not os.path.exists("/usr/share/wordnet/data.noun"):
        pytest.skip("Debian wordnet-base not installed")
    parents, groups = [0, 1, 0, 1, 0, 2, 0, 2, 3, 2], ["top", "bottom or dress", "footwear", "bag"]
    ds = fashion_mnist_captions(str(idx_dataset), "train", per_class=2, parents=parents, group_names=groups,
                                wordnet="/usr/share/wordnet", seed=0)
    assert len(ds) == 20 and sorted(ds["label"]) == sorted(list(range(10)) * 2)
    glosses = wordnet_glosses("/usr/share/wordnet", [head_noun(n) for n in FASHION_MNIST_CLASSES])
    for text, label in zip(ds["text"], ds["label"]):
        cls = FASHION_MNIST_CLASSES[label]
        allowed = {f.format(name=cls.lower(), group=groups[parents[label]], gloss=glosses[head_noun(cls)])
                   for f in CAPTION_FORMS}
        assert text in allowed, text
    assert len(set(ds["text"])) > 10  # the forms vary
    ds.save_to_disk(str(tmp_path / "corpus"))
    back = load_caption_corpus(str(tmp_path / "corpus"), split="train", image_column="image", text_column="text")
    assert back.column_names == ["image", "text"] and back["text"] == ds["text"]


def test_corpus_errors_name_the_fix(tmp_path):
    import datasets

    from dpnrepro.errors import DatasetError
    from dpnrepro.lit.data import load_caption_corpus

    with pytest.raises(DatasetError, match="does not exist; point lit.data.source"):
        load_caption_corpus(str(tmp_path / "nope"), split="train", image_column="image", text_column="text")
    datasets.Dataset.from_dict({"image": [b""], "caption": ["x"]}).save_to_disk(str(tmp_path / "c"))
    with pytest.raises(DatasetError, match=r"lacks column\(s\) \['text'\]"):
        load_caption_corpus(str(tmp_path / "c"), split="train", image_column="image", text_column="text")


def test_foolbox_imagenet_photos_and_labels_from_file_names():
    from dpnrepro.lit.data import class_names, foolbox_dir, labelled_images

    try:
        foolbox_dir()
    except Exception:
        pytest.skip("foolbox wheel not installed")
    images, labels = labelled_images("foolbox", "imagenet")
    assert len(images) == 20 and labels[0] == 243 and images[0].mode == "RGB"
    assert class_names("imagenet")[243] == "Bullmastiff"  # ImageNet id 243 (n02108422), CLIP's name


def test_image_embeddings_of_the_uint8_eval_transform_are_the_float_ones_bit_for_bit():
    # load_tower hands embed_images a uint8 transform, each batch scaled at once (unit_range): the same
    # embeddings as the per-image float eval transform; the tower here passes the pixels through
    from dpnrepro.data.loader import build_transform
    from dpnrepro.lit.data import foolbox_dir, labelled_images
    from dpnrepro.lit.train import embed_images

    try:
        foolbox_dir()
    except Exception:
        pytest.skip("foolbox wheel not installed")
    images = labelled_images("foolbox", "imagenet")[0][:11]
    cfg = {"image_size": 24, "channels": 3, "eval_resize": 28}
    emb = [embed_images(torch.nn.Flatten(), images, build_transform(cfg, train=False, uint8=uint8), batch_size=4,
                        device=torch.device("cpu"), progress=False) for uint8 in (False, True)]
    assert emb[0].shape == (11, 3 * 24 * 24) and torch.equal(emb[0], emb[1])


# ---------------------------------------------------------------------------------------------------
# report


def test_table4_summary_means_cis_and_paired_deltas():
    from dpnrepro.reports.table4 import summarize

    runs = {}
    for stem, accs in (("conv", [50.0, 52.0, 54.0]), ("dpn", [51.0, 54.0, 54.0])):
        for seed, a in enumerate(accs):
            runs[f"{stem}{seed}"] = {"sweep": "jft_220k", "arch": "Mu-7", "stem": stem, "seed": seed, "tower_seed": 0,
                                     "zeroshot": {"fm": {"label": a}}}
    s = summarize({"datasets": {"fm": {}}, "classifiers": ["label"], "runs": runs})["fm"]["label"]["jft_220k"]["Mu-7"]
    assert s["conv"]["mean"] == pytest.approx(52.0) and s["conv"]["ci95"] == pytest.approx(4.303 * 2 / math.sqrt(3), rel=1e-3)
    assert s["delta_dpn"]["mean"] == pytest.approx(1.0) and s["delta_dpn"]["n"] == 3


def _lit_delta(towers: int, lit_seeds: int) -> dict:
    """Table 4's DPN − conv when DPN is 5 points better on every LiT run (±0.1 noise)."""
    from dpnrepro.reports.table4 import summarize

    runs = {f"{stem}{tower}_{seed}": {"sweep": "jft_220k", "arch": "Mu-7", "stem": stem, "seed": seed,
                                      "tower_seed": tower,
                                      "zeroshot": {"fm": {"label": 50.0 + 5.0 * (stem == "dpn") + 0.1 * ((tower + seed) % 2)}}}
            for stem in ("conv", "dpn") for tower in range(towers) for seed in range(lit_seeds)}
    return summarize({"datasets": {"fm": {}}, "classifiers": ["label"], "runs": runs})["fm"]["label"]["jft_220k"]["Mu-7"]["delta_dpn"]


def test_table4_lit_seeds_of_one_pair_of_towers_never_decide():
    one_pair = _lit_delta(towers=1, lit_seeds=5)  # LiT's noise over a single pretraining pair: not the method's
    assert one_pair["mean"] > 4.8 and one_pair["low"] > 0
    assert one_pair["verdict"] == "not resolved" and one_pair["why"] == "1 pretraining run"
    three = _lit_delta(towers=3, lit_seeds=1)  # three independently pretrained pairs of towers
    assert three["training_pairs"] == 3 and three["verdict"] == "better"


def test_cost_model_counts_the_locked_forward_and_the_text_training():
    from dpnrepro.benchmarks.flops import vit_forward_flops
    from dpnrepro.cost.lit import lit_flops_per_example, text_forward_flops

    d, t, e = 768, 16, 768
    per_layer_token = 6 * d * d + 4 * t * d + 2 * d * d + 16 * d * d  # qkv, attention, out proj, MLP (4x)
    assert text_forward_flops(width=d, layers=12, context_length=t, embed_dim=e) == 12 * t * per_layer_token + 2 * d * e
    f = lit_flops_per_example("B-32", width=d, layers=12, context_length=t, batch_size=16384)
    assert f["image_forward"] == vit_forward_flops("B/32", img_size=224, num_classes=0, rep_size=768).total
    assert f["text_train"] == 3 * text_forward_flops(width=d, layers=12, context_length=t, embed_dim=e)
    assert 8e9 < f["image_forward"] < 9.5e9  # ViT-B/32 at 224 px: 4.4 GMACs


def test_report_and_full_profile_state_that_the_image_pipeline_is_not_lit_cocos():
    # the one departure from lit_coco.py: embeddings are precomputed once per locked tower (no augmentation), which
    # big_vision's lit_coco.py pipeline (resize(224) | flip_lr | randaug(2, 10)) would not allow
    from dpnrepro.reports.table4 import IMAGE_PIPELINE, render_markdown, summarize

    runs = {f"{stem}{seed}": {"sweep": "jft_220k", "arch": "B-32", "stem": stem, "seed": seed, "tower_seed": 0,
                              "hardware": "cpu",
                              "zeroshot": {"imagenet": {"label": 50.0 + seed}}}
            for stem in ("conv", "dpn") for seed in range(2)}
    metrics = {"profile": "full", "headline": "imagenet", "classifiers": ["label"], "recipe": "r", "runs": runs,
               "datasets": {"imagenet": {"images": 10, "format": "imagefolder", "source": "s", "split": "validation",
                                         "classes": 1000, "class_names": "imagenet", "seeds": [0, 1]}}}
    text = render_markdown(metrics, summarize(metrics))
    assert IMAGE_PIPELINE in text
    for needle in ("lit_coco.py", "randaug(2, 10)", "resize(224)", "without augmentation", "computed once"):
        assert needle in IMAGE_PIPELINE
    full = (REPO / "profiles" / "full.yaml").read_text()
    assert "the image pipeline is not lit_coco's" in full and "randaug(2, 10)" in full
