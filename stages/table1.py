"""DVC stage `table1`: metrics/table1.json + paper numbers → reports/table1.{md,png} + metrics summary."""

import json
from pathlib import Path

from dpnrepro.cli import stage
from dpnrepro.config import load_params
from dpnrepro.data.prepare import load_manifest
from dpnrepro.io import write_json_atomic, write_text_atomic
from dpnrepro.reports.table1 import render_figure, render_markdown, summarize_runs
from dpnrepro.training.run import PREPARED


def recipe_text(params) -> str:
    t = params.train
    return (f"{t.optimizer} lr {t.lr:g}, wd {t.weight_decay:g}, batch {t.batch_size}, {t.steps} steps "
            f"({t.warmup_steps} warm-up, {t.schedule}), clip {t.grad_clip:g}, {t.loss}, "
            f"{params.input.image_size}px, head bias {params.model.head_bias_init:g}, pool {params.model.pool}")


@stage
def main() -> None:
    params = load_params()
    metrics = json.loads(Path("metrics/table1.json").read_text())
    manifest = load_manifest(PREPARED)
    hardware = sorted({r["hardware"] for r in metrics["runs"].values()})
    context = {
        "profile": metrics["profile"],
        "dataset": f"{metrics['dataset']} (train {manifest['splits']['train']['examples']} images)",
        "val_examples": manifest["splits"]["val"]["examples"],
        "hardware": "; ".join(hardware),
        "recipe": recipe_text(params),
    }
    summary = summarize_runs(metrics)
    Path("reports").mkdir(exist_ok=True)
    write_text_atomic("reports/table1.md", render_markdown(metrics, summary, context))
    tmp_png = Path("reports/.table1.png.tmp.png")
    render_figure(summary, context, tmp_png)
    tmp_png.replace("reports/table1.png")
    write_json_atomic("metrics/table1_summary.json", summary)
    print("wrote reports/table1.md, reports/table1.png, metrics/table1_summary.json")


if __name__ == "__main__":
    main()
