"""Figures 2-4 of the paper from the runs of one sweep (``figures.sweep``, Table 1's AugReg runs):

* Fig. 2 (Sec. 8.1): (a) the gradient norm of the stem and of every block, mean of the logged steps in
  the last ``last_steps`` training steps, base (conv stem) vs DPN, for ``figure2_arch``; (b) the stem's
  gradient norm over training. Read from the trainer's dvclive logs
  (``runs/<sweep>/<run>/dvclive/plots/metrics/grad_norm/<layer>.tsv``, logged before clipping).
* Fig. 4 (appendix H): (a) for each of ``figure4_archs``.
* Fig. 3 (Sec. 8.2): the scale of DPN's first LayerNorm (on the patch pixels) as a patch × patch image
  per channel, from the DPN run of ``figure3_arch``, read from its weights file (:func:`first_ln_scale`:
  what :func:`dpnrepro.models.first_ln_scale_image` gives for the rebuilt model, without torch or timm).

Base and DPN are averaged over the seeds both have (the summary also holds the 95 % t-interval); everything is
computed from files only, so the outputs are byte-identical for the same runs.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from dpnrepro.artifacts import read_config
from dpnrepro.config.figures import FiguresParams
from dpnrepro.errors import CheckpointError, UserError
from dpnrepro.io import write_json_atomic, write_text_atomic
from dpnrepro.reports import headline
from dpnrepro.reports.plotting import pyplot, save_png
from dpnrepro.stats import mean_ci95

BASE, DPN = "conv", "dpn"
_COLORS = {BASE: "black", DPN: "#d62728"}
_LABELS = {BASE: "Base (conv stem)", DPN: "DPN"}
GRAD_DIR = Path("dvclive/plots/metrics/grad_norm")
FIRST_NORM_WEIGHT = "patch_embed.norm_in.weight"  # the stem's norm on the patch pixels (models/stems.py)


def read_grad_norms(run_path: Path) -> dict[str, dict[int, float]]:
    """{layer: {step: norm}} from a run's dvclive logs (layers: ``stem``, ``block_00``, ...)."""
    folder = Path(run_path) / GRAD_DIR
    sweep, run = Path(run_path).parts[-2:]
    if not folder.is_dir():  # a run directory written without its curves (before restores kept them)
        raise UserError(f"{folder} is missing: the run has no gradient-norm logs. Retrain it without its resume "
                        f"state: `rm -rf checkpoints/{sweep}/{run} && dvc repro -f -s train-{sweep} && dvc repro`")
    def restore(tsv: Path) -> str:
        from dpnrepro.restore import restore_command

        return f"restore it with {restore_command(tsv, f'train-{sweep}')} or retrain it (`dvc repro -f -s train-{sweep}`)"

    out = {}
    for tsv in sorted(folder.glob("*.tsv")):
        series = {}
        for line, row in enumerate(csv.DictReader(io.StringIO(tsv.read_text()), delimiter="\t"), start=2):
            try:
                series[int(row["step"])] = float(row[tsv.stem])
            except (KeyError, TypeError, ValueError):
                raise UserError(f"{tsv} is truncated or malformed at line {line}; {restore(tsv)}") from None
        out[tsv.stem] = series
    last = {layer: max(series, default=-1) for layer, series in out.items()}
    short = sorted(layer for layer, step in last.items() if step < max(last.values(), default=-1))
    if short:
        raise UserError(f"{folder / short[0]}.tsv ends at step {last[short[0]]}, the run's other layers at step "
                        f"{max(last.values())}: the file is truncated; {restore(folder / (short[0] + '.tsv'))}")
    return out


def first_ln_scale(run_path: Path):
    """The ``(p, p, C)`` float32 array of a run's first-norm scale (row, column, channel: the patch pixels'
    flattening order), read from ``model.safetensors`` with the patch size and channels of its spec."""
    from dpnrepro.artifacts import MODEL_FILE, read_spec, read_weights
    from dpnrepro.model_spec import parse_arch

    spec, weights = read_spec(run_path), Path(run_path) / MODEL_FILE
    patch = parse_arch(spec.arch)[1]
    scale = read_weights(weights, keys=[FIRST_NORM_WEIGHT], framework="numpy").get(FIRST_NORM_WEIGHT)
    if scale is None or scale.shape != (patch * patch * spec.in_chans,):
        raise CheckpointError(f"{weights} holds no {FIRST_NORM_WEIGHT} of {patch * patch * spec.in_chans} values "
                              f"({spec.arch}, {spec.in_chans} channels, stem {spec.stem})")
    return scale.reshape(patch, patch, spec.in_chans)


def _layer_order(layer: str) -> tuple:
    return (layer != "stem", layer)


def layer_label(layer: str) -> str:
    return "stem" if layer == "stem" else f"Block: {int(layer.split('_')[1])}"


def sweep_runs(sweep_dir: Path) -> list[dict]:
    """Every run of the sweep directory: {path, arch, stem, seed, steps}."""
    runs = []
    for path in sorted(p for p in Path(sweep_dir).iterdir() if (p / "config.json").exists()):
        cfg = read_config(path)
        runs.append({"path": path, "arch": cfg["arch"], "stem": cfg["stem"], "seed": cfg["seed"],
                     "steps": cfg["train"]["steps"]})
    if not runs:
        raise UserError(f"{sweep_dir} holds no runs; run `dvc repro train-{Path(sweep_dir).name}` first")
    return runs


def _pairs(runs: list[dict], arch: str) -> dict[str, dict[int, dict]]:
    """{stem: {seed: run}} of base and DPN for ``arch``, on the seeds both have."""
    by = {stem: {r["seed"]: r for r in runs if r["arch"] == arch and r["stem"] == stem} for stem in (BASE, DPN)}
    seeds = sorted(set(by[BASE]) & set(by[DPN]))
    if not seeds:
        raise UserError(f"no seed has both a {BASE} and a {DPN} run of {arch}")
    return {stem: {s: by[stem][s] for s in seeds} for stem in (BASE, DPN)}


def depth_profile(runs: list[dict], arch: str, last_steps: int) -> dict:
    """{layers, seeds, last_steps, <stem>: {layer: {mean, ci95}}}: per seed the mean of the logged
    gradient norms at steps > steps − last_steps, then mean ± 95 % CI over seeds."""
    pairs = _pairs(runs, arch)
    out: dict = {"seeds": sorted(pairs[BASE]), "last_steps": last_steps}
    layers = None
    for stem, by_seed in pairs.items():
        per_layer: dict[str, list[float]] = {}
        for run in by_seed.values():
            norms = read_grad_norms(run["path"])
            for layer, series in norms.items():
                tail = [v for step, v in sorted(series.items()) if step > run["steps"] - last_steps]
                if not tail:
                    raise UserError(f"{run['path']}: no gradient norm logged in the last {last_steps} steps; "
                                    "raise figures.last_steps or lower runtime.log_every")
                per_layer.setdefault(layer, []).append(sum(tail) / len(tail))
        layers = sorted(per_layer, key=_layer_order)
        out[stem] = {}
        for layer in layers:
            mean, ci = mean_ci95(per_layer[layer])
            out[stem][layer] = {"mean": mean, "ci95": ci, "seeds": per_layer[layer]}
    out["layers"] = layers
    return out


def embedding_curve(runs: list[dict], arch: str) -> dict:
    """{steps, <stem>: [mean over seeds of the stem's gradient norm at each logged step]}."""
    pairs = _pairs(runs, arch)
    out: dict = {"seeds": sorted(pairs[BASE])}
    steps = None
    for stem, by_seed in pairs.items():
        series = [read_grad_norms(r["path"])["stem"] for r in by_seed.values()]
        common = sorted(set.intersection(*(set(s) for s in series)))
        steps = common if steps is None else sorted(set(steps) & set(common))
        out[stem] = {step: sum(s[step] for s in series) / len(series) for step in common}
    out["steps"] = steps
    for stem in (BASE, DPN):
        out[stem] = [out[stem][s] for s in steps]
    return out


# ---------------------------------------------------------------------------------------------------
# Rendering


def _depth_axes(ax, profile: dict, title: str) -> None:
    layers = profile["layers"]
    width = 0.4
    for k, stem in enumerate((BASE, DPN)):
        xs = [i + (k - 0.5) * width for i in range(len(layers))]
        ax.bar(xs, [profile[stem][l]["mean"] for l in layers], width=width, color=_COLORS[stem], label=_LABELS[stem],
               alpha=0.85)
        for x, l in zip(xs, layers):  # each seed's value (a t-interval over 2-3 seeds would dwarf the bars)
            vals = profile[stem][l]["seeds"]
            ax.plot([x] * len(vals), vals, ls="none", marker="o", ms=3.5, mfc="white", mec="0.35", zorder=3,
                    label="one seed" if (stem == DPN and l == layers[0]) else None)
    ax.set_xticks(range(len(layers)), [layer_label(l) for l in layers], rotation=90 if len(layers) > 6 else 0)
    ax.set_ylabel("Gradient norm")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def render_figure2(profile: dict, curve: dict, arch: str, label: str, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=100)
    _depth_axes(axes[0], profile, f"(a) {arch}: gradient norm vs depth, mean of the last {profile['last_steps']} "
                                  f"steps\n{label}")
    for stem in (BASE, DPN):
        axes[1].plot(curve["steps"], curve[stem], color=_COLORS[stem], label=_LABELS[stem], lw=1.5, marker=".")
    axes[1].set_xlabel("Number of steps")
    axes[1].set_ylabel("Gradient norm of the embedding layer (stem)")
    axes[1].set_title(f"(b) {arch}: stem gradient norm during training (mean over seeds)", fontsize=10)
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)


def render_figure4(profiles: dict[str, dict], label: str, path: Path) -> None:
    plt = pyplot()
    n = len(profiles)
    fig, axes = plt.subplots(1, n, figsize=(max(6, 5.5 * n), 4.5), dpi=100, squeeze=False)
    for ax, (arch, profile) in zip(axes[0], profiles.items()):
        _depth_axes(ax, profile, f"{arch}: gradient norm vs depth, last {profile['last_steps']} steps\n{label}")
    fig.tight_layout()
    save_png(fig, path)


def render_figure3(scale, arch: str, label: str, path: Path) -> None:
    """One heat map per channel of the (p, p, C) scale image, with its own colour scale."""
    plt = pyplot()
    p, _, channels = scale.shape
    names = ["R", "G", "B"] if channels == 3 else [f"channel {c}" for c in range(channels)]
    fig, axes = plt.subplots(1, channels, figsize=(max(6.4, 4.6 * channels + 0.6), 5.0), dpi=100, squeeze=False)
    for c, ax in enumerate(axes[0]):
        im = ax.imshow(scale[:, :, c], cmap="viridis", interpolation="nearest")
        ax.set_title(f"{arch}: {names[c]}", fontsize=10)
        ax.set_xlabel("patch column")
        ax.set_ylabel("patch row")
        ticks = list(range(0, p, max(1, p // 8)))
        ax.set_xticks(ticks, [str(t + 1) for t in ticks])
        ax.set_yticks(ticks, [str(t + 1) for t in ticks])
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(f"Scale of DPN's first LayerNorm (on the patch pixels)\n{label}", fontsize=10)
    fig.tight_layout()
    save_png(fig, path)


def _label(runs: list[dict], arch: str, seeds: list[int]) -> str:
    cfg = read_config(next(r["path"] for r in runs if r["arch"] == arch))
    return f"profile {cfg['profile']}, {cfg['train']['steps']} steps, seeds {', '.join(map(str, seeds))}"


def _csv(rows: list[list], header: list[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def build_figures(fig_params: FiguresParams, runs_root: str | Path = "runs", reports_dir: str | Path = "reports",
                  metrics_dir: str | Path = "metrics") -> list[Path]:
    """reports/figure{2,3,4}.{md,png}, metrics/figures_summary.json and the dvc-plots CSVs of Fig. 2."""
    from dpnrepro.artifacts import read_summary

    reports_dir, metrics_dir = Path(reports_dir), Path(metrics_dir)
    sweep_dir = Path(runs_root) / fig_params.sweep
    runs = sweep_runs(sweep_dir)
    last = fig_params.last_steps
    written = []
    reports_dir.mkdir(exist_ok=True)
    hardware = "; ".join(sorted({read_summary(r["path"])["hardware"] for r in runs}))

    # Figure 2
    arch2 = fig_params.figure2_arch
    prof2, curve = depth_profile(runs, arch2, last), embedding_curve(runs, arch2)
    label2 = _label(runs, arch2, prof2["seeds"])
    render_figure2(prof2, curve, arch2, label2, reports_dir / "figure2.png")
    stem_ratio = prof2[DPN]["stem"]["mean"] / prof2[BASE]["stem"]["mean"]
    write_text_atomic(reports_dir / "figure2.md", "\n".join([
        "# Figure 2: gradient norms with and without DPN",
        "",
        f"Generated by `dvc repro figures` from the dvclive logs of `runs/{fig_params.sweep}` ({label2}; "
        f"hardware: {hardware}); do not edit by hand.",
        "",
        f"The paper (Sec. 8.1) shows B/16 on ImageNet-1k: the base ViT's patch-embedding gradient norm is "
        f"disproportionately large, DPN scales it down, before and throughout training. Ours: {arch2}, "
        f"(a) mean of the gradient norms logged in the last {last} steps (global-norm before clipping, per "
        f"layer group: the stem is `patch_embed` plus the `post_posemb` stem's `norm_pre`), bars the mean "
        f"over seeds, dots each seed; (b) the stem's gradient norm at every logged step, mean over seeds.",
        "",
        f"Stem gradient norm, DPN / base: {stem_ratio:.3f} (last {last} steps). The paper prints no numbers "
        "for this figure.",
        "",
        "| layer | base | DPN |",
        "|---|---|---|",
        *[f"| {layer_label(l)} | {prof2[BASE][l]['mean']:.4f} | {prof2[DPN][l]['mean']:.4f} |" for l in prof2["layers"]],
        "",
        "![Figure 2](figure2.png)",
        "",
    ]))
    write_text_atomic(metrics_dir / "figure2_depth.csv", _csv(
        [[layer_label(l), prof2[BASE][l]["mean"], prof2[DPN][l]["mean"]] for l in prof2["layers"]], ["layer", "base", "dpn"]))
    write_text_atomic(metrics_dir / "figure2_embedding.csv", _csv(
        [[s, b, d] for s, b, d in zip(curve["steps"], curve[BASE], curve[DPN])], ["step", "base", "dpn"]))
    written += [reports_dir / "figure2.md", reports_dir / "figure2.png"]

    # Figure 4
    profiles4 = {a: depth_profile(runs, a, last) for a in fig_params.figure4_archs}
    label4 = "; ".join(f"{a}: {_label(runs, a, p['seeds'])}" for a, p in profiles4.items())
    render_figure4(profiles4, _label(runs, fig_params.figure4_archs[0], profiles4[fig_params.figure4_archs[0]]["seeds"]),
                   reports_dir / "figure4.png")
    write_text_atomic(reports_dir / "figure4.md", "\n".join([
        "# Figure 4: gradient norm vs depth for the other architectures (appendix H)",
        "",
        f"Generated by `dvc repro figures` from the dvclive logs of `runs/{fig_params.sweep}` ({label4}; "
        f"hardware: {hardware}); do not edit by hand. As Figure 2 (a): mean of the last {last} steps, bars "
        "the mean over seeds, dots each seed. The paper shows B/32, S/32 and S/16.",
        "",
        *[f"- {a}: stem gradient norm DPN / base = {p[DPN]['stem']['mean'] / p[BASE]['stem']['mean']:.3f}"
          for a, p in profiles4.items()],
        "",
        "![Figure 4](figure4.png)",
        "",
    ]))
    written += [reports_dir / "figure4.md", reports_dir / "figure4.png"]

    # Figure 3
    arch3 = fig_params.figure3_arch
    dpn_runs = sorted((r for r in runs if r["arch"] == arch3 and r["stem"] == DPN), key=lambda r: r["seed"])
    if not dpn_runs:
        raise UserError(f"no {DPN} run of {arch3} in {sweep_dir} for Figure 3")
    run3 = dpn_runs[0]
    scale = first_ln_scale(run3["path"])
    label3 = f"{run3['path'].name}, {_label(runs, arch3, [run3['seed']])}"
    render_figure3(scale, arch3, label3, reports_dir / "figure3.png")
    write_text_atomic(reports_dir / "figure3.md", "\n".join([
        "# Figure 3: scale parameters of DPN's first LayerNorm",
        "",
        f"Generated by `dvc repro figures` from `runs/{fig_params.sweep}/{run3['path'].name}` ({label3}; "
        f"hardware: {hardware}); do not edit by hand.",
        "",
        "The first LayerNorm of DPN acts on the raw pixels of a patch, flattened row, column, channel "
        "(channel fastest; tests/test_figures.py proves that a pixel lands on its place in the image), so "
        "its scale is shown as a patch × patch image per channel. The paper (Sec. 8.2; Ti/16 on ImageNet, "
        "L/16 on JFT) sees larger weights at the centre and the corners of the patch.",
        "",
        f"Scale range: {scale.min():.4f} to {scale.max():.4f} (init 1).",
        "",
        "![Figure 3](figure3.png)",
        "",
    ]))
    written += [reports_dir / "figure3.md", reports_dir / "figure3.png"]

    summary = {
        "sweep": fig_params.sweep, "last_steps": last,
        "figure2": {"arch": arch2, "depth": prof2, "embedding": curve, "stem_ratio_dpn_over_base": stem_ratio},
        "figure4": profiles4,
        "figure3": {"run": run3["path"].name, "scale": scale.tolist()},
    }
    write_json_atomic(metrics_dir / "figures_summary.json", summary)
    headline.write_headline("figures", headline.figures(summary), metrics_dir)
    return written + [metrics_dir / "figures_summary.json"]
