"""Dynamic Token Normalization (Shao et al., ICLR 2022), the alternative normalizer of the blocks'
residual stream (``block_norm='dtn'``)."""
import math
from typing import Optional

import torch
from torch import Tensor, nn

from dpnrepro.model_spec import LN_EPS

__all__ = ['DynamicTokenNorm']


class DynamicTokenNorm(nn.Module):
    """Dynamic Token Normalization (DTN; Shao et al., "Dynamic Token Normalization Improves Vision
    Transformers", ICLR 2022, arXiv:2112.02624), a drop-in for the blocks' LayerNorm.

    Tokens ``x`` (B, T, C), channels split into ``num_heads`` groups ``x^h`` (B, T, C/H). Per head,
    intra-token (LayerNorm) and inter-token statistics are mixed by a learnable ``λ^h ∈ [0, 1]``::

        μ^h  = λ^h μ_ln + (1 − λ^h) P^h x^h
        σ²^h = λ^h σ²_ln + (1 − λ^h) [P^h (x^h ⊙ x^h) − (P^h x^h) ⊙ (P^h x^h)]
        y    = γ (x − concat_h μ^h) / sqrt(concat_h σ²^h + eps) + β

    ``μ_ln`` / ``σ²_ln`` are the mean and (biased) variance of each token over all C channels.
    ``P^h = softmax_j(R_ij · a^h)`` is a row-stochastic T × T positional attention over the patch grid,
    ``R_ij = [δx² + δy², δx, δy]`` the shift from patch i to patch j, ``a^h`` learnable and initialised
    to ``[−1, 2Δx^h, 2Δy^h]`` so that head h looks at offset ``Δ^h`` of a √H × √H neighbourhood (heads
    beyond the square repeat its offsets). ``λ^h = sigmoid(lam_logit^h)``, initialised to 1/2. λ = 1
    gives LayerNorm; λ = 0 with a uniform ``P`` gives InstanceNorm over the tokens.

    As defined in the paper (not the reference code's extra per-head RMS pre-scaling). Prefix tokens
    (class / register tokens, not on the grid) get the LayerNorm statistics. The patch grid is taken to
    be square (``T − num_prefix_tokens`` a perfect square).
    """

    def __init__(self, dim: int, num_heads: int = 1, num_prefix_tokens: int = 0, eps: float = LN_EPS,
                 locality_strength: float = 1.0, device=None, dtype=None) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'DTN: dim {dim} is not divisible by num_heads {num_heads}')
        dd = {'device': device, 'dtype': dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.num_prefix_tokens = num_prefix_tokens
        self.eps = eps
        self.locality_strength = locality_strength
        self.weight = nn.Parameter(torch.empty(dim, **dd))
        self.bias = nn.Parameter(torch.empty(dim, **dd))
        self.lam_logit = nn.Parameter(torch.empty(num_heads, **dd))
        self.pos_weight = nn.Parameter(torch.empty(num_heads, 3, **dd))  # a^h
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        nn.init.zeros_(self.lam_logit)
        k = max(1, int(math.isqrt(self.num_heads)))
        center = (k - 1) / 2
        with torch.no_grad():
            for h in range(self.num_heads):
                i = h % (k * k)
                dx, dy = i % k - center, i // k - center
                self.pos_weight[h] = torch.tensor([-1.0, 2 * dx, 2 * dy]) * self.locality_strength

    @staticmethod
    def relative_positions(side: int, device: Optional[torch.device] = None) -> Tensor:
        """``R`` of a ``side`` × ``side`` grid in row-major token order: (T, T, 3) = [δx² + δy², δx, δy]."""
        idx = torch.arange(side * side, device=device)
        y, x = idx // side, idx % side
        dx = (x[None, :] - x[:, None]).float()
        dy = (y[None, :] - y[:, None]).float()
        return torch.stack([dx * dx + dy * dy, dx, dy], dim=-1)

    def positional_attention(self, num_patches: int) -> Tensor:
        """``P`` of every head, (H, T, T), rows summing to 1."""
        side = int(math.isqrt(num_patches))
        if side * side != num_patches:
            raise ValueError(f'DTN needs a square patch grid, got {num_patches} patch tokens')
        rel = self.relative_positions(side, self.pos_weight.device).to(self.pos_weight.dtype)
        return torch.einsum('ijc,hc->hij', rel, self.pos_weight).softmax(dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        H, n_pre = self.num_heads, self.num_prefix_tokens
        xf = x.float()
        mean_ln = xf.mean(dim=-1, keepdim=True)                          # (B, T, 1)
        var_ln = (xf - mean_ln).pow(2).mean(dim=-1, keepdim=True)
        patches = xf[:, n_pre:].reshape(B, T - n_pre, H, C // H).transpose(1, 2)  # (B, H, N, C/H)
        pos = self.positional_attention(T - n_pre).float()              # (H, N, N)
        mean_in = torch.matmul(pos, patches)
        var_in = (torch.matmul(pos, patches * patches) - mean_in * mean_in).clamp_min(0.)
        lam = torch.sigmoid(self.lam_logit.float()).view(1, H, 1, 1)
        mean_p = mean_ln[:, n_pre:].unsqueeze(1)                          # (B, 1, N, 1)
        var_p = var_ln[:, n_pre:].unsqueeze(1)
        mean = (lam * mean_p + (1 - lam) * mean_in).transpose(1, 2).reshape(B, T - n_pre, C)
        var = (lam * var_p + (1 - lam) * var_in).transpose(1, 2).reshape(B, T - n_pre, C)
        mean = torch.cat([mean_ln[:, :n_pre].expand(-1, -1, C), mean], dim=1)
        var = torch.cat([var_ln[:, :n_pre].expand(-1, -1, C), var], dim=1)
        y = (xf - mean) * torch.rsqrt(var + self.eps)
        return (y * self.weight.float() + self.bias.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f'{self.dim}, num_heads={self.num_heads}, num_prefix_tokens={self.num_prefix_tokens}, eps={self.eps}'
