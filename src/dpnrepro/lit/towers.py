"""The two towers of LiT and the contrastive loss, built from standard parts.

* Image tower: one of our pretraining runs (``runs/<sweep>/<run>``, :func:`dpnrepro.artifacts.load_run_model`),
  **locked**: every parameter has ``requires_grad=False``, the module stays in eval mode whatever
  ``.train()`` is called with, and its embedding is the ``pre_logits`` representation (big_vision's
  two-tower model with ``img_head=False``: no head on the image side).
* Text tower: open_clip's ``TextTransformer`` (token + learned position embeddings, pre-LN causal
  transformer, final LayerNorm, the EOT token's state projected by a bias-free Linear to the image
  embedding's width) and open_clip's BPE tokenizer (``SimpleTokenizer``; its vocabulary ships in the
  wheel, so it works offline), initialised from scratch.
* Loss: open_clip's ``ClipLoss`` (symmetric softmax cross-entropy over the batch's image-text logits)
  with big_vision's learnable temperature ``t = exp(log_t)``, ``log_t`` initialised to log(10).
* Both embeddings are L2-normalised as big_vision does (``z / (||z|| + 1e-8)``).
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import nn

NORM_EPS = 1e-8  # big_vision two_towers: z / (||z|| + 1e-8)


def l2_normalize(z: torch.Tensor) -> torch.Tensor:
    return z / (torch.linalg.vector_norm(z, dim=-1, keepdim=True) + NORM_EPS)


class LockedImageTower(nn.Module):
    """A pretrained ViT, frozen: no gradients, always in eval mode; returns ``pre_logits`` features."""

    def __init__(self, vit: nn.Module):
        super().__init__()
        self.vit = vit.requires_grad_(False).eval()
        self.embed_dim = vit.head_hidden_size

    def train(self, mode: bool = True):  # locked: dropout / stochastic depth stay off
        return super().train(False)

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.vit.forward_head(self.vit.forward_features(images), pre_logits=True)


def state_digest(module: nn.Module) -> str:
    """sha256 of a module's state dict (names, dtypes, shapes, bytes): proves a tower did not change."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def build_text_tower(*, embed_dim: int, context_length: int, width: int, heads: int, layers: int) -> nn.Module:
    """open_clip's TextTransformer with the BPE vocabulary, projecting to the image embedding width."""
    from open_clip.transformer import TextTransformer

    return TextTransformer(context_length=context_length, vocab_size=VOCAB_SIZE, width=width, heads=heads,
                           layers=layers, output_dim=embed_dim)


VOCAB_SIZE = 49408  # open_clip's bpe_simple_vocab_16e6: 49152 merges + 256 bytes (x2) + <start>/<end>


def tokenizer(context_length: int):
    """open_clip's BPE tokenizer (lower-cases, cleans whitespace; ``<start> ... <end>`` then 0-padding,
    truncated to ``context_length`` with ``<end>`` kept last). Needs no network: the vocab is in the wheel."""
    from open_clip.tokenizer import SimpleTokenizer

    return SimpleTokenizer(context_length=context_length)


class LiT(nn.Module):
    """Locked image tower + text tower + learnable temperature (big_vision's ``t``, stored as its log)."""

    def __init__(self, image: LockedImageTower, text: nn.Module, temperature_init: float):
        super().__init__()
        self.image, self.text = image, text
        self.log_temperature = nn.Parameter(torch.tensor(math.log(temperature_init)))

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.exp()

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return l2_normalize(self.image(images))

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return l2_normalize(self.text(tokens))

    def trainable_named_parameters(self):
        """The text tower and the temperature: the image tower is never handed to the optimizer."""
        return [(n, p) for n, p in self.named_parameters() if not n.startswith("image.")]


def contrastive_loss(zimg: torch.Tensor, ztxt: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """open_clip's ClipLoss: mean of the image->text and text->image softmax cross-entropies, logits
    ``temperature * zimg @ ztxt.T`` (big_vision's contrastive trainer computes the same)."""
    from open_clip.loss import ClipLoss

    return ClipLoss()(zimg, ztxt, temperature)


# What big_vision decays is ``.*/kernel$`` only (training/optim.py's decay_mask): of the text tower, its
# Linear / attention weight matrices and output projection; not these embedding tables (nor norms,
# biases or ``t``, which the rule leaves out by shape).
TEXT_NO_DECAY = ("token_embedding.weight", "positional_embedding")
