"""The headline numbers of a report, ``metrics/headline/<report>.json``: the only files dvc.yaml declares as
DVC ``metrics``, so ``dvc metrics show`` / ``dvc metrics diff`` stay a table a person can read.

Per table block: each stem's mean, DPN − base (or a stem's gain over DPN, Table 6) with its 95 % CI
half-width and verdict. Per-seed, per-run and per-task detail stays in the ordinary outputs the headline is
cut from (``metrics/<sweep>.json``, ``metrics/<report>_summary.json``).
"""

from __future__ import annotations

from pathlib import Path

from dpnrepro.stats import verdict_text

HEADLINE_DIR = "headline"
NO_VERDICT = "no verdict"


def headline_path(report: str, metrics_dir: str | Path = "metrics") -> Path:
    return Path(metrics_dir) / HEADLINE_DIR / f"{report}.json"


def write_headline(report: str, numbers: dict, metrics_dir: str | Path = "metrics") -> Path:
    """Write ``metrics/headline/<report>.json`` atomically; returns its path."""
    from dpnrepro.io import write_json_atomic

    path = headline_path(report, metrics_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, numbers)
    return path


def difference(delta: dict) -> dict:
    """``{mean, ci95, verdict}`` of a summary's paired Δ: the verdict :func:`stats.paired_test` recorded in
    it (with why, where too few training runs), ``no verdict`` where a side did not learn (``learned``
    false: a Δ between runs at chance says nothing)."""
    if "verdict" not in delta:
        raise ValueError(f"a Δ without stats.paired_test's verdict: {sorted(delta)}")
    out = {"mean": delta["mean"]}
    if delta.get("ci95") is not None:
        out["ci95"] = delta["ci95"]
    out["verdict"] = NO_VERDICT if delta.get("learned") is False else verdict_text(delta)
    return out


def stem_block(entry: dict, base: str = "conv", delta_key: str = "delta_dpn") -> dict:
    """One block of a summary (``{<base>: {mean}, dpn: {mean}, delta_dpn: {mean, ci95[, verdict]}}``) as
    ``{<base>: mean, dpn: mean, dpn-<base>: {mean, ci95, verdict}}``."""
    delta = entry[delta_key]
    base = delta.get("vs", base)
    return {base: entry[base]["mean"], "dpn": entry["dpn"]["mean"],
            f"dpn-{base}": difference(delta)}


def nested_blocks(tree: dict, depth: int) -> dict:
    """:func:`stem_block` of every block ``depth`` levels down a summary (sweep / arch, group / arch, ...)."""
    if depth == 0:
        return stem_block(tree)
    return {key: nested_blocks(value, depth - 1) for key, value in tree.items()}


def tables_1_2(summaries: dict) -> dict:
    """Tables 1 and 2: ``{sweep: {arch: block}}``."""
    return nested_blocks(summaries, 2)


def table3(summary: dict) -> dict:
    """Table 3: the Natural / Specialized / Structured means per arch (the tasks stay in the summary)."""
    return nested_blocks(summary["groups"], 2)


def table4(summary: dict, headline_set: str) -> dict:
    """Table 4: every classifier × tower × arch on the set the table reports."""
    return nested_blocks(summary[headline_set], 3)


def table5(summary: dict) -> dict:
    """Table 5: ``{fraction: block}``."""
    return nested_blocks(summary, 1)


def table6(summary: dict) -> dict:
    """Table 6: DPN's mean and, per ablated stem, its mean and its gain over DPN (paired by seed)."""
    out = {}
    for arch, entry in summary.items():
        stems = {key.removeprefix("gain_"): gain for key, gain in entry.items() if key.startswith("gain_")}
        out[arch] = {"dpn": entry["dpn"]["mean"], **{
            stem: {"mean": entry[stem]["mean"],
                   "gain_over_dpn": difference(gain)}
            for stem, gain in stems.items()}}
    return out


def table7(summary: dict) -> dict:
    """Table 7: per arch and setting, each stem's test accuracy and DPN − base (one run each: no CI)."""
    out = {}
    for arch, entry in summary.items():
        stems = [s for s in entry if s != "delta_dpn"]
        base = next(s for s in stems if s != "dpn")
        out[arch] = {setting: {**{s: entry[s][setting]["test"] for s in (base, "dpn")},
                               f"dpn-{base}": difference(delta)}
                     for setting, delta in entry["delta_dpn"].items()}
    return out


def figure1(summary: dict) -> dict:
    """Figure 1: the baseline's (conv + pre-LN) mean and the plotted values, each (stem, placement)'s gain
    over it."""
    return {arch: {"baseline": {key: item["mean"] for key, item in entries.items() if "gain" not in item},
                   "gain": {key: item["gain"]["mean"] for key, item in entries.items() if "gain" in item}}
            for arch, entries in summary.items()}


def figures(summary: dict) -> dict:
    """Figures 2 and 4: the stem's gradient norm per stem (and DPN / base for Fig. 2's arch)."""
    def stem_norms(depth: dict) -> dict:
        return {stem: layers["stem"]["mean"] for stem, layers in depth.items()
                if isinstance(layers, dict) and "stem" in layers}

    fig2 = summary["figure2"]
    return {"figure2": {fig2["arch"]: {"stem_grad_norm": stem_norms(fig2["depth"]),
                                       "stem_ratio_dpn_over_base": fig2["stem_ratio_dpn_over_base"]}},
            "figure4": {arch: {"stem_grad_norm": stem_norms(depth)} for arch, depth in summary["figure4"].items()}}


def study(summary: dict) -> dict:
    """The powered study: per cell DPN − conv (comparison and plateau cells), per Table 6 stem its gain
    over DPN."""
    out = {}
    for cell in [*summary["comparison"], *summary["plateau"]]:
        out[cell["cell"]] = {"conv": cell["conv"]["mean"], "dpn": cell["dpn"]["mean"],
                             "dpn-conv": difference(cell["delta"])}
    for cell in summary["ablations"]:
        out[cell["cell"]] = {row["stem"]: {"mean": row["mean"], **({"gain_over_dpn": difference(row["vs_dpn"])}
                                                      if "vs_dpn" in row else {})}
            for row in cell["rows"]}
    return out

