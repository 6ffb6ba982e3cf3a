"""Write one table's report files (Markdown, PNG, JSON summary) from the metrics of its sweeps."""

from __future__ import annotations

import json
from pathlib import Path

from dpnrepro.config import SWEEPS, Params, get_sweep, sweep_config
from dpnrepro.data.prepare import PREPARED, load_manifest
from dpnrepro.errors import UserError
from dpnrepro.io import write_json_atomic, write_text_atomic
from dpnrepro.reports.tables import render_figure, render_markdown, summarize_sweep, table_sweeps


def recipe_text(params: Params, sweep: str) -> str:
    sw = get_sweep(params, sweep)
    c = sweep_config(params, sweep, sw.archs[0])
    t, i, m = c.train, c.input, c.model
    text = (f"{t.optimizer} lr {t.lr:g}, wd {t.weight_decay:g}, batch {t.batch_size}, {t.steps} steps "
            f"({t.warmup_steps} warm-up, {t.schedule}), clip {t.grad_clip:g}, {t.loss}"
            f"{f', smoothing {t.label_smoothing:g}' if t.label_smoothing else ''}, {i.image_size}px, "
            f"pool {m.pool}, posemb {m.posemb}, head bias {m.head_bias_init:g}")
    aug = [f"randaug {i.randaug}" if i.randaug else "", f"mixup {i.mixup:g}" if i.mixup else "",
           f"cutmix {i.cutmix:g}" if i.cutmix else "", f"erasing {i.random_erasing:g}" if i.random_erasing else "",
           f"repeats {i.repeated_aug}" if i.repeated_aug > 1 else "",
           f"stoch. depth {m.stoch_depth:g}" if m.stoch_depth else "", f"dropout {m.dropout:g}" if m.dropout else ""]
    aug = [a for a in aug if a]
    definition = SWEEPS[sweep]
    init = f"; fine-tuned from `{definition.init_from}`" if definition.init_from else ""
    data = ""
    if definition.dataset != "data":
        d = c.data
        data = (f"; trained on `{definition.dataset}`: {d.name} ({'multi-label, ' if d.multi_label else ''}"
                f"{d.num_classes} classes)")
    return text + (f"; {', '.join(aug)}" if aug else "; no augmentation beyond crop/flip") + init + data


def build_table(table: int, params: Params, metrics_dir: str | Path = "metrics", reports_dir: str | Path = "reports") -> list[Path]:
    metrics_dir, reports_dir = Path(metrics_dir), Path(reports_dir)
    metrics = {}
    defined = params.sweeps()
    for sweep in table_sweeps(table):
        if sweep not in defined:
            continue
        path = metrics_dir / f"{sweep}.json"
        if not path.exists():
            raise UserError(f"{path} is missing; run `dvc repro evaluate@{sweep}` first")
        metrics[sweep] = json.loads(path.read_text())
    manifest = load_manifest(PREPARED)
    hardware = sorted({r["hardware"] for m in metrics.values() for r in m["runs"].values()})
    context = {
        "profile": params.profile,
        "dataset": f"{params.data.name} (train {manifest['splits']['train']['examples']} images)",
        "val_examples": manifest["splits"]["val"]["examples"],
        "hardware": "; ".join(hardware),
        "recipes": {s: recipe_text(params, s) for s in metrics},
    }
    summaries = {s: summarize_sweep(m) for s, m in metrics.items()}
    reports_dir.mkdir(exist_ok=True)
    md, png, summary = reports_dir / f"table{table}.md", reports_dir / f"table{table}.png", metrics_dir / f"table{table}_summary.json"
    write_text_atomic(md, render_markdown(table, metrics, summaries, context))
    tmp_png = reports_dir / f".table{table}.png.tmp.png"
    render_figure(table, summaries, context, tmp_png)
    tmp_png.replace(png)
    write_json_atomic(summary, summaries)
    return [md, png, summary]
