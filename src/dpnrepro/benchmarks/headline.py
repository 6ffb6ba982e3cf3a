"""The benchmarks' headline numbers, ``metrics/headline/{benchmarks,input_pipeline}.json``: what a reader diffs
across commits with ``dvc metrics diff`` (benchmarks/dvc.yaml declares them as its only DVC metrics). The
per-round timings, orders and per-model detail stay in ``metrics/benchmarks.json`` and
``metrics/input_pipeline.json``."""

from __future__ import annotations


def _comparison(c: dict) -> dict:
    return {"median_pct": c["median_pct"], "ci_pct": list(c["ci_pct"]) if c.get("ci_pct") else None,
            "resolved": c["resolved"]}


def throughput_headline(result: dict) -> dict:
    """Per arch: img/s and MFU (null off CUDA) of each model, and each paired step-time comparison (median %
    with its 95 % CI and the verdict), from :func:`dpnrepro.benchmarks.train_throughput.run_benchmark`'s result."""
    out = {"device": result["device"]}
    for arch, models in result["results"].items():
        out[arch] = {model: {"img_per_s": row["img_per_s"], "mfu_pct": row["mfu_pct"]} for model, row in models.items()}
        out[arch].update({name: _comparison(c) for name, c in result["comparisons"].get(arch, {}).items()})
    return out


def input_headline(result: dict) -> dict:
    """img/s per core of each backend and each speed-up over ``pil`` (median, 95 % CI, verdict), from
    :func:`dpnrepro.benchmarks.input_pipeline.run_input_benchmark`'s result."""
    return {"img_per_s_per_core": {name: b["img_per_s_per_core"] for name, b in result["backends"].items()},
            **{name: {"median": s["median"], "ci": list(s["ci"]), "resolved": s["resolved"]}
               for name, s in result["speedups"].items()}}
