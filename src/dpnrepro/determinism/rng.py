"""The random state a resume restores, as plain values that no loader can move to another device.

:func:`capture_rng` returns strings, ints, floats and lists only: torch's CPU generator state and each
CUDA device's as base64 text, numpy's legacy global state (its 624 keys as ints) and Python's. Whatever
loads it back (JSON; ``torch.load`` with any ``map_location``, as mmengine maps a checkpoint to the
training device; ``all_gather_object``), nothing in it is a tensor that a mapping could put on a CUDA or
meta device, so :func:`restore_rng` gets the same bytes back. It also takes tensors (the training
checkpoint's ``rng.safetensors``; checkpoints written before this module) on any device that holds
data: they are copied to a CPU ``uint8`` tensor first, the only form torch's setters accept.

**CUDA.** The states of every visible device are captured once CUDA is initialised (a run that trains on
CUDA always is; a CPU run pays no CUDA start-up for them). On a resume with CUDA, device ``i`` gets state
``i`` for every ``i`` both machines have (a process trains on its devices ``0 .. n-1``). Without CUDA the
CUDA states are left unused, with no error: that resume continues on the CPU, whose computation (fp32,
other kernels) differs from the GPU's anyway, so it could not give the CUDA run's bits with any
generator state; the CPU generators are restored as always.
"""

from __future__ import annotations

import base64
import random

import numpy as np
import torch


def _text(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def state_tensor(value) -> torch.Tensor:
    """A generator state as the CPU ``uint8`` tensor torch's setters take, from base64 text, bytes, a list
    of ints, or a tensor on any device that holds data."""
    if torch.is_tensor(value):
        if value.device.type == "meta":
            raise ValueError("a random-generator state held as a tensor was loaded onto the meta device, "
                             "which keeps no data")
        return value.detach().to("cpu", torch.uint8).contiguous()
    if isinstance(value, str):
        value = base64.b64decode(value)
    return torch.frombuffer(bytearray(value), dtype=torch.uint8)


def cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def capture_rng(*, numpy_global: bool = True) -> dict:
    """The random state of this process as plain values: ``torch`` (CPU generator), ``cuda`` (one per
    device, only once CUDA is initialised), ``numpy`` (the global legacy generator, with
    ``numpy_global``) and ``python``."""
    version, internal, gauss = random.getstate()
    state = {"torch": _text(torch.get_rng_state()), "python": [version, list(internal), gauss]}
    if cuda_in_use():
        state["cuda"] = [_text(s) for s in torch.cuda.get_rng_state_all()]
    if numpy_global:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [str(kind), keys.tolist(), int(pos), int(has_gauss), float(cached)]
    return state


def restore_rng(state: dict) -> None:
    """Set the generators that ``state`` (from :func:`capture_rng`) holds; CUDA as the module says."""
    torch.set_rng_state(state_tensor(state["torch"]))
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        for index, value in enumerate(cuda[:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(state_tensor(value), index)
    if "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((str(kind), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss),
                             float(cached)))
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((int(version), tuple(int(v) for v in internal), gauss))
