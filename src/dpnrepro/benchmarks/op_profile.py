"""Kernel time per training step by op group (``benchmark.profile_ops``): ``torch.profiler`` over a few steps,
device kernel time on CUDA, CPU op self time otherwise."""

from __future__ import annotations

import torch


# kernel name -> group, first match wins (lower-case substrings of CUDA kernel / CPU op names)
GROUPS = (("attention", ("flash", "fmha", "attention", "sdpa", "cudnn_generated_fort_native_sdpa")),
          ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "matmul", "addmm", "aten::mm", "aten::bmm", "linear")),
          ("optimizer", ("multi_tensor", "adam", "foreach", "norm_kernel_cuda", "clip")),
          ("norm", ("layer_norm", "layernorm", "native_layer_norm", "welford", "persistent_reduction")),
          ("copy", ("memcpy", "memset", "copy_", "cat", "to_copy")),
          ("compiled (triton)", ("triton",)),
          ("elementwise", ("elementwise", "vectorized", "unrolled", "aten::")))


def group_of(name: str) -> str:
    low = name.lower()
    return next((g for g, keys in GROUPS if any(k in low for k in keys)), "other")


def kernel_breakdown(step, steps: int, device: torch.device, top: int = 15) -> dict:
    """``steps`` calls of ``step`` under ``torch.profiler``: device (CUDA: kernels) or CPU (ops, self time)
    milliseconds per step grouped by :data:`GROUPS`, and the top kernels/ops."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    if cuda:
        events = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
        key = "self_device_time_total"
    else:
        key = "self_cpu_time_total"
    ms = {e.key: getattr(e, key) / 1e3 / steps for e in events}
    groups: dict[str, float] = {}
    for name, t in ms.items():
        groups[group_of(name)] = groups.get(group_of(name), 0.0) + t
    total = sum(ms.values())
    return {"clock": "device (CUDA kernels)" if cuda else "CPU (op self time)", "steps": steps,
            "ms_per_step": total,
            "groups": [{"group": g, "ms_per_step": t, "pct": 100 * t / total if total else None}
                       for g, t in sorted(groups.items(), key=lambda kv: -kv[1])],
            "top": [{"name": n[:120], "group": group_of(n), "ms_per_step": t}
                    for n, t in sorted(ms.items(), key=lambda kv: -kv[1])[:top]]}
