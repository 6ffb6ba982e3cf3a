"""Names of the ViT-DPN family: transformer sizes, stems, LayerNorm placements, block norms, pools and
position embeddings, with the parser of ``"B/16"``-style arch names and the check that raises on an
unknown choice. Outside :mod:`dpnrepro.models` (which imports torch and timm to register the models), so
that the params schema and the reports read these names without loading either."""
import re
from dataclasses import dataclass

__all__ = ['ArchSpec', 'ARCHS', 'STEMS', 'PLACEMENTS', 'BLOCK_NORMS', 'POOLS', 'POSEMBS', 'LN_EPS', 'parse_arch',
           'check_choice']


@dataclass(frozen=True)
class ArchSpec:
    """Transformer size: hidden width, number of blocks, attention heads, MLP hidden width."""
    width: int
    depth: int
    heads: int
    mlp_dim: int


# Ti..H as in the paper's appendix G (big_vision sizes); Mu is a smoke-test size.
ARCHS: dict[str, ArchSpec] = {
    'Mu': ArchSpec(64, 4, 4, 256),
    'Ti': ArchSpec(192, 12, 3, 768),
    'S': ArchSpec(384, 12, 6, 1536),
    'B': ArchSpec(768, 12, 12, 3072),
    'L': ArchSpec(1024, 24, 16, 4096),
    'H': ArchSpec(1280, 32, 16, 5120),
}

STEMS: tuple[str, ...] = (
    'conv', 'linear', 'dpn', 'pre', 'post', 'post_posemb', 'rmsnorm', 'no_learnable', 'only_learnable')

_SUBLAYER_NORMS = ('pre', 'post', 'prepost')
PLACEMENTS: tuple[str, ...] = tuple(
    f'{sa}-{mlp}' for sa in _SUBLAYER_NORMS for mlp in _SUBLAYER_NORMS) + ('normformer', 'subln')

# the normalizer of the blocks' residual stream (norm1 / norm2 and the post-LNs): LayerNorm, or
# Dynamic Token Normalization (Shao et al., ICLR 2022; :class:`~dpnrepro.models.dtn.DynamicTokenNorm`)
BLOCK_NORMS: tuple[str, ...] = ('ln', 'dtn')

POOLS: tuple[str, ...] = ('tok', 'gap')
POSEMBS: tuple[str, ...] = ('learn', 'sincos2d')

LN_EPS = 1e-6  # flax / big_vision LayerNorm default


def check_choice(kind: str, value, allowed) -> None:
    """ValueError naming ``kind`` and the allowed values when ``value`` is not one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f'unknown {kind} {value!r}; expected one of: {", ".join(map(str, allowed))}')


def parse_arch(arch: str) -> tuple[ArchSpec, int]:
    """``"B/16"`` -> ``(ARCHS["B"], 16)``; any positive integer patch size is accepted."""
    m = re.fullmatch(r'([A-Za-z]+)/([0-9]+)', arch.strip()) if isinstance(arch, str) else None
    if m is None or m.group(1) not in ARCHS or int(m.group(2)) < 1:
        raise ValueError(
            f'unknown arch {arch!r}; expected "<size>/<patch>" with size one of: {", ".join(ARCHS)} '
            f'and a positive integer patch, e.g. "B/16"')
    return ARCHS[m.group(1)], int(m.group(2))
