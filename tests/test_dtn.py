"""Dynamic Token Normalization (Shao et al. 2022): its defining behaviour, checked against the formula
written out by hand, its two limits (LayerNorm, InstanceNorm) and its positional initialisation."""

import math

import pytest
import torch
import torch.nn.functional as F

from dpnrepro.models import DynamicTokenNorm, build_vit


def _reference(x, norm):
    """DTN from the paper's equations with explicit loops over heads and token pairs (float64)."""
    x = x.double()
    B, T, C = x.shape
    H, n_pre = norm.num_heads, norm.num_prefix_tokens
    N = T - n_pre
    side = math.isqrt(N)
    a = norm.pos_weight.detach().double()
    lam = torch.sigmoid(norm.lam_logit.detach().double())
    out = torch.empty_like(x)
    for b in range(B):
        for t in range(T):
            mu_ln = x[b, t].mean()
            var_ln = ((x[b, t] - mu_ln) ** 2).mean()
            for h in range(H):
                ch = slice(h * C // H, (h + 1) * C // H)
                if t < n_pre:
                    mu, var = mu_ln, var_ln
                else:
                    i = t - n_pre
                    yi, xi = divmod(i, side)
                    logits = torch.empty(N, dtype=torch.float64)
                    for j in range(N):
                        yj, xj = divmod(j, side)
                        dx, dy = xj - xi, yj - yi
                        logits[j] = a[h, 0] * (dx * dx + dy * dy) + a[h, 1] * dx + a[h, 2] * dy
                    p = logits.softmax(0)
                    xh = x[b, n_pre:, ch]
                    m_in = p @ xh
                    v_in = p @ (xh * xh) - m_in * m_in
                    mu = lam[h] * mu_ln + (1 - lam[h]) * m_in
                    var = lam[h] * var_ln + (1 - lam[h]) * v_in
                out[b, t, ch] = (x[b, t, ch] - mu) / torch.sqrt(var + norm.eps)
    return out * norm.weight.detach().double() + norm.bias.detach().double()


@pytest.mark.parametrize("n_pre", [0, 1])
def test_matches_the_paper_formula(n_pre):
    torch.manual_seed(0)
    norm = DynamicTokenNorm(8, num_heads=4, num_prefix_tokens=n_pre)
    with torch.no_grad():  # move every learnable away from its init
        norm.lam_logit.copy_(torch.tensor([-1.5, 0.3, 2.0, -0.2]))
        norm.pos_weight.add_(0.3 * torch.randn_like(norm.pos_weight))
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.normal_()
    x = torch.randn(2, n_pre + 9, 8) * 3 + torch.arange(8.)  # channels with different offsets
    torch.testing.assert_close(norm(x).double(), _reference(x, norm), rtol=1e-4, atol=1e-4)


def test_lambda_one_is_layernorm():
    norm = DynamicTokenNorm(12, num_heads=3, num_prefix_tokens=1)
    with torch.no_grad():
        norm.lam_logit.fill_(60.0)  # sigmoid = 1 in float32
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.normal_()
    x = torch.randn(3, 17, 12) * 2 + 1
    torch.testing.assert_close(norm(x), F.layer_norm(x, (12,), norm.weight, norm.bias, eps=norm.eps),
                               rtol=1e-5, atol=1e-5)


def test_lambda_zero_uniform_positions_is_instancenorm():
    norm = DynamicTokenNorm(6, num_heads=2)
    with torch.no_grad():
        norm.lam_logit.fill_(-60.0)
        norm.pos_weight.zero_()  # R a = 0: P = 1/T everywhere
    x = torch.randn(2, 16, 6) * torch.linspace(0.5, 4, 6) + torch.linspace(-3, 3, 6)
    ref = F.instance_norm(x.transpose(1, 2), eps=norm.eps).transpose(1, 2)  # over tokens, per channel
    torch.testing.assert_close(norm(x), ref, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(norm(x), F.layer_norm(x, (6,), eps=norm.eps), atol=1e-2)


def test_positional_init_looks_at_each_heads_neighbour():
    norm = DynamicTokenNorm(8, num_heads=4)  # a 2x2 neighbourhood: offsets (+-0.5, +-0.5) * 2 in a^h
    pos = norm.positional_attention(25)  # 5x5 grid
    torch.testing.assert_close(pos.sum(-1), torch.ones(4, 25))
    centre = 12  # (2, 2)
    for h in range(4):
        dx, dy = norm.pos_weight[h, 1].item() / 2, norm.pos_weight[h, 2].item() / 2
        top = pos[h, centre].topk(4).indices.tolist()
        # the 4 most-attended patches form the 2x2 square on the side of Δ^h, and include the token itself
        want = {(2 + a) * 5 + (2 + b) for a in (0, int(math.copysign(1, dy))) for b in (0, int(math.copysign(1, dx)))}
        assert set(top) == want, (h, top, want)
    assert torch.sigmoid(norm.lam_logit).eq(0.5).all()


def test_lambda_and_positions_are_learned():
    model = build_vit("Mu/7", stem="dpn", block_norm="dtn", img_size=28, in_chans=1, num_classes=10)
    norms = [m for m in model.modules() if isinstance(m, DynamicTokenNorm)]
    assert len(norms) == 2 * len(model.blocks)  # norm1 and norm2 of every pre-LN block
    assert all(n.num_heads == 4 and n.num_prefix_tokens == 1 for n in norms)
    assert not isinstance(model.norm, DynamicTokenNorm)  # the encoder's final norm stays LN
    model.forward_features(torch.randn(2, 1, 28, 28)).pow(2).sum().backward()  # (the head is zero-init)
    assert all(n.lam_logit.grad.abs().sum() > 0 and n.pos_weight.grad.abs().sum() > 0 for n in norms)
    gap = build_vit("Mu/7", stem="conv", block_norm="dtn", placement="post-post", pool="gap", img_size=28,
                    in_chans=1, num_classes=10)
    assert gap.blocks[0].norm1_post.num_prefix_tokens == 0
    assert gap(torch.randn(1, 1, 28, 28)).shape == (1, 10)
    with pytest.raises(ValueError, match="block norm"):
        build_vit("Mu/7", block_norm="bn")
