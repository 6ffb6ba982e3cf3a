"""The compute of one training step, shared by the trainer and the throughput benchmarks.

- Images travel as uint8 and are scaled to ``[-1, 1]`` on the device (:func:`unit_range`): a quarter of
  the bytes through the loader's shared memory, pinned buffers and the host-to-device copy; the result is
  bit-identical to scaling each image in the loader.
- :class:`LossStep` is forward + loss of one micro-batch (bf16 autocast on CUDA). With ``compile`` it is one
  ``torch.compile`` graph, so AOTAutograd also compiles its backward; ``cudagraphs`` replays both as CUDA
  graphs (``mode="reduce-overhead"``), which removes the per-kernel launch cost of small models.
- :func:`reseed` sets the dropout / stochastic-depth generator of a micro-step on the CPU and the one
  device in use only: ``torch.manual_seed`` also queues seeding of every accelerator (milliseconds).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def unit_range(images: torch.Tensor) -> torch.Tensor:
    """uint8 images -> float32 in [-1, 1] on their device, bit-identical to both input backends' own scaling
    (torchvision's ops here; ``data/fast.py``'s ``x * float32(2/255) - 1`` gives the same float for every
    one of the 256 values, tests/test_step.py). Float input (already scaled: random erasing) passes."""
    if images.is_floating_point():
        return images
    # torchvision.transforms.v2: ToDtype(float32, scale=True) then Normalize([0.5], [0.5]), op for op
    return images.to(torch.float32).mul_(1.0 / 255).sub_(0.5).div_(0.5)


def reseed(device: torch.device, seed: int) -> None:
    """Seed the default generators of the CPU and of ``device`` (what dropout / drop-path draw from)."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)


class LossStep:
    """``loss = loss_fn(forward(x).float(), targets)`` for one micro-batch; call ``.backward()`` on it.

    ``compile``: one ``torch.compile`` graph for forward + loss (AOTAutograd compiles the backward too).
    ``cudagraphs`` (with ``compile``, CUDA only): ``mode="reduce-overhead"``, the forward and backward
    replayed as CUDA graphs; the returned loss lives in the graph's memory pool and is overwritten by the
    next optimizer step's replay: keep :meth:`kept` of it, not the loss itself, beyond it. Drive it as the
    trainer does: per optimizer step ``zero_grad(set_to_none=True)``, :meth:`begin_step`, then per
    micro-batch ``step(x, t).backward()``.
    """

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor], loss_fn, device: torch.device, *,
                 compile: bool = False, cudagraphs: bool = False) -> None:
        self.device = device
        self.bf16 = device.type == "cuda"
        self.cudagraphs = bool(compile and cudagraphs and device.type == "cuda")
        forward_fn, bf16, dev = forward, self.bf16, device.type

        def loss_of(x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
                logits = forward_fn(x)
            return loss_fn(logits.float(), targets)

        if compile:
            loss_of = torch.compile(loss_of, mode="reduce-overhead" if self.cudagraphs else None)
        self._loss_of = loss_of
        self._begun = False

    def begin_step(self, params=None) -> None:
        """Start one optimizer step: call once before its first micro-batch, after the gradients were set to
        None (``optimizer.zero_grad(set_to_none=True)``); then call the step once per micro-batch.

        With CUDA graphs this marks one graph step (``torch.compiler.cudagraph_mark_step_begin``) for all the
        micro-batches of the optimizer step. The first backward *steals* a graph output as ``p.grad`` (it
        lives in the graph pool); the later micro-batches of the same step add into it, and the graph tree
        keeps it alive until the step ends. A mark frees every output of the previous step, so a ``.grad``
        kept across a mark (a mark per micro-batch, or gradients zeroed in place instead of set to None) is
        overwritten storage: PyTorch raises "accessing tensor output of CUDAGraphs that has been overwritten"
        at the next backward (pytorch/pytorch#169545). ``params`` (optional): refuse that up front, in one line.
        """
        if not self.cudagraphs:
            return
        if params is not None and any(p.grad is not None for p in params):
            raise ValueError("LossStep.begin_step with CUDA graphs: parameters still hold .grad from the last step; "
                             "set them to None first (optimizer.zero_grad(set_to_none=True)), gradients cannot "
                             "accumulate across optimizer steps in the graph pool")
        torch.compiler.cudagraph_mark_step_begin()
        self._begun = True

    def __call__(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.cudagraphs and not self._begun:
            raise RuntimeError("LossStep with CUDA graphs: call begin_step() once per optimizer step, before its "
                               "first micro-batch")
        return self._loss_of(x, targets)

    def kept(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` detached, safe to keep past the next optimizer step (whose graph replay overwrites the output)."""
        return loss.detach().clone() if self.cudagraphs else loss.detach()
