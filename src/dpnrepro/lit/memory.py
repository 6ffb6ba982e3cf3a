"""Memory of a LiT text-tower step, measured (not a stage; ``python -m dpnrepro.lit.memory``).

* :func:`activation_bytes_per_caption`: the bytes autograd saves for the backward of one caption through
  open_clip's TextTransformer (``saved_tensors_hooks``, each storage counted once), fp32 or bf16 autocast.
  Activation memory is linear in the captions embedded with autograd at once, so this times the chunk
  size (GradCache) or the local shard (no chunking) is what a GPU needs for activations.
* :func:`step_peak_rss`: peak RSS growth of one step (forward, loss, backward) in a fresh process, chunked
  or not (CPU; the measured counterpart of the count above).
"""

from __future__ import annotations

import json
import subprocess
import sys

import torch


def _tower(width: int, heads: int, layers: int, context: int = 16, embed_dim: int | None = None):
    from dpnrepro.lit.towers import build_text_tower

    return build_text_tower(embed_dim=embed_dim or width, context_length=context, width=width, heads=heads,
                            layers=layers)


def _tokens(n: int, context: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    t = torch.randint(1, 49000, (n, context), generator=g)
    t[:, -1] = 49407  # <end> last: every token position is live
    return t


def activation_bytes_per_caption(*, width: int, heads: int, layers: int, bf16: bool = False) -> float:
    """The slope of saved bytes over captions (4 vs 12): autocast's bf16 weight copies, saved once per
    forward whatever the batch, drop out."""
    return (_saved_bytes(width, heads, layers, bf16, 12) - _saved_bytes(width, heads, layers, bf16, 4)) / 8


def _saved_bytes(width: int, heads: int, layers: int, bf16: bool, n: int) -> int:
    text = _tower(width, heads, layers)
    seen: dict[tuple, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in text.parameters()}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        if st.data_ptr() in weights:  # parameters (or views of them) are not activations
            return t
        seen[(st.data_ptr(), st.nbytes())] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        text(_tokens(n)).float().sum()
    return sum(seen.values())


def _rss_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(field)


def _one_step(width: int, heads: int, layers: int, batch: int, chunk: int) -> dict:
    """In this (fresh) process: one forward + loss + backward; RSS growth from before the step to its peak."""
    import os

    from dpnrepro.lit.towers import l2_normalize
    from dpnrepro.lit.train import lit_loss, text_step

    torch.set_num_threads(int(os.environ.get("DPNREPRO_CPU_THREADS", "1")))
    torch.manual_seed(0)

    class Text(torch.nn.Module):  # what text_step needs of a LiT: encode_text and temperature
        def __init__(self):
            super().__init__()
            self.text = _tower(width, heads, layers)
            self.temperature = torch.tensor(10.0, requires_grad=True)

        def encode_text(self, t):
            return l2_normalize(self.text(t))

    lit, tokens = Text(), _tokens(batch)
    zimg = l2_normalize(torch.randn(batch, width))
    before = _rss_kib("VmRSS:")
    text_step(lit, zimg, tokens, lit_loss(None), chunk_size=chunk)
    return {"batch": batch, "chunk": chunk, "peak_growth_mib": (_rss_kib("VmHWM:") - before) / 1024}


def step_peak_rss(*, width: int, heads: int, layers: int, batch: int, chunk: int) -> dict:
    code = (f"import json; from dpnrepro.lit.memory import _one_step; "
            f"print(json.dumps(_one_step({width}, {heads}, {layers}, {batch}, {chunk})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    b = dict(width=768, heads=12, layers=12)  # a B-size text tower (LiT's B/32 pairing), 16 tokens
    per_caption = {"fp32": activation_bytes_per_caption(**b), "bf16": activation_bytes_per_caption(**b, bf16=True)}
    mid = dict(width=256, heads=4, layers=4)
    steps = [step_peak_rss(**mid, batch=2048, chunk=c) for c in (0, 256)]
    per_mid = activation_bytes_per_caption(**mid)
    print(json.dumps({"B_text_tower_activation_bytes_per_caption": per_caption,
                      "w256_l4_activation_bytes_per_caption_fp32": per_mid,
                      "w256_l4_step_peak_rss": steps}, indent=1))


if __name__ == "__main__":
    main()
