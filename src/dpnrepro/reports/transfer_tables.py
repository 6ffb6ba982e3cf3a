"""Tables 3 (VTAB-1k) and 7 (Sun397 from scratch): the paper's printed numbers next to ours, as Markdown,
a PNG figure and a JSON summary, computed from ``metrics/vtab.json`` / ``metrics/sun397_scratch.json``
and ``reports/paper/table{3,7}.yaml`` alone (byte-identical outputs for the same inputs).

Table 3 statistics: per task, mean test accuracy ± 95 % t-interval over the fine-tuning seeds of the lr
chosen on validation; DPN − base paired by fine-tuning seed within each pretrained pair
(``vtab.init_seed``) and judged over the pretrained pairs by :func:`stats.paired_by_pretraining` (better /
worse when the interval excludes 0 over at least ``stats.MIN_PAIRS`` independently pretrained pairs; the
paper bolds differences outside its 95 % CI). Fine-tuning seeds of one pretrained pair narrow its estimate
and are never counted as training runs. Group means average the tasks of a group per seed, then take
mean ± CI over seeds. Table 7 trains one model per row (as the paper): no interval.
"""

from __future__ import annotations

from pathlib import Path

from dpnrepro.reports import headline
from dpnrepro.reports.paper import load_paper_table
from dpnrepro.reports.plotting import finish_delta_axes, pyplot, read_metrics, save_png, write_report
from dpnrepro.stats import (LEARNED_MARGIN, MIN_PAIRS, fmt_ci, learned_cell, learned_delta, mean_ci95,
                           paired_by_pretraining, paired_test, verdict_text)

BASE_STEM = "conv"
GROUPS = ("natural", "specialized", "structured")
PAPER_ARCHS = ("B/32", "B/16")
METRICS = {3: "vtab", 7: "sun397_scratch"}


def _stems(stems) -> list[str]:
    return sorted(stems, key=lambda s: (s != BASE_STEM, s))


def _delta(d: dict | None) -> str:
    if d is None:
        return "—"
    return f"{d['mean']:+.2f}" + (f" ± {d['ci95']:.3f}" if d["ci95"] is not None else "")


# ---------------------------------------------------------------------------------------------------
# Table 3


def paper_table3() -> dict:
    """{arch: {dataset: {base, dpn}}} (floats) and the paper's dataset order per group."""
    paper = load_paper_table(3)
    values: dict = {}
    for r in paper["rows"]:
        values.setdefault(r["arch"], {}).setdefault(r["dataset"], {})[r["variant"]] = float(r["value"])
    return {"values": values, "datasets": paper["datasets"], "title": paper["title"], "source": paper["source"]}


def summarize_vtab(metrics: dict) -> dict:
    """Per task and arch: each stem's mean ± CI of test accuracy over seeds, chosen lr, whether it learned
    (:func:`stats.learned` against the test split's majority-class rate), and the paired stem − base delta;
    per group and arch the same over the per-seed group means (learned when each of its tasks did)."""
    tasks, per_seed, per_group = {}, {}, {}
    for name, entry in metrics["tasks"].items():
        by_arch: dict = {}
        for run in entry["runs"].values():
            mean, ci = mean_ci95(run["test"])
            cell = by_arch.setdefault(run["arch"], {})[run["stem"]] = {
                "mean": mean, "ci95": ci, "n": len(run["test"]), "lr": run["lr"], "test": run["test"],
                "val_by_lr": {lr: mean_ci95(v)[0] for lr, v in run["val"].items()}, "trained_on": run["trained_on"],
                **learned_cell(run["test"], entry["majority_test"])}
            for seed, acc in zip(metrics["seeds"], run["test"]):
                per_seed.setdefault((entry["group"], run["arch"], run["stem"]), {}).setdefault(seed, []).append(acc)
            per_group.setdefault((entry["group"], run["arch"], run["stem"]), []).append(cell)
        for arch, stems in by_arch.items():
            _add_deltas(stems, metrics["init_seed"], metrics["seeds"])
        tasks[name] = {"group": entry["group"], "stand_in": entry["stand_in"], "archs": by_arch,
                       "chance": entry["majority_test"]}
    groups: dict = {}
    for (group, arch, stem), seeds in sorted(per_seed.items()):
        accs = [sum(v) / len(v) for _, v in sorted(seeds.items())]
        mean, ci = mean_ci95(accs)
        cells = per_group[group, arch, stem]
        groups.setdefault(group, {}).setdefault(arch, {})[stem] = {
            "mean": mean, "ci95": ci, "n": len(accs), "test": accs,
            "tasks": len(next(iter(seeds.values()))),
            "chance": sum(c["chance"] for c in cells) / len(cells), "learned": all(c["learned"] for c in cells)}
    for archs in groups.values():
        for stems in archs.values():
            _add_deltas(stems, metrics["init_seed"], sorted(metrics["seeds"]))
    return {"tasks": tasks, "groups": groups}


def _add_deltas(stems: dict, init_seed: int, seeds: list[int]) -> None:
    """stem − base of each stem, paired by fine-tuning seed (``seeds``, in the order of the cells' ``test``)
    within the one pretrained pair ``init_seed`` fine-tunes (:func:`stats.paired_by_pretraining`)."""
    if BASE_STEM not in stems:
        return
    for stem in [s for s in stems if s != BASE_STEM and not s.startswith("delta_")]:
        treated, control = ({(init_seed, seed): v for seed, v in zip(seeds, stems[s]["test"], strict=True)}
                            for s in (stem, BASE_STEM))
        stems[f"delta_{stem}"] = {**paired_by_pretraining(treated, control, repeats="fine-tuning seeds"),
                                  "vs": BASE_STEM, **learned_delta({s: stems[s] for s in (BASE_STEM, stem)})}


def render_table3(metrics: dict, summary: dict) -> str:
    paper = paper_table3()
    order = [d for g in GROUPS for d in paper["datasets"][g]]
    lines = [f"# Table 3: {paper['title']}", "",
             "Generated by `dvc repro table3` from `metrics/vtab.json` and `reports/paper/table3.yaml`; do not edit.", "",
             f"## Paper ({paper['source']})", "",
             "VTAB-1k test accuracy (%), mean over 3 seeds of the lr chosen on val200 (no intervals printed). "
             "Δ = DPN − base and the group means are derived here from the printed values.", "",
             "| Group | Task | B/32 | + DPN | Δ | B/16 | + DPN | Δ |", "|---|---|---|---|---|---|---|---|"]
    for g in GROUPS:
        for d in paper["datasets"][g]:
            cells = []
            for arch in PAPER_ARCHS:
                v = paper["values"][arch][d]
                cells += [f"{v['base']:.1f}", f"{v['dpn']:.1f}", f"{v['dpn'] - v['base']:+.1f}"]
            lines.append(f"| {g} | {d} | " + " | ".join(cells) + " |")
    for g in GROUPS:
        cells = []
        for arch in PAPER_ARCHS:
            vals = [paper["values"][arch][d] for d in paper["datasets"][g]]
            b, p = (sum(v[k] for v in vals) / len(vals) for k in ("base", "dpn"))
            cells += [f"{b:.1f}", f"{p:.1f}", f"{p - b:+.1f}"]
        lines.append(f"| **{g} mean** | | " + " | ".join(cells) + " |")

    stems = _stems({s for t in summary["tasks"].values() for a in t["archs"].values() for s in a
                    if not s.startswith("delta_")})
    others = [s for s in stems if s != BASE_STEM]
    archs = sorted({a for t in summary["tasks"].values() for a in t["archs"]})
    lines += ["", f"## Ours (profile `{metrics['profile']}`, measured by this pipeline)", "",
              f"- Fine-tuned from `runs/{metrics['init_from']}/<arch>_<stem>_s{metrics['init_seed']}`; recipe: "
              f"{metrics['recipe']}.",
              f"- lr grid {metrics['lrs']} × seeds {metrics['seeds']}; lr chosen by mean val200 accuracy (test never "
              f"used to choose); test accuracy (%) of the chosen lr, mean ± 95 % CI (Student t) over the seeds; "
              f"final models trained on `{'train800val200' if metrics['retrain_on_train800val200'] else 'train800'}` "
              f"(`vtab.retrain_on_train800val200`).",
              f"- Δ = stem − {BASE_STEM}, paired by fine-tuning seed within each pretrained pair and averaged "
              f"over those seeds; **bold** = a verdict (better / worse): the 95 % CI of Δ excludes 0 over at least "
              f"{MIN_PAIRS} independently pretrained pairs (the paper's Sec. 5.1 reports >= 3 runs). Fine-tuning "
              "seeds of one pretrained pair narrow its estimate but are not independent training runs: with one "
              "pretrained pair (`vtab.init_seed`) the ± is their spread and every Δ is not resolved "
              "(1 pretraining run). "
              "`chance` = the test split's majority-class rate; *at chance* marks a mean less than "
              f"{LEARNED_MARGIN:g} points above it (the fine-tune learned nothing: no verdict on its Δ).",
              f"- Hardware: {metrics['hardware']}.", ""]
    for arch in archs:
        lines += [f"### {arch}", "",
                  "| Group | Task (data) | chance | " + " | ".join(f"{s} (lr)" for s in stems) + " | "
                  + " | ".join(f"Δ {s}" for s in others) + " | Paper Δ B/32, B/16 |",
                  "|---|---|---|" + "---|" * (len(stems) + len(others) + 1)]
        ordered = sorted(summary["tasks"].items(), key=lambda kv: order.index(kv[0]))
        for name, t in ordered:
            e = t["archs"].get(arch, {})
            cells = [f"{fmt_ci(e[s]['mean'], e[s]['ci95'], 2)} ({e[s]['lr']:g}){_at_chance(e[s])}" if s in e else "—"
                     for s in stems]
            deltas = [_bold(e.get(f"delta_{s}")) for s in others]
            pd = " , ".join(f"{paper['values'][a][name]['dpn'] - paper['values'][a][name]['base']:+.1f}"
                            for a in PAPER_ARCHS)
            data = f"{name} ({t['stand_in']})" if t["stand_in"] else name
            chance = "—" if t.get("chance") is None else f"{t['chance']:.1f}"
            lines.append(f"| {t['group']} | {data} | {chance} | " + " | ".join(cells + deltas) + f" | {pd} |")
        for g in GROUPS:
            e = summary["groups"].get(g, {}).get(arch)
            if not e:
                continue
            n = next(v["tasks"] for k, v in e.items() if not k.startswith("delta_"))
            cells = [fmt_ci(e[s]["mean"], e[s]["ci95"], 2) if s in e else "—" for s in stems]
            deltas = [_bold(e.get(f"delta_{s}")) for s in others]
            lines.append(f"| **{g} mean** | {n} task{'s' if n > 1 else ''} | | " + " | ".join(cells + deltas) + " | |")
        lines.append("")
    decided = [f"{name} ({a}): {d['verdict']}" for name, t in summary["tasks"].items() for a, e in t["archs"].items()
               for k, d in e.items() if k.startswith("delta_") and _decided(d)]
    why = sorted({verdict_text(d) for t in summary["tasks"].values() for e in t["archs"].values()
                  for k, d in e.items() if k.startswith("delta_") and d.get("why")})
    lines += [f"Verdicts (95 % CI of Δ excludes 0, >= {MIN_PAIRS} independently pretrained pairs, both sides "
              f"learned): {', '.join(decided) if decided else 'none'}"
              + (f"; {' / '.join(why)} for the others" if why and decided else f": {' / '.join(why)}" if why else "")
              + ".", "",
              "![Table 3 figure](table3.png)", ""]
    return "\n".join(lines)


def _at_chance(cell: dict) -> str:
    return " *at chance*" if cell.get("learned") is False else ""


def _decided(d: dict | None) -> bool:
    """Whether a Δ carries a verdict: better / worse from :func:`stats.paired_test`, and both sides learned."""
    return d is not None and d["verdict"] != "not resolved" and d.get("learned") is not False


def _bold(d: dict | None) -> str:
    text = _delta(d)
    return f"**{text}**" if _decided(d) else text


def figure_table3(summary: dict, metrics: dict, path: Path) -> None:
    plt = pyplot()
    paper = paper_table3()
    order = [d for g in GROUPS for d in paper["datasets"][g]]
    fig, axes = plt.subplots(1, 2, figsize=(12, 6), dpi=100)
    y = range(len(order))
    for k, arch in enumerate(PAPER_ARCHS):
        vals = [paper["values"][arch][d]["dpn"] - paper["values"][arch][d]["base"] for d in order]
        axes[0].barh([i + 0.4 * k - 0.2 for i in y], vals, height=0.4, label=arch)
    axes[0].set_yticks(list(y), order, fontsize=7)
    axes[0].set_title("Paper, Table 3: DPN − base (points)")
    axes[0].legend(fontsize=7)
    names = [d for d in order if d in summary["tasks"]]
    labels, vals, errs, colors = [], [], [], []
    for name in names:
        for arch, e in summary["tasks"][name]["archs"].items():
            for key, d in e.items():
                if key.startswith("delta_"):
                    stand_in = summary["tasks"][name]["stand_in"]
                    labels.append(f"{name} {arch} {key[6:]}" + (f"\n({stand_in[:28]})" if stand_in else ""))
                    vals.append(d["mean"])
                    errs.append(d["ci95"] or 0.0)
                    colors.append("#d62728" if _decided(d) else "#999999")
    axes[1].barh(range(len(labels)), vals, xerr=errs, capsize=3, color=colors)
    axes[1].set_yticks(range(len(labels)), labels, fontsize=6)
    axes[1].set_title(f"Ours ({metrics['profile']}): stem − {BASE_STEM} ± 95 % CI\n"
                      f"(red: a verdict, the CI excludes 0 over >= {MIN_PAIRS} pretrained pairs)", fontsize=9)
    finish_delta_axes(axes)
    fig.tight_layout()
    save_png(fig, path)


# ---------------------------------------------------------------------------------------------------
# Table 7

SETTINGS = ("from scratch", "+ Augmentation", "+ Train Longer")


def paper_table7() -> dict:
    paper = load_paper_table(7)
    values: dict = {}
    for r in paper["rows"]:
        values.setdefault(r["arch"], {}).setdefault(r["setting"], {})[r["variant"]] = float(r["value"])
    return {"values": values, "title": paper["title"], "source": paper["source"]}


def summarize_scratch(metrics: dict) -> dict:
    """Per arch, stem and setting: test and val accuracy, hparams and whether it learned (:func:`stats.learned`
    against the test split's majority-class rate); per setting the DPN − base difference (one run each)."""
    out: dict = {}
    for run in metrics["runs"].values():
        rows = {r["setting"]: {"test": r["test"], "val": r["val"], "hparams": r["hparams"],
                               **learned_cell(r["test"], metrics["majority_test"])} for r in run["rows"]}
        out.setdefault(run["arch"], {})[run["stem"]] = rows
    for stems in out.values():
        if BASE_STEM in stems:
            for stem in [s for s in stems if s != BASE_STEM]:
                stems[f"delta_{stem}"] = {s: {**paired_test([stems[stem][s]["test"]], [stems[BASE_STEM][s]["test"]],
                                                            training_pairs=1),
                                              **learned_delta({b: stems[b][s] for b in (BASE_STEM, stem)})}
                                          for s in SETTINGS}
    return out


def _hp(hp: dict) -> str:
    names = {"lr": "lr", "weight_decay": "wd", "dropout": "dropout", "mixup": "mixup",
             "randaug_magnitude": "RA m", "steps": "steps"}
    return ", ".join(f"{names[k]} {v:g}" for k, v in hp.items())


def render_table7(metrics: dict, summary: dict) -> str:
    paper = paper_table7()
    lines = [f"# Table 7: {paper['title']}", "",
             "Generated by `dvc repro table7` from `metrics/sun397_scratch.json` and `reports/paper/table7.yaml`; "
             "do not edit.", "", f"## Paper ({paper['source']})", "",
             "Sun397 test accuracy (%), one model per row (no intervals printed); Δ derived here.", "",
             "| Setting | B/32 | + DPN | Δ | B/16 | + DPN | Δ |", "|---|---|---|---|---|---|---|"]
    for s in SETTINGS:
        cells = []
        for arch in PAPER_ARCHS:
            v = paper["values"][arch][s]
            cells += [f"{v['base']:.1f}", f"{v['dpn']:.1f}", f"{v['dpn'] - v['base']:+.1f}"]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    ex = metrics["examples"]
    data = (f"{metrics['stand_in']} standing in for Sun397" if metrics["stand_in"] else "Sun397")
    lines += ["", f"## Ours (profile `{metrics['profile']}`, measured by this pipeline)", "",
              f"- Data: {data}; train {ex['train']}, val {ex['val']}, test {ex['test']} images (the Sun397 adapter's "
              "full splits).",
              f"- Recipe: {metrics['recipe']}; seed {metrics['seed']}, one model per row as the paper.",
              f"- Chance: {metrics['majority_test']:.1f} % (the test split's majority class); *at chance* marks a "
              f"row less than {LEARNED_MARGIN:g} points above it (no verdict on its Δ).",
              f"- Search (appendix F), per arch and stem: step 1 over {len(metrics['grid'])} settings "
              f"(lr × weight decay × dropout), step 2 over {len(metrics['aug_grid'])} (mixup × RandAugment "
              f"magnitude) with step 1's winner, step 3 the winner for {metrics['longer']['steps']} steps. Each "
              "step chosen on validation accuracy; test accuracy reported per row.",
              f"- Hardware: {metrics['hardware']}.", ""]
    for arch, stems in summary.items():
        names = _stems([s for s in stems if not s.startswith("delta_")])
        others = [s for s in names if s != BASE_STEM]
        lines += [f"### {arch}", "", "| Setting | " + " | ".join(f"{s} test (val)" for s in names) + " | "
                  + " | ".join(f"Δ {s}" for s in others) + " | chosen hparams | Paper Δ B/32, B/16 |",
                  "|---|" + "---|" * (len(names) + len(others) + 2)]
        for s in SETTINGS:
            cells = [f"{stems[n][s]['test']:.2f} ({stems[n][s]['val']:.2f}){_at_chance(stems[n][s])}" for n in names]
            deltas = [f"{stems[f'delta_{o}'][s]['mean']:+.2f}" if f"delta_{o}" in stems else "—" for o in others]
            hps = "; ".join(f"{n}: {_hp(stems[n][s]['hparams'])}" for n in names)
            pd = ", ".join(f"{paper['values'][a][s]['dpn'] - paper['values'][a][s]['base']:+.1f}" for a in PAPER_ARCHS)
            lines.append(f"| {s} | " + " | ".join(cells + deltas) + f" | {hps} | {pd} |")
        lines.append("")
    lines += ["![Table 7 figure](table7.png)", ""]
    return "\n".join(lines)


def figure_table7(summary: dict, metrics: dict, path: Path) -> None:
    plt = pyplot()
    paper = paper_table7()
    fig, axes = plt.subplots(1, len(PAPER_ARCHS) + len(summary), figsize=(4 * (2 + len(summary)), 3.8), dpi=100)
    x = range(len(SETTINGS))
    for ax, arch in zip(axes, PAPER_ARCHS):
        for k, v in enumerate(("base", "dpn")):
            ax.bar([i + 0.4 * k - 0.2 for i in x], [paper["values"][arch][s][v] for s in SETTINGS], width=0.4, label=v)
        ax.set_title(f"Paper {arch}")
    for ax, (arch, stems) in zip(axes[len(PAPER_ARCHS):], summary.items()):
        names = _stems([s for s in stems if not s.startswith("delta_")])
        w = 0.8 / len(names)
        for k, n in enumerate(names):
            ax.bar([i + w * k - 0.4 + w / 2 for i in x], [stems[n][s]["test"] for s in SETTINGS], width=w, label=n)
        ax.set_title(f"Ours {arch} ({metrics['profile']})")
    for ax in axes:
        ax.set_xticks(list(x), ["scratch", "+aug", "+longer"])
        ax.set_ylabel("test accuracy (%)")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_png(fig, path)


# ---------------------------------------------------------------------------------------------------


HEADLINES = {3: headline.table3, 7: headline.table7}
BUILD = {3: (summarize_vtab, render_table3, figure_table3), 7: (summarize_scratch, render_table7, figure_table7)}


def build_transfer_table(table: int, metrics_dir: str | Path = "metrics", reports_dir: str | Path = "reports") -> list[Path]:
    metrics_dir, reports_dir = Path(metrics_dir), Path(reports_dir)
    metrics = read_metrics(metrics_dir / f"{METRICS[table]}.json", METRICS[table])
    summarize, render, figure = BUILD[table]
    summary = summarize(metrics)
    return write_report(f"table{table}", render(metrics, summary), lambda png: figure(summary, metrics, png), summary,
                        headline=HEADLINES[table](summary), metrics_dir=metrics_dir, reports_dir=reports_dir)
