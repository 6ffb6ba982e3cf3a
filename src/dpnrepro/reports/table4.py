"""Table 4 (Sec. 6.2): zero-shot accuracy after LiT on locked image towers, the paper's printed numbers
next to ours, as Markdown, a PNG figure and a JSON summary, from ``metrics/lit.json`` alone.

Ours: per (pretraining sweep, arch, stem), the mean and 95 % t-interval over the LiT seeds of the
zero-shot top-1 on each zero-shot set with each classifier; DPN − conv paired by LiT seed (the two
towers of a pair get the same text-tower init and batch order).
"""

from __future__ import annotations

from pathlib import Path

from dpnrepro.reports import headline
from dpnrepro.reports.plotting import finish_delta_axes, report_from_metrics
from dpnrepro.reports.paper import load_paper_table
from dpnrepro.stats import fmt_ci, mean_ci95, paired_by_seed, verdict_text

BASE_STEM = "conv"
# The pretraining sweep of an image tower -> the schedule the paper prints for it.
SWEEP_STEPS = {"jft_220k": "220K", "jft_1100k": "1.1M"}
CLASSIFIER_TEXT = {
    "label": "each class's text label embedded by the text tower, nearest class embedding (the paper's protocol)",
    "templates": "big_vision's discriminative classifier: canonical class names in CLIP's 80 prompt templates, "
                 "prompt embeddings normalised, averaged per class, renormalised",
}

# The one place this pipeline departs from big_vision's LiT config on purpose.
IMAGE_PIPELINE = (
    "Image pipeline (not big_vision's `lit_coco.py`): every image, for LiT training and zero-shot evaluation "
    "alike, goes through its locked tower's own evaluation preprocessing (its pretraining run's "
    "resize_small | central crop), without augmentation, so each tower's embeddings are computed once and "
    "reused every step. `lit_coco.py` trains with `decode | resize(224) | flip_lr | randaug(2, 10)` and "
    "evaluates with `resize(224)`; with augmentation a locked tower's embedding of an image changes every "
    "step, so following it means a forward of the locked tower on every training example (55,000 steps x "
    "16,384 per run) instead of one pass over the corpus, plus a CPU pipeline for 16,384 augmented images a "
    "step. The paper does not say which pipeline it used.")


def summarize(metrics: dict) -> dict:
    """{set: {classifier: {sweep: {arch: {stem: {mean, ci95, n}, 'delta_<stem>': {...}}}}}}."""
    out: dict = {}
    for name in metrics["datasets"]:
        for clf in metrics["classifiers"]:
            by: dict = {}
            for run in metrics["runs"].values():
                if name not in run["zeroshot"]:
                    continue
                by.setdefault(run["sweep"], {}).setdefault(run["arch"], {}).setdefault(run["stem"], {})[
                    run["tower_seed"], run["seed"]] = run["zeroshot"][name][clf]
            block = out.setdefault(name, {}).setdefault(clf, {})
            order = list(SWEEP_STEPS)
            for sweep, archs in sorted(by.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])):
                for arch, stems in archs.items():
                    entry = {}
                    for stem, runs in sorted(stems.items()):
                        mean, ci = mean_ci95([runs[k] for k in sorted(runs)])
                        entry[stem] = {"mean": mean, "ci95": ci, "n": len(runs), "seeds": sorted({k[1] for k in runs})}
                        if stem != BASE_STEM and BASE_STEM in stems:
                            entry[f"delta_{stem}"] = {**paired_by_seed(*_by_tower(runs, stems[BASE_STEM]),
                                                                       repeats="LiT seeds"), "vs": BASE_STEM}
                    block.setdefault(sweep, {})[arch] = entry
    return out


def _by_tower(treated: dict, control: dict) -> tuple[dict, dict]:
    """``{tower seed: [value per LiT seed]}`` of both sides of a Δ (``{(tower seed, LiT seed): value}``), on
    the LiT seeds they share. The independent training pairs are the image towers' pretraining seeds: LiT
    seeds of one locked pair of towers are averaged within it, like few-shot draws."""
    out: tuple[dict, dict] = ({}, {})
    for tower in sorted({k[0] for k in treated} & {k[0] for k in control}):
        lit = sorted({k[1] for k in treated if k[0] == tower} & {k[1] for k in control if k[0] == tower})
        for side, runs in zip(out, (treated, control)):
            side[tower] = [runs[tower, s] for s in lit]
    return out


def _paper_rows() -> list[dict]:
    rows: dict = {}
    for r in load_paper_table(4)["rows"]:
        rows.setdefault((r["arch"], r["steps"]), {"arch": r["arch"], "steps": r["steps"]})[r["variant"]] = r
    return list(rows.values())


def _printed(r: dict) -> str:
    return f"{r['value']} ± {r['ci95']}" if r.get("ci95") is not None else r["value"]


def _cell(e: dict | None) -> str:
    return "—" if e is None else fmt_ci(e["mean"], e["ci95"], 1)


def _delta(e: dict | None) -> str:
    if e is None:
        return "—"
    return f"{e['mean']:+.2f}" + (f" ± {e['ci95']:.2f}" if e["ci95"] is not None else "") + f", {verdict_text(e)}"


def render_markdown(metrics: dict, summary: dict) -> str:
    paper = load_paper_table(4)
    runs = list(metrics["runs"].values())
    seeds = sorted({r["seed"] for r in runs})
    hardware = "; ".join(sorted({r["hardware"] for r in runs}))
    head = metrics["headline"]
    lines = [
        f"# Table 4: {paper['title']}",
        "",
        "Generated by `dvc repro table4` from `metrics/lit.json` and `reports/paper/table4.yaml`; do not edit by hand.",
        "",
        f"## Paper ({paper['source']})",
        "",
        f"{paper['metric']}. ±: {paper['ci']}. Δ = DPN − Base of the printed values.",
        "",
        "| Arch | Image-tower steps | Base | DPN | Δ |",
        "|---|---|---|---|---|",
    ]
    for r in _paper_rows():
        d = float(r["dpn"]["value"]) - float(r["base"]["value"])
        lines.append(f"| {r['arch']} | {r['steps']} | {_printed(r['base'])} | {_printed(r['dpn'])} | {d:+.1f} |")
    lines += [
        "",
        f"## Ours (profile `{metrics['profile']}`, measured by this pipeline)",
        "",
        f"- LiT: {metrics['recipe']}.",
        f"- {IMAGE_PIPELINE}",
        f"- Image towers: the runs of the pretraining sweeps {', '.join(f'`{s}`' for s in summary[head][metrics['classifiers'][0]])}"
        " (Table 2's JFT-style sweeps), locked.",
        f"- Runs: {len(runs)}; LiT seeds {', '.join(map(str, seeds))} per tower; mean ± 95 % CI (Student t) over "
        "the LiT seeds; Δ = dpn − conv paired by LiT seed, averaged within each pair of image towers (their "
        "pretraining seeds are the independent training pairs), with its verdict "
        "(docs/tables-and-figures.md#statistics).",
        f"- Hardware: {hardware}.",
        "- Zero-shot classifiers: " + "; ".join(f"`{c}` = {CLASSIFIER_TEXT[c]}" for c in metrics["classifiers"]) + ".",
        "",
    ]
    if metrics["profile"] != "full":
        lines += [
            "**What this profile can and cannot show.** The captions are built from the images' own labels "
            "(class name, parent group, WordNet gloss), so the text tower only learns to name ten classes: "
            "these numbers check the machinery (tokenizer, locked tower, contrastive training, both zero-shot "
            "classifiers, the ImageNet class names and templates), not the paper's effect, which needs web-scale "
            "captions, B/32 and L/16 towers and 55,000 steps at batch 16,384. The ImageNet rows score a 28-px "
            "grey tower that never saw a photo on 20 real ImageNet photos against 1000 class names: a run of the "
            "full protocol's code, not a measurement.",
            "",
        ]
    for name, ds in metrics["datasets"].items():
        for clf in metrics["classifiers"]:
            tag = " (headline)" if name == head and clf == metrics["classifiers"][0] else ""
            lines += [f"### `{name}`, classifier `{clf}`{tag}", "",
                      f"{ds['images']} images ({ds['format']} `{ds['source']}`, split `{ds['split']}`), "
                      f"{ds['classes']} classes ({ds['class_names']} names), LiT seeds {', '.join(map(str, ds['seeds']))}. "
                      "Zero-shot top-1 (%).", "",
                      "| Arch | Image-tower sweep (paper steps) | conv | dpn | Δ dpn | Paper Δ (B/32, L/16) |",
                      "|---|---|---|---|---|---|"]
            for sweep, archs in summary[name][clf].items():
                steps = SWEEP_STEPS.get(sweep)
                paper_d = ", ".join(f"{float(r['dpn']['value']) - float(r['base']['value']):+.1f}"
                                    for r in _paper_rows() if r["steps"] == steps) or "—"
                for arch, e in archs.items():
                    lines.append(f"| {arch.replace('-', '/')} | `{sweep}` ({steps or '—'}) | {_cell(e.get('conv'))} | "
                                 f"{_cell(e.get('dpn'))} | {_delta(e.get('delta_dpn'))} | {paper_d} |")
            lines.append("")
    lines += ["![Table 4 figure](table4.png)", ""]
    return "\n".join(lines)


def render_figure(metrics: dict, summary: dict, path: str | Path) -> None:
    """DPN − base: the paper's printed Δ (left) and ours ± 95 % CI on the headline set (right)."""
    from dpnrepro.reports.plotting import pyplot, save_png

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), dpi=100)
    rows = _paper_rows()
    labels = [f"{r['arch']} {r['steps']}" for r in rows]
    values = [float(r["dpn"]["value"]) - float(r["base"]["value"]) for r in rows]
    axes[0].barh(range(len(labels)), values, color=["#d62728" if v >= 0 else "#444444" for v in values])
    axes[0].set_yticks(range(len(labels)), labels, fontsize=8)
    axes[0].set_title("Paper, Table 4: DPN − Base (points)")
    ours_labels, ours_vals, ours_err = [], [], []
    head = metrics["headline"]
    for clf in metrics["classifiers"]:
        for sweep, archs in summary[head][clf].items():
            for arch, e in archs.items():
                if "delta_dpn" in e:
                    ours_labels.append(f"{arch} {sweep} {clf}")
                    ours_vals.append(e["delta_dpn"]["mean"])
                    ours_err.append(e["delta_dpn"]["ci95"] or 0.0)
    axes[1].barh(range(len(ours_labels)), ours_vals, xerr=ours_err, capsize=3,
                 color=["#d62728" if v >= 0 else "#444444" for v in ours_vals])
    axes[1].set_yticks(range(len(ours_labels)), ours_labels, fontsize=8)
    axes[1].set_title(f"Ours ({metrics['profile']}, {head}): dpn − conv, 95 % CI", fontsize=10)
    finish_delta_axes(axes)
    fig.tight_layout()
    save_png(fig, path)


def build_table4(metrics_dir: str | Path = "metrics", reports_dir: str | Path = "reports") -> list[Path]:
    return report_from_metrics("table4", "lit.json", "lit_evaluate", summarize, render_markdown, render_figure,
                           lambda metrics, summary: headline.table4(summary, metrics["headline"]),
                           metrics_dir, reports_dir)
