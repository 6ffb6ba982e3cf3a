"""Tests for dpnrepro.models: stems, LayerNorm placements, head, registry (fast; CPU only)."""
from __future__ import annotations

import math

import pytest
import timm
import torch
from einops import rearrange
from torch import nn

from dpnrepro.models import (
    ARCHS,
    PLACEMENTS,
    POOLS,
    STEMS,
    Affine,
    ArchSpec,
    VisionTransformerDPN,
    build_vit,
    conv_to_linear_weight,
    first_ln_scale_image,
    parse_arch,
    subln_init_gain,
)

MU = dict(num_classes=10, img_size=32)  # Mu/4 at 32 px: 64 tokens, 4 blocks of width 64


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random values for every parameter (norm scales around 1), so no weight is trivially 0 or 1."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g) * 0.2
        p.copy_(1.0 + noise if (p.ndim == 1 and name.endswith('weight')) else noise)
    return model


def _images(n: int = 2, size: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


# --- 1. linear stem == conv stem --------------------------------------------------------------------

@pytest.mark.parametrize('arch,img', [('Mu/4', 32), ('Mu/7', 28)])
def test_linear_stem_reproduces_conv_stem(arch, img):
    conv = _randomize(build_vit(arch, stem='conv', img_size=img, num_classes=10)).eval()
    lin = build_vit(arch, stem='linear', img_size=img, num_classes=10).eval()
    sd = conv.state_dict()
    sd['patch_embed.proj.weight'] = conv_to_linear_weight(sd['patch_embed.proj.weight'])
    lin.load_state_dict(sd, strict=True)
    x = _images(size=img)
    with torch.no_grad():
        torch.testing.assert_close(lin.patch_embed(x), conv.patch_embed(x), atol=1e-5, rtol=0)
        out_lin, out_conv = lin(x), conv(x)
    torch.testing.assert_close(out_lin, out_conv, atol=1e-5, rtol=0)
    assert out_conv.abs().max() > 1e-2  # the comparison is not between two zero tensors


def test_conv_to_linear_weight_rejects_non_kernels():
    with pytest.raises(ValueError):
        conv_to_linear_weight(torch.zeros(8, 48))


# --- 2. conv stem == timm's stock ViT ---------------------------------------------------------------

def test_conv_stem_matches_stock_timm_vit():
    ours = _randomize(build_vit('Ti/16', stem='conv', placement='pre-pre', pool='tok', img_size=32,
                                num_classes=10)).eval()
    # big_vision adds position embeddings to the patch tokens only: timm's no_embed_class=True
    stock = timm.create_model('vit_tiny_patch16_224', pretrained=False, img_size=32, num_classes=10,
                              no_embed_class=True).eval()
    assert set(ours.state_dict()) == set(stock.state_dict())
    x = _images()

    stock.load_state_dict(ours.state_dict(), strict=True)
    with torch.no_grad():
        ref = stock(x)
        torch.testing.assert_close(ours(x), ref, atol=1e-5, rtol=1e-5)
    assert ref.std() > 1e-2

    _randomize(stock, seed=1)
    ours.load_state_dict(stock.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), stock(x), atol=1e-5, rtol=1e-5)


# --- 3. DPN: what the two stem norms see --------------------------------------------------------------

def test_dpn_norms_see_pixels_and_feed_position_embedding():
    model = _randomize(build_vit('Mu/4', stem='dpn', **MU)).eval()
    seen = {}
    hooks = [
        model.patch_embed.norm_in.register_forward_hook(lambda m, i, o: seen.update(norm_in=i[0])),
        model.patch_embed.norm_out.register_forward_hook(lambda m, i, o: seen.update(norm_out=o)),
        # patch_drop (Identity) receives the output of VisionTransformer._pos_embed
        model.patch_drop.register_forward_hook(lambda m, i, o: seen.update(tokens=i[0])),
    ]
    x = _images()
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()

    patches = rearrange(x, 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=4, p2=4)
    torch.testing.assert_close(seen['norm_in'], patches, atol=0, rtol=0)
    assert isinstance(model.norm_pre, nn.Identity)
    tokens = seen['tokens']
    assert tokens.shape == (2, 1 + 64, 64)
    torch.testing.assert_close(tokens[:, 0], model.cls_token[:, 0].expand(2, -1), atol=0, rtol=0)
    torch.testing.assert_close(tokens[:, 1:] - model.pos_embed, seen['norm_out'], atol=1e-6, rtol=0)


def test_dpn_at_init_outputs_standardised_tokens():
    model = build_vit('Mu/4', stem='dpn', **MU)
    with torch.no_grad():
        t = model.patch_embed(_images() * 7 + 3)
    torch.testing.assert_close(t.mean(-1), torch.zeros(t.shape[:2]), atol=1e-4, rtol=0)
    torch.testing.assert_close(t.var(-1, unbiased=False), torch.ones(t.shape[:2]), atol=1e-3, rtol=0)


def test_post_posemb_norm_follows_position_embedding():
    model = _randomize(build_vit('Mu/4', stem='post_posemb', **MU)).eval()
    seen = {}
    model.patch_drop.register_forward_hook(lambda m, i, o: seen.update(tokens=o))
    model.norm_pre.register_forward_hook(lambda m, i, o: seen.update(pre_in=i[0]))
    with torch.no_grad():
        model(_images())
    assert isinstance(model.norm_pre, nn.LayerNorm)
    torch.testing.assert_close(seen['pre_in'], seen['tokens'], atol=0, rtol=0)


def test_first_ln_scale_image_uses_einops_order():
    model = build_vit('Mu/4', stem='dpn', **MU)
    with torch.no_grad():
        model.patch_embed.norm_in.weight.copy_(torch.arange(48.))
    img = first_ln_scale_image(model)
    assert img.shape == (4, 4, 3)
    # pixel (row r, column s, channel c) of a patch lands at img[r, s, c]
    x = torch.arange(3 * 8 * 8, dtype=torch.float32).reshape(1, 3, 8, 8)
    v = rearrange(x, 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1=4, p2=4)[0, 0]
    idx = torch.arange(48.).reshape(4, 4, 3)
    for r, s, c in [(0, 0, 0), (1, 2, 0), (3, 0, 2), (2, 3, 1)]:
        assert img[r, s, c] == idx[r, s, c]
        assert v[int(idx[r, s, c])] == x[0, c, r, s]
    for stem in ('pre', 'rmsnorm', 'only_learnable'):
        assert first_ln_scale_image(build_vit('Mu/4', stem=stem, **MU)).shape == (4, 4, 3)


@pytest.mark.parametrize('stem', ['conv', 'linear', 'post', 'post_posemb', 'no_learnable'])
def test_first_ln_scale_image_needs_learnable_first_norm(stem):
    with pytest.raises(ValueError, match='dpn'):
        first_ln_scale_image(build_vit('Mu/4', stem=stem, **MU))


def test_patch_embed_stem_timm_embed_layer_options():
    from dpnrepro.models import PatchEmbedStem
    pe = PatchEmbedStem(img_size=32, patch_size=4, in_chans=3, embed_dim=16, stem='dpn',
                        output_fmt='NHWC', strict_img_size=False, dynamic_img_pad=True)
    assert (pe.num_patches, pe.grid_size, pe.feat_ratio(), pe.dynamic_feat_size((30, 41))) == (64, (8, 8), 4, (8, 11))
    assert pe(torch.randn(1, 3, 40, 44)).shape == (1, 10, 11, 16)
    assert pe(torch.randn(1, 3, 30, 41)).shape == (1, 8, 11, 16)
    assert isinstance(pe, timm.layers.PatchEmbed) and pe.feat_ratio(as_scalar=False) == (4, 4)
    strict = PatchEmbedStem(img_size=32, patch_size=4, embed_dim=16, stem='linear')
    assert strict(torch.randn(1, 3, 32, 32)).shape == (1, 64, 16)
    with pytest.raises(ValueError):
        strict(torch.randn(1, 3, 40, 40))


# --- 4. parameter counts -------------------------------------------------------------------------------

@pytest.mark.parametrize('arch,expected', [('Ti/16', 5.7e6), ('S/16', 22e6), ('B/16', 86e6), ('L/16', 304e6)])
def test_param_counts_match_paper_sizes(arch, expected):
    with torch.device('meta'):
        n = _count(build_vit(arch, stem='conv', num_classes=1000, img_size=224))
    assert abs(n - expected) / expected < 0.01, n


def test_param_count_equals_stock_timm_minus_class_posemb():
    with torch.device('meta'):
        ours = _count(build_vit('B/16', stem='conv'))
        stock = _count(timm.create_model('vit_base_patch16_224', pretrained=False))
    assert ours == stock - 768  # no position embedding for the class token (big_vision)


@pytest.mark.parametrize('arch', ['Ti/16', 'B/32', 'Mu/7'])
def test_dpn_adds_two_layernorms(arch):
    spec, p = parse_arch(arch)
    with torch.device('meta'):
        lin = _count(build_vit(arch, stem='linear', img_size=p * 4))
        dpn = _count(build_vit(arch, stem='dpn', img_size=p * 4))
    assert dpn - lin == 2 * (p * p * 3) + 2 * spec.width


# --- 5. stems and placements build what the paper describes --------------------------------------------

_STEM_MODULES = {  # stem -> types of (norm_in, proj, norm_out, norm_pre)
    'conv': (nn.Identity, nn.Conv2d, nn.Identity, nn.Identity),
    'linear': (nn.Identity, nn.Linear, nn.Identity, nn.Identity),
    'dpn': (nn.LayerNorm, nn.Linear, nn.LayerNorm, nn.Identity),
    'pre': (nn.LayerNorm, nn.Linear, nn.Identity, nn.Identity),
    'post': (nn.Identity, nn.Linear, nn.LayerNorm, nn.Identity),
    'post_posemb': (nn.Identity, nn.Linear, nn.Identity, nn.LayerNorm),
    'rmsnorm': (nn.RMSNorm, nn.Linear, nn.RMSNorm, nn.Identity),
    'no_learnable': (nn.LayerNorm, nn.Linear, nn.LayerNorm, nn.Identity),
    'only_learnable': (Affine, nn.Linear, Affine, nn.Identity),
}


def test_stem_table_covers_all_stems():
    assert set(_STEM_MODULES) == set(STEMS) and len(STEMS) == 9


@pytest.mark.parametrize('stem', STEMS)
def test_stem_modules(stem):
    model = build_vit('Mu/4', stem=stem, **MU)
    pe = model.patch_embed
    mods = (pe.norm_in, pe.proj, pe.norm_out, model.norm_pre)
    for mod, want in zip(mods, _STEM_MODULES[stem]):
        assert isinstance(mod, want), (stem, mod)
        if want is nn.Identity:
            assert type(mod) is nn.Identity
    if not isinstance(pe.norm_in, nn.Identity):
        assert tuple(pe.norm_in.weight.shape if pe.norm_in.weight is not None else pe.norm_in.normalized_shape) \
            == (4 * 4 * 3,)
    if not isinstance(pe.norm_out, nn.Identity):
        assert pe.norm_out(torch.zeros(1, 64)).shape == (1, 64)
    assert (pe.proj.bias is None) == (stem == 'post_posemb')  # timm drops the bias with pre_norm (CLIP)
    stem_norm_params = sum(p.numel() for m in (pe.norm_in, pe.norm_out) for p in m.parameters())
    if stem == 'no_learnable':
        assert stem_norm_params == 0
    if stem == 'dpn':
        assert stem_norm_params == 2 * 48 + 2 * 64


def test_stem_norm_semantics():
    x = torch.randn(5, 48, generator=torch.Generator().manual_seed(0))
    ln = build_vit('Mu/4', stem='dpn', **MU).patch_embed.norm_in
    rms = build_vit('Mu/4', stem='rmsnorm', **MU).patch_embed.norm_in
    aff = build_vit('Mu/4', stem='only_learnable', **MU).patch_embed.norm_in
    with torch.no_grad():
        for m in (ln, rms, aff):
            m.weight.uniform_(0.5, 1.5)
            if getattr(m, 'bias', None) is not None:
                m.bias.uniform_(-0.5, 0.5)
        # LayerNorm centres and scales: invariant to a constant shift
        torch.testing.assert_close(ln(x + 3.0), ln(x), atol=1e-4, rtol=0)
        # RMSNorm scales but does not centre
        torch.testing.assert_close(rms(2.0 * x), rms(x), atol=1e-4, rtol=0)
        assert (rms(x + 3.0) - rms(x)).abs().max() > 0.1
        # only_learnable does not standardise at all: y = w * x + b
        assert (aff(x + 3.0) - aff(x)).abs().max() > 0.1
        torch.testing.assert_close(aff(x), x * aff.weight + aff.bias)


@pytest.mark.parametrize('stem', STEMS)
def test_every_stem_trains(stem):
    torch.manual_seed(0)
    model = build_vit('Mu/4', stem=stem, **MU)
    nn.init.normal_(model.head.weight, std=0.02)  # zero-init head would block all other gradients
    loss = nn.functional.cross_entropy(model(_images()), torch.tensor([1, 2]))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0


_BLOCK_NORMS = {  # placement -> LayerNorms in each block
    'pre-pre': {'norm1', 'norm2'},
    'pre-post': {'norm1', 'norm2_post'},
    'pre-prepost': {'norm1', 'norm2', 'norm2_post'},
    'post-pre': {'norm1_post', 'norm2'},
    'post-post': {'norm1_post', 'norm2_post'},
    'post-prepost': {'norm1_post', 'norm2', 'norm2_post'},
    'prepost-pre': {'norm1', 'norm1_post', 'norm2'},
    'prepost-post': {'norm1', 'norm1_post', 'norm2_post'},
    'prepost-prepost': {'norm1', 'norm1_post', 'norm2', 'norm2_post'},
    'normformer': {'norm1', 'attn_out_norm', 'norm2', 'mlp.norm'},
    'subln': {'norm1', 'attn.norm', 'norm2', 'mlp.norm'},
}


def test_placement_table_covers_all_placements():
    assert set(_BLOCK_NORMS) == set(PLACEMENTS) and len(PLACEMENTS) == 11


@pytest.mark.parametrize('placement', PLACEMENTS)
def test_placement_builds_its_layernorms_and_trains(placement):
    torch.manual_seed(0)
    model = build_vit('Mu/4', stem='dpn', placement=placement, **MU)
    for blk in model.blocks:
        norms = {n for n, m in blk.named_modules() if isinstance(m, nn.LayerNorm)}
        assert norms == _BLOCK_NORMS[placement]
        assert isinstance(blk.attn, timm.layers.Attention) and isinstance(blk.mlp, timm.layers.Mlp)
    nn.init.normal_(model.head.weight, std=0.02)
    loss = nn.functional.cross_entropy(model(_images()), torch.tensor([1, 2]))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def _reference_block(blk, x, placement):
    """The block written from the paper's formulas, using the block's own sublayers."""
    sa, ff = placement.split('-') if '-' in placement else ('pre', 'pre')
    mlp = blk.mlp

    def attn(t):
        y = blk.attn(t)
        return blk.attn_out_norm(y) if placement == 'normformer' else y

    def ffn(t):
        h = mlp.act(mlp.fc1(t))
        if placement in ('normformer', 'subln'):
            h = mlp.norm(h)  # LN after the activation, before fc2
        return mlp.fc2(h)

    def sublayer(t, f, pre, post, kind):
        if kind == 'pre':
            return t + f(pre(t))
        if kind == 'post':
            return post(t + f(t))
        return post(t + f(pre(t)))

    x = sublayer(x, attn, blk.norm1, blk.norm1_post, sa)
    return sublayer(x, ffn, blk.norm2, blk.norm2_post, ff)


@pytest.mark.parametrize('placement', PLACEMENTS)
def test_placement_forward_matches_formula(placement):
    model = _randomize(build_vit('Mu/4', placement=placement, **MU)).eval()
    blk = model.blocks[0]
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(blk(x), _reference_block(blk, x, placement), atol=1e-5, rtol=1e-5)
        if placement == 'subln':  # attn.norm sits right before the attention output projection
            seen = {}
            h1 = blk.attn.norm.register_forward_hook(lambda m, i, o: seen.update(norm=o))
            h2 = blk.attn.proj.register_forward_hook(lambda m, i, o: seen.update(proj_in=i[0]))
            blk(x)
            h1.remove(), h2.remove()
            torch.testing.assert_close(seen['proj_in'], seen['norm'], atol=0, rtol=0)
        if placement.endswith('-post') or placement.endswith('-prepost'):
            y = blk(x)  # the block ends with a LayerNorm: tokens are standardised up to its affine
            ln = blk.norm2_post
            z = (y - ln.bias) / ln.weight
            torch.testing.assert_close(z.mean(-1), torch.zeros(2, 5), atol=1e-4, rtol=0)


def test_subln_init_gain_scales_v_proj_and_mlp():
    torch.manual_seed(0)
    base = build_vit('Mu/4', placement='pre-pre', **MU)
    torch.manual_seed(0)
    sub = build_vit('Mu/4', placement='subln', **MU)
    gain = subln_init_gain(4)
    assert gain == pytest.approx(math.sqrt(math.log(8)))
    for b, s in zip(base.blocks, sub.blocks):
        qb, kb, vb = b.attn.qkv.weight.chunk(3)
        qs, ks, vs = s.attn.qkv.weight.chunk(3)
        torch.testing.assert_close(qs, qb, atol=0, rtol=0)
        torch.testing.assert_close(ks, kb, atol=0, rtol=0)
        torch.testing.assert_close(vs, vb * gain)
        for name in ('attn.proj', 'mlp.fc1', 'mlp.fc2'):
            torch.testing.assert_close(s.get_submodule(name).weight, b.get_submodule(name).weight * gain)


# --- 6. registry, head -------------------------------------------------------------------------------------

def test_timm_registry():
    names = set(timm.list_models('vit_*'))
    for base in ('vit_tiny_patch16', 'vit_small_patch16', 'vit_small_patch32', 'vit_base_patch16',
                 'vit_base_patch32', 'vit_large_patch16', 'vit_huge_patch14', 'vit_mu_patch4'):
        for stem in ('dpn', 'linear', 'conv'):
            assert f'{base}_{stem}' in names
    with torch.device('meta'):
        m = timm.create_model('vit_base_patch16_dpn', pretrained=False)
        ref = build_vit('B/16', stem='dpn')
    assert isinstance(m, VisionTransformerDPN)
    assert (m.stem, m.patch_embed.patch_size, m.embed_dim, len(m.blocks)) == ('dpn', (16, 16), 768, 12)
    assert _count(m) == _count(ref)
    assert m.pretrained_cfg['mean'] == (0.5, 0.5, 0.5)

    small = timm.create_model('vit_mu_patch4_conv', img_size=32, num_classes=10)
    assert isinstance(small.patch_embed.proj, nn.Conv2d)
    assert small(_images()).shape == (2, 10)
    assert timm.create_model('vit_mu_patch4_linear', img_size=32, stem='rmsnorm').stem == 'rmsnorm'


def test_rep_size_adds_pre_logits():
    with torch.device('meta'):
        base = _count(build_vit('B/16'))
        rep = build_vit('B/16', rep_size=True)
    assert _count(rep) - base == 768 * 768 + 768
    assert rep.head.in_features == 768

    m = build_vit('Mu/4', rep_size=32, **MU)
    assert _count(m) - _count(build_vit('Mu/4', **MU)) == (64 * 32 + 32) + (32 - 64) * 10
    assert isinstance(m.pre_logits.fc, nn.Linear) and isinstance(m.pre_logits.act, nn.Tanh)
    _randomize(m)
    with torch.no_grad():
        feats = m.forward_head(m.forward_features(_images() * 10), pre_logits=True)
    assert feats.shape == (2, 32) and feats.abs().max() <= 1.0
    m.reset_classifier(5)
    assert (m.head.in_features, m.head.out_features) == (32, 5)
    assert isinstance(build_vit('Mu/4', rep_size=0, **MU).pre_logits, nn.Identity)
    assert isinstance(build_vit('Mu/4', rep_size=False, **MU).pre_logits, nn.Identity)
    with pytest.raises(ValueError):
        build_vit('Mu/4', rep_size=-1, **MU)


def test_head_init():
    m = build_vit('Mu/4', head_bias_init=-6.9, **MU)
    assert torch.all(m.head.bias == torch.tensor(-6.9)) and torch.all(m.head.weight == 0)
    with torch.no_grad():
        torch.testing.assert_close(m(_images()), torch.full((2, 10), -6.9))
    m.reset_classifier(3)
    assert torch.all(m.head.bias == torch.tensor(-6.9)) and m.head.weight.shape == (3, 64)
    assert torch.all(build_vit('Mu/4', **MU).head.bias == 0)


def test_gap_pool_has_no_class_token_and_norms_before_pooling():
    m = _randomize(build_vit('Mu/4', pool='gap', **MU)).eval()
    assert m.cls_token is None and m.pos_embed.shape == (1, 64, 64)
    assert isinstance(m.norm, nn.LayerNorm) and isinstance(m.fc_norm, nn.Identity)
    x = _images()
    with torch.no_grad():
        torch.testing.assert_close(m(x), m.head(m.forward_features(x).mean(1)))
    tok = build_vit('Mu/4', pool='tok', **MU)
    assert tok.cls_token.shape == (1, 1, 64) and tok.pos_embed.shape == (1, 64, 64)


def test_init_and_dropout_settings():
    m = build_vit('Mu/4', pos_drop_rate=0.1, proj_drop_rate=0.1, drop_path_rate=0.2, **MU)
    assert torch.all(m.cls_token == 0)
    assert m.pos_embed.std().item() == pytest.approx(64 ** -0.5, rel=0.1)
    bound = math.sqrt(6 / (64 + 64))  # xavier-uniform for each of q, k, v (D x D)
    for w in m.blocks[0].attn.qkv.weight.chunk(3):
        assert 0.9 * bound < w.abs().max() <= bound
    assert m.blocks[0].mlp.fc1.bias.abs().max() < 1e-4
    assert m.pos_drop.p == 0.1 and m.head_drop.p == 0.0
    blk = m.blocks[-1]
    assert blk.attn.proj_drop.p == 0.1 and blk.mlp.drop1.p == 0.1 and blk.mlp.drop2.p == 0.1
    assert blk.attn.attn_drop.p == 0.0
    assert blk.drop_path1.drop_prob == pytest.approx(0.2)
    assert isinstance(m.blocks[0].drop_path1, nn.Identity)  # linear decay from 0


# --- 7. names ---------------------------------------------------------------------------------------------------

def test_parse_arch():
    assert parse_arch('B/16') == (ArchSpec(768, 12, 12, 3072), 16)
    assert parse_arch('Mu/7') == (ARCHS['Mu'], 7)
    assert ARCHS['Ti'] == ArchSpec(192, 12, 3, 768) and ARCHS['S'] == ArchSpec(384, 12, 6, 1536)
    assert ARCHS['L'] == ArchSpec(1024, 24, 16, 4096) and ARCHS['H'] == ArchSpec(1280, 32, 16, 5120)
    assert ARCHS['Mu'] == ArchSpec(64, 4, 4, 256)
    with pytest.raises(Exception):
        ARCHS['B'].width = 1  # frozen


@pytest.mark.parametrize('kwargs,allowed', [
    (dict(arch='X/16'), tuple(ARCHS)),
    (dict(arch='B16'), tuple(ARCHS)),
    (dict(arch='B/0'), tuple(ARCHS)),
    (dict(arch='b/16'), tuple(ARCHS)),
    (dict(stem='dnp'), STEMS),
    (dict(placement='pre'), PLACEMENTS),
    (dict(placement='post-mid'), PLACEMENTS),
    (dict(pool='avg'), POOLS),
])
def test_bad_names_raise_with_allowed_values(kwargs, allowed):
    kwargs = dict(arch='Mu/4', img_size=32, **kwargs) if 'arch' not in kwargs else dict(img_size=32, **kwargs)
    arch = kwargs.pop('arch')
    with pytest.raises(ValueError) as err:
        build_vit(arch, **kwargs)
    msg = str(err.value)
    assert '\n' not in msg
    for name in allowed:
        assert name in msg


def test_img_size_must_be_divisible_by_patch():
    with pytest.raises(ValueError, match='divisible'):
        build_vit('Mu/7', img_size=32)
    with pytest.raises(ValueError, match='divisible'):
        build_vit('B/16', img_size=100)


def test_sincos2d_posemb_is_big_visions_formula_and_fixed():
    import numpy as np

    from dpnrepro.models import posemb_sincos_2d

    h, w, width = 3, 5, 16
    # big_vision posemb_sincos_2d, written out in NumPy: [sin(x w), cos(x w), sin(y w), cos(y w)].
    y, x = np.mgrid[:h, :w]
    omega = 1.0 / 10_000.0 ** (np.arange(width // 4) / (width // 4 - 1))
    xs, ys = np.outer(x.flatten(), omega), np.outer(y.flatten(), omega)
    ref = np.concatenate([np.sin(xs), np.cos(xs), np.sin(ys), np.cos(ys)], axis=1)[None]
    np.testing.assert_allclose(posemb_sincos_2d(h, w, width).numpy(), ref, atol=1e-6)
    model = build_vit("Mu/7", stem="dpn", img_size=28, in_chans=1, num_classes=10, pool="gap", posemb="sincos2d")
    assert not model.pos_embed.requires_grad
    np.testing.assert_allclose(model.pos_embed.detach().numpy(), posemb_sincos_2d(4, 4, 64).numpy())
    with pytest.raises(ValueError, match="posemb"):
        build_vit("Mu/7", img_size=28, posemb="rope")


# --- 8. timm conventions: argument names, features, scripting, tracing, registration -------------------------

def _dropouts(model: nn.Module) -> dict:
    return {name: m.p for name, m in model.named_modules() if isinstance(m, nn.Dropout) and m.p > 0}


@pytest.mark.parametrize('arg', ['drop_rate', 'pos_drop_rate', 'proj_drop_rate', 'attn_drop_rate'])
def test_dropout_arguments_mean_what_they_mean_in_timm(arg):
    ours = build_vit('Mu/4', **MU, **{arg: 0.25})
    stock = timm.create_model('vit_tiny_patch16_224', img_size=32, num_classes=10, depth=4, **{arg: 0.25})
    assert _dropouts(ours) == _dropouts(stock) != {}


def test_drop_rate_is_head_dropout():
    m = build_vit('Mu/4', drop_rate=0.5, rep_size=True, **MU)
    assert _dropouts(m) == {'head_drop': 0.5}
    seen = {}
    m.head_drop.register_forward_hook(lambda mod, i, o: seen.update(i=i[0], o=o))
    m.head.register_forward_hook(lambda mod, i, o: seen.update(head_in=i[0]))
    m.train()
    with torch.no_grad():
        m(_images())
    assert seen['head_in'] is seen['o'] and (seen['o'] == 0).any() and not (seen['i'] == 0).any()


def test_timm_kwargs_pass_through():
    m = build_vit('Mu/4', qkv_bias=False, reg_tokens=2, **MU)
    assert m.blocks[0].attn.qkv.bias is None and m.reg_token.shape == (1, 2, 64)
    assert m(_images()).shape == (2, 10)
    dyn = timm.create_model('vit_mu_patch4_dpn', img_size=32, num_classes=10, dynamic_img_size=True)
    assert dyn(_images(size=48)).shape == (2, 10)
    with pytest.raises(ValueError, match='stem'):
        build_vit('Mu/4', embed_layer=nn.Identity, **MU)


def test_features_only_returns_per_block_features():
    model = timm.create_model('vit_base_patch16_dpn', features_only=True, img_size=64)
    assert model.feature_info.channels() == [768] * 3 and model.feature_info.reduction() == [16] * 3
    with torch.no_grad():
        feats = model(_images(1, size=64))
    assert [tuple(f.shape) for f in feats] == [(1, 768, 4, 4)] * 3

    small = timm.create_model('vit_mu_patch4_conv', features_only=True, img_size=32, out_indices=(0, 2),
                              stem='rmsnorm', placement='normformer')
    with torch.no_grad():
        feats = small(_images())
    assert [tuple(f.shape) for f in feats] == [(2, 64, 8, 8)] * 2


def _block_outputs(model: nn.Module, x: torch.Tensor) -> list:
    outs = []
    hooks = [blk.register_forward_hook(lambda m, i, o: outs.append(o)) for blk in model.blocks]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return outs


def _configs():
    return [dict(stem=s) for s in STEMS] + [dict(placement=p) for p in PLACEMENTS if p != 'pre-pre'] + [
        dict(stem='dpn', pool='gap', rep_size=16)]


def _cfg_id(cfg: dict) -> str:
    return '-'.join(f'{v}' for v in cfg.values())


@pytest.mark.parametrize('cfg', _configs(), ids=_cfg_id)
def test_forward_intermediates(cfg):
    model = _randomize(build_vit('Mu/4', **MU, **cfg)).eval()
    x = _images()
    blocks = _block_outputs(model, x)
    n_prefix = model.num_prefix_tokens
    with torch.no_grad():
        final, inter = model.forward_intermediates(x, indices=[0, 2])
        torch.testing.assert_close(final, model.forward_features(x), atol=0, rtol=0)
        for i, y in zip([0, 2], inter):
            assert y.shape == (2, 64, 8, 8)
            want = blocks[i][:, n_prefix:].reshape(2, 8, 8, 64).permute(0, 3, 1, 2)
            torch.testing.assert_close(y, want, atol=0, rtol=0)
        nlc = model.forward_intermediates(x, indices=2, output_fmt='NLC', norm=True, intermediates_only=True)
        assert [tuple(y.shape) for y in nlc] == [(2, 64, 64)] * 2
        torch.testing.assert_close(nlc[-1], model.norm(blocks[-1])[:, n_prefix:], atol=0, rtol=0)


@pytest.mark.filterwarnings('ignore:`torch.jit.script` is deprecated:FutureWarning')
@pytest.mark.parametrize('cfg', _configs(), ids=_cfg_id)
def test_torchscript_and_fx(cfg):
    model = _randomize(build_vit('Mu/4', depth=2, **MU, **cfg)).eval()
    x = _images()
    with torch.no_grad():
        ref = model(x)
        torch.testing.assert_close(torch.jit.script(model)(x), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.fx.symbolic_trace(model)(x), ref, atol=1e-5, rtol=1e-5)
        ext = timm.models.create_feature_extractor(model, return_nodes={'blocks.1': 'b1', 'norm': 'norm'})
        out = ext(x)
        torch.testing.assert_close(out['b1'], _block_outputs(model, x)[1], atol=0, rtol=0)
        torch.testing.assert_close(out['norm'], model.forward_features(x), atol=0, rtol=0)

        fx_feats = timm.create_model('vit_mu_patch4_dpn', features_only=True, feature_cls='fx', out_indices=(0, 1),
                                     depth=2, img_size=32, **cfg)
        feats = fx_feats(x)
    assert [tuple(f.shape) for f in feats] == [(2, 64 + model.num_prefix_tokens, 64)] * 2


@pytest.mark.filterwarnings('ignore:`torch.jit.script` is deprecated:FutureWarning')
def test_stem_input_checks_survive_scripting_and_tracing():
    model = build_vit('Mu/4', stem='dpn', depth=1, **MU).eval()
    for m in (model, torch.fx.symbolic_trace(model)):
        with pytest.raises(ValueError, match='img_size'):
            m(_images(size=36))
    with pytest.raises(Exception, match='img_size'):
        torch.jit.script(model)(_images(size=36))


def test_build_vit_is_timm_create_model():
    m = build_vit('Mu/7', stem='post', img_size=28, num_classes=10, in_chans=1)
    assert m.pretrained_cfg['architecture'] == 'vit_mu_patch4_dpn' and m.patch_embed.patch_size == (7, 7)
    assert build_vit('S/32', stem='conv', img_size=64).pretrained_cfg['architecture'] == 'vit_small_patch32_conv'
    ref = timm.create_model('vit_mu_patch4_dpn', patch_size=7, stem='post', img_size=28, num_classes=10, in_chans=1)
    assert set(m.state_dict()) == set(ref.state_dict())
    assert timm.models.get_model_input_config(m)['input_size'] == (1, 28, 28)


def test_model_spec_uses_timm_dropout_names_and_reads_old_specs(tmp_path):
    import json
    from dataclasses import asdict

    from dpnrepro.artifacts import ModelSpec

    spec = ModelSpec(arch='Mu/4', stem='dpn', placement='pre-pre', num_classes=10, img_size=32, in_chans=3,
                     pool='tok', rep_size=False, head_bias_init=0.0, pos_drop_rate=0.1, proj_drop_rate=0.2,
                     drop_path_rate=0.0)
    m = spec.build()
    assert m.pos_drop.p == 0.1 and m.blocks[0].mlp.drop1.p == 0.2 and m.head_drop.p == 0.0
    old = {k: v for k, v in asdict(spec).items() if k not in ('pos_drop_rate', 'proj_drop_rate')}
    (tmp_path / 'model_spec.json').write_text(json.dumps(dict(old, drop_rate=0.1)))  # before the timm names
    loaded = ModelSpec.from_json(tmp_path / 'model_spec.json')
    assert (loaded.pos_drop_rate, loaded.proj_drop_rate) == (0.1, 0.1)
    assert loaded.build().head_drop.p == 0.0
