"""The ``train.deterministic`` switch: deterministic kernels on GPU, or the fast ones.

On CPU every kernel of our training step is deterministic already: the switch changes nothing there
(two runs are bit-identical, tests/test_training.py). On CUDA, :data:`NONDETERMINISTIC_CUDA_KERNELS`
lists the kernels of our step (model, loss, optimizer, data-parallel reductions) that are, or can be,
non-deterministic, with how :func:`configure` handles each and the page that says so.

``configure(True)`` puts torch in *strict* deterministic mode (``use_deterministic_algorithms(True)``,
not warn-only): a kernel without a deterministic implementation raises instead of silently giving
other bits. None of our ops is on PyTorch's "throws" list, and strict mode is also what switches the
attention backward kernels to their deterministic variants (in warn-only mode they stay
non-deterministic and only warn), so no op of ours needs an explicit fallback.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

CUBLAS_WORKSPACE_CONFIG = ":4096:8"


class CudaKernel(NamedTuple):
    """A CUDA kernel of our training step that is, or can be, non-deterministic."""

    kernel: str
    used_by: str
    handling: str  # what configure(True) does about it
    source: str  # the documentation page (or PyTorch source / PR) that says so


NONDETERMINISTIC_CUDA_KERNELS: tuple[CudaKernel, ...] = (
    CudaKernel(
        "scaled_dot_product_attention backward, Flash and memory-efficient backends",
        "timm Attention (F.scaled_dot_product_attention) in every block",
        "strict mode makes them use their deterministic backward (Flash: no atomicAdd of dQ across key "
        "blocks; memory-efficient: num_splits_key = 1); warn-only mode keeps the fast non-deterministic one",
        "PyTorch source aten/src/ATen/native/transformers/cuda/attention_backward.cu (\"Flash Attention / "
        "Memory Efficient attention defaults to a non-deterministic algorithm\"); pytorch/pytorch#182551 "
        "(Reproducibility notes, CUDA SDPA section)",
    ),
    CudaKernel(
        "scaled_dot_product_attention, cuDNN backend",
        "the same attention; PyTorch's first choice on H100/B200 (sm90/sm100) with cuDNN > 9.15",
        "strict mode removes it from SDPA's backend choice (check_cudnn_deterministic), so Flash runs "
        "instead; warn-only mode keeps selecting it",
        "PyTorch source aten/src/ATen/native/transformers/cuda/sdp_utils.cpp; pytorch/pytorch#182551",
    ),
    CudaKernel(
        "cuDNN convolution (forward algorithm choice, backward-weight / backward-data kernels)",
        "the conv patch-embedding stem (stem: conv)",
        "cudnn.benchmark off (no timing-based algorithm choice) and cudnn.deterministic on / strict mode "
        "(deterministic algorithms only)",
        "PyTorch Reproducibility notes: 'CUDA convolution benchmarking', 'CUDA convolution determinism'; "
        "torch.use_deterministic_algorithms (Conv2d listed)",
    ),
    CudaKernel(
        "cuBLAS / cuBLASLt GEMMs",
        "every Linear (qkv, proj, MLP, stem, pre-logits, head) and bmm",
        "CUBLAS_WORKSPACE_CONFIG=:4096:8 (a fixed workspace; torch 2.14 also gives each handle/stream its "
        "own workspace, which NVIDIA names as sufficient); TF32 off so fp32 GEMMs are IEEE fp32. "
        "Bit-identical only on the same GPU model and cuBLAS version",
        "NVIDIA cuBLAS documentation, 'Results reproducibility'; PyTorch Reproducibility notes; "
        "pytorch/pytorch#161749",
    ),
    CudaKernel(
        "NCCL all-reduce (DDP) and reduce-scatter (FSDP2) with the NVLS algorithm",
        "gradient reduction with runtime.devices > 1 on NVSwitch machines",
        "torch sets NCCL_ALGO=^NVLS (unless NCCL_ALGO is set) when strict mode is on at process-group "
        "creation; every session runs this switch before it creates the group "
        "(training/distributed.process_session). Ring/tree reductions are deterministic for a fixed world size "
        "and topology; other layouts sum in another order",
        "PyTorch source torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp ('disabling NVLS algorithm'); "
        "NVIDIA/nccl#1497",
    ),
)

# Deterministic by construction, listed so nobody has to look them up again (torch.use_deterministic_algorithms
# does not list them): LayerNorm / RMSNorm (fwd+bwd), GELU, tanh, softmax / sigmoid cross-entropy; the loss's
# one-hot `scatter_` (a scalar value and one index per row: no write conflicts); Dropout and stochastic depth
# (Philox RNG seeded per micro-batch by the trainer); bf16 autocast (deterministic, but other bits than fp32 on
# CPU); clip_grad_norm_ and Adam/AdamW/SGD (torch's default foreach kernels, elementwise, no atomics).


def configure(deterministic: bool) -> None:
    """Deterministic kernels (``True``) or the fast ones (``False``), process-wide.

    ``CUBLAS_WORKSPACE_CONFIG`` is read when cuBLAS sets up its first handle, so it only takes effect if
    this runs before the first CUDA matmul of the process (the trainer calls it before building the
    model); an existing value is kept.
    """
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
        torch.use_deterministic_algorithms(True)  # strict: see the module docstring
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    else:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = False
    # TF32 is deterministic too, but its results depend on the GPU generation: off when deterministic.
    # The legacy flags, not `fp32_precision`: mixing the two APIs makes torch 2.14's getters raise.
    torch.backends.cuda.matmul.allow_tf32 = not deterministic
    torch.backends.cudnn.allow_tf32 = not deterministic
