"""Tables 1 and 2: the paper's printed numbers next to ours, as Markdown, a PNG figure and a JSON summary.

Each table is a list of blocks; a block of the paper (``reports/paper/table<N>.yaml``) is reproduced by
one sweep of the pipeline (``metrics/<sweep>.json``). Everything is computed from those files alone,
so the same inputs give byte-identical outputs on any machine.

Statistics follow Sec. 5.1 of the paper: ImageNet-1k-style blocks (top-1) report the mean and 95 %
t-interval over training seeds; the 21k / JFT-style blocks report few-shot accuracy, averaged over the
draws of the shots within each training seed. DPN − base deltas are paired by seed and given their
verdict by :func:`dpnrepro.stats.paired_by_seed` (docs/tables-and-figures.md#statistics). A block trained
once shows its Δ with the spread over the draws (evaluation noise, not training noise) and no verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dpnrepro.reports.paper import load_paper_table
from dpnrepro.stats import (LEARNED_MARGIN, MIN_PAIRS, fmt_ci, fmt_p, learned_cell, learned_delta, mean_ci95,
                            paired_by_seed, seed_means, verdict_text)

BASE_STEM = "conv"


@dataclass(frozen=True)
class Block:
    """One block of a paper table and the sweep that reproduces it."""

    part: str
    block: str              # the block name in reports/paper/table<N>.yaml
    sweep: str
    arch_suffix: str = ""   # S/16+ is printed as its own arch in the "ViT AugReg" block
    match: tuple = ()       # extra (key, value) a paper row must have (resolution, steps)

    @property
    def title(self) -> str:
        extra = ", ".join(f"{k} {v}" for k, v in self.match)
        return f"{self.block}{' + ' if self.arch_suffix else ''}{'S/16+' if self.arch_suffix else ''}" + \
            (f" ({extra})" if extra else "")


TABLES: dict[int, list[Block]] = {
    1: [
        Block("left", "ViT AugReg", "table1"),
        Block("left", "ViT AugReg", "splus", arch_suffix="+"),
        Block("left", "DeiT", "deit"),
        Block("left", "AugReg + 384x384 finetune", "ft384"),
        Block("right", "ImageNet-21k 93K steps", "i21k_93k"),
        Block("right", "ImageNet-21k 930K steps", "i21k_930k"),
    ],
    2: [
        Block("left", "JFT 220K steps", "jft_220k"),
        Block("left", "JFT 1.1M steps", "jft_1100k"),
        Block("right", "JFT -> ImageNet-1k finetune", "jft_220k_ft224", match=(("resolution", "224"), ("steps", "220K"))),
        Block("right", "JFT -> ImageNet-1k finetune", "jft_220k_ft384", match=(("resolution", "384"), ("steps", "220K"))),
        Block("right", "JFT -> ImageNet-1k finetune", "jft_1100k_ft224", match=(("resolution", "224"), ("steps", "1.1M"))),
        Block("right", "JFT -> ImageNet-1k finetune", "jft_1100k_ft384", match=(("resolution", "384"), ("steps", "1.1M"))),
    ],
}


def table_sweeps(table: int) -> list[str]:
    return [b.sweep for b in TABLES[table]]


# ---------------------------------------------------------------------------------------------------
# Ours


def _samples(run: dict, evaluate: str) -> float | list[float]:
    """The run's accuracy: top-1, or its few-shot accuracy per draw of the shots."""
    if evaluate == "fewshot":
        return run[next(k for k in run if k.startswith("fewshot") and k.endswith("_top1_draws"))]
    return run["val_top1"]


def _cell(per_seed: dict[int, float | list[float]], over_draws: bool, chance: float) -> dict:
    """A stem's mean ± 95 % CI: over seeds (draws averaged within each), or over the draws of one seed; and
    whether that mean learned (:func:`stats.learned_cell` against ``chance``)."""
    seeds = sorted(per_seed)
    values = list(per_seed[seeds[0]]) if over_draws and len(seeds) == 1 else \
        [seed_means(per_seed)[s] for s in seeds]
    mean, ci = mean_ci95(values)
    return {"mean": mean, "ci95": ci, "n": len(values),
            "over": "few-shot draws" if over_draws and len(seeds) == 1 else "seeds", "seeds": seeds,
            **learned_cell(mean, chance)}


def summarize_sweep(metrics: dict) -> dict:
    """{arch: {stem: {mean, ci95, n, over, seeds, chance, learned}, 'delta_<stem>': paired_by_seed(stem, base)
    + {vs} + stats.learned_delta} for one sweep. Chance: the `val` split's majority-class rate, which both
    evaluators score on (top-1, and few-shot on the same split)."""
    evaluate = metrics.get("evaluate", "top1")
    chance = metrics["data"]["majority_val"]
    by: dict[str, dict[str, dict]] = {}
    for run in metrics["runs"].values():
        by.setdefault(run["arch"], {}).setdefault(run["stem"], {})[run["seed"]] = _samples(run, evaluate)
    out = {}
    for arch, stems in sorted(by.items()):
        entry = {}
        base = BASE_STEM if BASE_STEM in stems else sorted(stems)[0]
        for stem, per_seed in sorted(stems.items()):
            entry[stem] = _cell(per_seed, evaluate == "fewshot", chance)
        for stem, per_seed in sorted(stems.items()):
            if stem != base:
                entry[f"delta_{stem}"] = {**paired_by_seed(per_seed, stems[base]), "vs": base,
                                          **learned_delta({s: entry[s] for s in (base, stem)})}
        out[arch] = entry
    return out


# ---------------------------------------------------------------------------------------------------
# Paper


def paper_rows(table: int, block: Block) -> list[dict]:
    """[{arch, base, dpn}] (printed strings) of one block of the paper, in printed order."""
    rows: dict[str, dict] = {}
    for r in load_paper_table(table)["rows"]:
        if r["part"] != block.part or r["block"] != block.block:
            continue
        if any(str(r.get(k)) != v for k, v in block.match):
            continue
        rows.setdefault(r["arch"], {"arch": r["arch"]})[r["variant"]] = r
    return list(rows.values())


def _printed(r: dict) -> str:
    return f"{r['value']} ± {r['ci95']}" if r.get("ci95") is not None else r["value"]


def paper_delta(row: dict) -> float:
    return float(row["dpn"]["value"]) - float(row["base"]["value"])


def fmt_delta(d: dict) -> str:
    """A paired difference as '+1.23 ± 0.456' (its 95 % t-interval half-width when defined)."""
    return f"{d['mean']:+.2f}" + (f" ± {d['ci95']:.3f}" if d.get("ci95") is not None else "")


def _our_arch(arch: str, block: Block) -> str:
    return arch + block.arch_suffix


# ---------------------------------------------------------------------------------------------------
# Rendering


def render_markdown(table: int, metrics: dict[str, dict], summaries: dict[str, dict], context: dict) -> str:
    paper = load_paper_table(table)
    lines = [
        f"# Table {table}: {paper['title']}",
        "",
        f"Generated by `dvc repro table{table}` from `metrics/<sweep>.json` and `reports/paper/table{table}.yaml`; "
        "do not edit by hand.",
        "",
        f"## Paper ({paper['source']})",
        "",
        f"{paper['metric']}; ± {paper['ci']}. Δ is derived here as DPN − Base of the printed values.",
        "",
        "| Part | Block | Arch | Base | DPN | Δ |",
        "|---|---|---|---|---|---|",
    ]
    seen = set()
    for block in TABLES[table]:
        for row in paper_rows(table, block):
            key = (block.part, block.block, block.match, row["arch"])
            if key in seen:
                continue
            seen.add(key)
            name = block.block + "".join(f", {k} {v}" for k, v in block.match)
            lines.append(f"| {block.part} | {name} | {row['arch']} | {_printed(row['base'])} | "
                         f"{_printed(row['dpn'])} | {paper_delta(row):+.1f} |")
    lines += [
        "",
        f"## Ours (profile `{context['profile']}`, measured by this pipeline)",
        "",
        f"- Data: {context['dataset']}. Top-1 blocks: accuracy (%) on the `val` split ({context['val_examples']} "
        "images), mean ± 95 % CI (Student t) over training seeds. Few-shot blocks: fewshot_lsr accuracy (%) on "
        "`val`, the draws of the shots averaged within each training seed, mean ± 95 % CI over seeds (a block "
        "trained once: over its draws, which measure evaluation noise, not training noise).",
        "- Δ = stem − conv, paired by training seed, ± its 95 % CI; p: two-sided paired t-test; verdict: better / "
        f"worse when the CI excludes 0 over at least {MIN_PAIRS} training seeds, else not resolved (a block with "
        "fewer seeds says how many; its Δ over draws is shown, not judged). "
        "Paper columns: the printed values with the paper's 95 % CI, for the same arch.",
        f"- Chance: {context['chance']:.1f} %, the `val` split's majority-class rate; a mean less than "
        f"{LEARNED_MARGIN:g} points above it is *at chance* (it learned nothing: no verdict on its Δ).",
        f"- Hardware: {context['hardware']}.",
        "",
    ]
    for block in TABLES[table]:
        summary = summaries.get(block.sweep)
        lines.append(f"### {block.block}{' (S/16+ recipe)' if block.arch_suffix else ''}"
                     + "".join(f", {k} {v}" for k, v in block.match) + f" — sweep `{block.sweep}`")
        lines.append("")
        if summary is None:
            lines += ["Not run in this profile.", ""]
            continue
        m = metrics[block.sweep]
        lines.append(f"Recipe: {context['recipes'][block.sweep]}. Evaluated by {m.get('evaluate', 'top1')}.")
        lines.append("")
        stems = sorted({s for e in summary.values() for s in e if not s.startswith("delta_")},
                       key=lambda s: (s != BASE_STEM, s))
        others = [s for s in stems if s != BASE_STEM]
        seeds = sorted({seed for e in summary.values() for s in stems if s in e for seed in e[s]["seeds"]})
        over = next(e[s]["over"] for e in summary.values() for s in stems if s in e)
        lines.append(f"Seeds: {', '.join(map(str, seeds))}; CI over {over}.")
        lines.append("")
        lines.append("| Arch | " + " | ".join(stems) + " | " + " | ".join(f"Δ {s} | p | verdict" for s in others)
                     + " | Paper Base | Paper DPN | Paper Δ |")
        lines.append("|---|" + "---|" * (len(stems) + 3 * len(others) + 3))
        paper_by_arch = {r["arch"]: r for r in paper_rows(table, block)}
        for arch, e in summary.items():
            cells = [fmt_ci(e[s]["mean"], e[s]["ci95"], 2) + (" *at chance*" if not e[s]["learned"] else "")
                     if s in e else "—" for s in stems]
            for s in others:
                d = e.get(f"delta_{s}")
                cells += ["—"] * 3 if d is None else [fmt_delta(d), fmt_p(d["p"]),
                                                      verdict_text(d) if d["learned"] else "no verdict"]
            label = _our_arch(arch, block)
            row = paper_by_arch.get(label)
            cells += ([_printed(row["base"]), _printed(row["dpn"]), f"{paper_delta(row):+.1f}"] if row
                      else ["— (not in paper)"] * 3)
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"![Table {table} figure](table{table}.png)", ""]
    return "\n".join(lines)


def render_figure(table: int, summaries: dict[str, dict], context: dict, path: str | Path) -> None:
    """DPN − base per block and arch: the paper's printed Δ (left) and ours with its 95 % CI (right)."""
    from dpnrepro.reports.plotting import pyplot, save_png

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100)
    labels, values = [], []
    for block in TABLES[table]:
        for row in paper_rows(table, block):
            name = f"{block.block.split(' ')[0]}{''.join(' ' + v for _, v in block.match)} {row['arch']}"
            if name not in labels:
                labels.append(name)
                values.append(paper_delta(row))
    axes[0].barh(range(len(labels)), values, color=["#d62728" if v >= 0 else "#444444" for v in values])
    axes[0].set_yticks(range(len(labels)), labels, fontsize=7)
    axes[0].invert_yaxis()
    axes[0].set_title(f"Paper, Table {table}: DPN − Base (points)")
    ours_labels, ours_vals, ours_err = [], [], []
    for block in TABLES[table]:
        for arch, e in (summaries.get(block.sweep) or {}).items():
            for key, d in e.items():
                if key.startswith("delta_"):
                    ours_labels.append(f"{block.sweep} {_our_arch(arch, block)} {key[6:]}")
                    ours_vals.append(d["mean"])
                    ours_err.append(d["ci95"] or 0.0)
    axes[1].barh(range(len(ours_labels)), ours_vals, xerr=ours_err, capsize=3,
                 color=["#d62728" if v >= 0 else "#444444" for v in ours_vals])
    axes[1].set_yticks(range(len(ours_labels)), ours_labels, fontsize=7)
    axes[1].invert_yaxis()
    axes[1].set_title(f"Ours ({context['profile']}): stem − conv ± 95 % CI (points)")
    for ax in axes:
        ax.axvline(0, color="black", lw=0.8)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)
