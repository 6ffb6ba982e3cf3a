"""dvc.yaml, generated: one definition of the sweeps (:data:`dpnrepro.config.sweeps.SWEEPS`) and code deps
derived from what each stage really imports.

``python -m dpnrepro.pipeline`` rewrites dvc.yaml (the paper), benchmarks/dvc.yaml (timings) and study/dvc.yaml
(the powered study); ``--check`` exits 1 when the committed file differs
(tests/test_pipeline_contract.py runs it). A stage lists exactly (:func:`stages`):
  * the project files its script imports, followed transitively through ``dpnrepro`` imports (also
    those inside functions; :mod:`dpnrepro.codedeps`), a package directory where it imports every file
    in it, so an edit to imported code reruns it and an edit elsewhere does not;
  * the params keys that change its outputs. Execution settings (``runtime``: evaluation batch
    size, logging and checkpoint cadence, workers, device count) are tracked by no stage;
  * its data: the outputs of the stages before it.
So `dvc status`, `dvc repro --dry`, `dvc repro -s` and `dvc commit` see a code or params edit on exactly
the stages it reaches, with no generated input in between.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from dpnrepro.codedeps import ROOT, code_deps, module_path
from dpnrepro.config.sweeps import EVALUATORS, SWEEPS, reports

DVC_YAML = ROOT / "dvc.yaml"
BENCHMARKS_DVC_YAML = ROOT / "benchmarks" / "dvc.yaml"
STUDY_DVC_YAML = ROOT / "study" / "dvc.yaml"


def _stage(script: str, *, args: str = "", code=(), deps=(), params=(), outs=(), metrics=(), **extra) -> dict:
    """A stage; ``code``: modules it loads by name (e.g. :func:`evaluator_modules`), whose imports count too.
    ``metrics`` are the DVC metrics (git-tracked, uncached): only headline files
    (:func:`report_outs`), so `dvc metrics show/diff` stays readable. Per-run metrics are :func:`uncached` outs."""
    stage = {"cmd": f"python {script}{' ' + args if args else ''}", "deps": [*code_deps(script, *code), *deps]}
    if params:
        stage["params"] = list(params)
    if outs:
        stage["outs"] = list(outs)
    if metrics:
        stage["metrics"] = uncached(metrics)
    stage.update(extra)
    return stage


def uncached(paths) -> list[dict]:
    """Outputs committed to git instead of DVC's cache (metrics, tables, figures)."""
    return [{p: {"cache": False}} for p in paths]


def report_outs(name: str, pages=None) -> dict:
    """The outputs of a report stage (:func:`dpnrepro.reports.plotting.write_report`): its pages (default
    reports/<name>.{md,png}), metrics/<name>_summary.json (the detail) and, as its only DVC metrics,
    metrics/headline/<name>.json."""
    from dpnrepro.reports.headline import headline_path

    pages = [f"reports/{name}.md", f"reports/{name}.png"] if pages is None else pages
    return {"outs": uncached([*pages, f"metrics/{name}_summary.json"]), "metrics": [headline_path(name).as_posix()]}


# Figure 2's data as CSVs for `dvc plots` (stages/figures.py)
FIGURE_CSVS = ("metrics/figure2_depth.csv", "metrics/figure2_embedding.csv")


# reports built by stages/ablations.py (the others by stages/table.py)
ABLATION_REPORTS = ("table6", "figure1")


def evaluator_modules(sweeps) -> list[str]:
    """The files of the evaluators of ``sweeps`` (:data:`~dpnrepro.config.sweeps.EVALUATORS`): stages/evaluate.py
    loads them by name, so its stage for a report depends on the code of the evaluators it runs, and only those."""
    return sorted({module_path(EVALUATORS[SWEEPS[s].evaluate].module) for s in sweeps})


def _prepared(dataset: str) -> str:
    return "data/prepared" if dataset == "data" else f"data/upstream/{dataset}"


def stages() -> dict:
    """Every stage of dvc.yaml, in order, with exactly what it depends on: its code files, its params
    and its data."""
    out = {
        "export_imagefolder": _stage("stages/export_imagefolder.py", params=["export_imagefolder"],
                                     outs=["data/raw/imagefolder"]),
        "prepare": {**_stage("stages/prepare.py", deps=["data/raw/imagefolder"],
                             params=["data", "data_i21k", "data_jft"],
                             outs=["data/prepared", "data/upstream"])},
    }
    train_code = [*code_deps("stages/train.py")]
    for sweep, definition in SWEEPS.items():
        deps = [_prepared(definition.dataset)]
        if definition.init_from:
            deps.append(f"runs/{definition.init_from}")
        out[f"train-{sweep}"] = {
            "cmd": f"python stages/train.py --sweep {sweep}",
            "deps": [*train_code, *deps],
            # what a run computes (its data is the prepared directory above): `runtime` is not among them
            "params": ["input", "model", "train", f"{sweep}.archs", f"{sweep}.stems", f"{sweep}.seeds",
                       f"{sweep}.recipe", *([f"{sweep}.variants"] if definition.variants else [])],
            # checkpoints/<sweep> (resumable state) is deliberately not an output: it is a local resume
            # cache (it records the code fingerprint, so it changes with any code edit) that `dvc pull`
            # cannot fetch, and a missing output would make a pulled clone retrain every sweep
            "outs": [f"runs/{sweep}"],
        }
    for report in reports():
        sweeps = [s for s, d in SWEEPS.items() if d.report == report]
        params = ["input"]
        for sweep in sweeps:
            params += [f"{sweep}.{key}" for key in ("archs", "stems", "seeds", "recipe")]
            params += [f"{sweep}.variants"] if SWEEPS[sweep].variants else []
            evaluator = SWEEPS[sweep].evaluate
            params += [f"{sweep}.{evaluator}"] if EVALUATORS[evaluator].params is not None else []
        table = SWEEPS[sweeps[0]].table
        out[f"evaluate-{report}"] = _stage(
            "stages/evaluate.py", args=f"--table {table}" if isinstance(table, int) else f"--report {report}",
            code=evaluator_modules(sweeps),
            deps=["data/prepared", *(f"runs/{s}" for s in sweeps)],
            params=params, outs=uncached(f"metrics/{s}.json" for s in sweeps))
    for report in reports():
        sweeps = [s for s, d in SWEEPS.items() if d.report == report]
        metrics = [f"metrics/{s}.json" for s in sweeps]
        if report in ABLATION_REPORTS:  # Table 6, Figure 1
            script, args = "stages/ablations.py", f"--report {report}"
        else:
            script, args = "stages/table.py", f"--table {SWEEPS[sweeps[0]].table}"
        out[report] = _stage(
            script, args=args, deps=(["reports/paper"] if report != "figure1" else []) + metrics,
            **report_outs(report))
    out["figures"] = _stage("stages/figures.py", deps=["runs/table1"], params=["figures"], **report_outs(
        "figures", pages=[*(f"reports/figure{n}.{ext}" for n in (2, 3, 4) for ext in ("md", "png")), *FIGURE_CSVS]))
    out.update(segmentation_stages())
    out.update(transfer_stages())
    out.update(lit_stages())
    out["reports_index"] = reports_index_stage(out)
    return out


def reports_index_stage(paper_stages: dict) -> dict:
    """reports/README.md, the index of every report ``paper_stages`` write (:mod:`dpnrepro.reports.index`):
    it reads their summaries and sweep metrics, the paper's numbers, the full profile, the committed GPU
    throughput, the study's record (study/findings.json) and the GPU runs (reports/gpu/): plain git-tracked
    files, so no benchmark or study stage is pulled into `dvc repro`."""
    from dpnrepro.reports.index import INDEX, index_inputs

    return _stage("stages/reports_index.py", deps=index_inputs(paper_stages),
                  outs=uncached([INDEX.as_posix()]))


def benchmark_stages() -> dict:
    """Wall-clock measurements, kept out of the paper's pipeline (benchmarks/dvc.yaml, run from the
    project root): `dvc repro` rebuilds the tables and figures without them; `dvc repro
    benchmarks/dvc.yaml` (or `dvc repro -P`) runs them."""
    from dpnrepro.reports.headline import headline_path

    bench = _stage(
        "stages/benchmark.py", params=["benchmark", "train.optimizer", "train.lr", "train.weight_decay",
                                       "train.grad_clip"],
        outs=uncached(["reports/benchmarks.md", "metrics/benchmarks.json"]),
        metrics=[headline_path("benchmarks").as_posix()])
    bench_input = _stage(
        "stages/bench_input.py", outs=uncached(["reports/input_pipeline.md", "metrics/input_pipeline.json"]),
        metrics=[headline_path("input_pipeline").as_posix()])
    return {"benchmark": {"wdir": "..", **bench}, "bench_input": {"wdir": "..", **bench_input}}


def study_stages() -> dict:
    """The powered study (study/dvc.yaml, params in study/params.yaml, run from the project root): one
    stage per cell (``study-<cell>``, its params keys only), then the report. Every output is a small
    git-tracked metrics file, so a clone regenerates the report without retraining or `dvc pull`."""
    from dpnrepro.study.config import PARAMS_FILE, load_study_params

    params = load_study_params(ROOT / PARAMS_FILE)
    out = {}
    for cell in params.cells():
        out[f"study-{cell.name}"] = {"wdir": "..", **_stage(
            "stages/study_train.py", args=f"--cell {cell.name}",
            params=[{PARAMS_FILE.as_posix(): params.tracked_keys(cell)}],
            outs=uncached([f"metrics/study/{cell.name}.json"]))}
    out["study_probe"] = {"wdir": "..", **_stage(
        "stages/study_probe.py", params=[{PARAMS_FILE.as_posix(): ["study.datasets", "study.comparison.archs"]}],
        outs=uncached(["metrics/study_probe.json"]))}
    out["study_report"] = {"wdir": "..", **_stage(
        "stages/study_report.py",
        deps=[*(f"metrics/study/{cell.name}.json" for cell in params.cells()), "metrics/study_probe.json"],
        **report_outs("study"))}
    return out


def segmentation_stages() -> dict:
    """Table 5: smoke canvases -> every (stem, fraction, seed) run in one process -> report.

    One process for the sweep, not a ``matrix:`` stage per run: a process pays ~5 s of torch + mmseg
    imports, a run ~1 s of Runner construction. The mmseg config files are read by mmengine, not
    imported, so they are deps by path. Runs start from ``runs/table1`` (the pretraining sweep)."""
    from dpnrepro.cost.gpu_hours import SEG_CONFIGS

    return {
        "export_seg_canvases": _stage("stages/export_seg_canvases.py", params=["export_seg_canvases"],
                                      outs=["data/raw/seg_canvases"]),
        "segment": _stage(
            "stages/segment.py", deps=[SEG_CONFIGS, "data/raw/seg_canvases", "runs/table1"],
            params=["segmentation"],
            # checkpoints/seg: a local resume cache, not an output (see the train stages)
            outs=["runs/seg", *uncached(["metrics/seg.json"])]),
        "table5": _stage("stages/table.py", args="--table 5", deps=["reports/paper", "metrics/seg.json"],
                         **report_outs("table5")),
    }


def transfer_stages() -> dict:
    """Tables 3 and 7: the smoke stand-ins, VTAB-1k fine-tunes of the table1 runs, Sun397 from scratch."""
    from dpnrepro.config.transfer import VTAB_INIT_SWEEP

    def table(n: int, metrics: str) -> dict:
        return _stage("stages/transfer_table.py", args=f"--table {n}", deps=["reports/paper", f"metrics/{metrics}.json"],
                      **report_outs(f"table{n}"))

    return {
        "transfer_data": _stage("stages/transfer_data.py", params=["transfer_data"], outs=["data/transfer"]),
        "vtab": _stage("stages/vtab.py", deps=["data/transfer", f"runs/{VTAB_INIT_SWEEP}"],
                       params=["input", "model", "train", "vtab"], outs=uncached(["metrics/vtab.json"])),
        "table3": table(3, "vtab"),
        "sun397_scratch": _stage("stages/sun397_scratch.py", deps=["data/transfer"],
                                 params=["input", "model", "train", "sun397_scratch"],
                                 outs=uncached(["metrics/sun397_scratch.json"])),
        "table7": table(7, "sun397_scratch"),
    }


def lit_stages() -> dict:
    """Table 4 (LiT): caption corpus (smoke) -> lit_train (text towers on the locked Table 2 towers) ->
    lit_evaluate (zero-shot) -> table4. The towers' sweeps are params (lit.towers.sweeps), the runs of
    every JFT-style sweep are deps (the ones this profile does not lock cost nothing to hash)."""
    towers = [f"runs/{s}" for s, d in SWEEPS.items() if d.dataset == "data_jft" and d.init_from is None]
    lit_params = ["lit.towers", "lit.seeds", "lit.data", "lit.context_length", "lit.text", "lit.temperature_init",
                  "lit.train"]
    return {
        "lit_captions": _stage("stages/lit_captions.py", params=["lit_captions"], outs=["data/raw/lit_captions"]),
        "lit_train": _stage("stages/train_lit.py", deps=["data/raw/lit_captions", *towers], params=lit_params,
                            outs=["runs/lit"]),
        "lit_evaluate": _stage("stages/evaluate_lit.py", deps=["runs/lit", *towers],
                               params=[*lit_params, "lit.zeroshot"], outs=uncached(["metrics/lit.json"])),
        "table4": _stage("stages/table4.py", deps=["reports/paper", "metrics/lit.json"], **report_outs("table4")),
    }


HEADER = """\
# GENERATED by `python -m dpnrepro.pipeline` from config/sweeps.py (SWEEPS) and the stages' imports: do not edit by
# hand (tests/test_pipeline_contract.py fails when this file and the generator disagree).
#
# Every stage lists the code files its script imports (a package directory where it imports all of it) and
# the params keys it reads, so it reruns exactly when its code, params, data or command change, and
# `dvc status` / `dvc repro --dry` name exactly the stages an edit reaches.
# export_imagefolder -> prepare -> train-<sweep> -> evaluate-<report> -> <report> (table<N>, figure1)
# runs/table1 -> figures (Figures 2-4: gradient norms from dvclive, the first LN's scale)
# export_seg_canvases -> segment (fine-tunes runs/table1 with mmseg's Runner) -> table5
# transfer_data -> vtab (fine-tunes runs/table1) -> table3;  transfer_data -> sun397_scratch -> table7
# lit_captions + train-jft_* -> lit_train -> lit_evaluate -> table4   (LiT, Table 4)
# every report's metrics + reports/paper + profiles/full.yaml + benchmarks/measured/gpu_throughput_summary.json
#   -> reports_index -> reports/README.md (the index: stage, profile, hardware, seeds, paper vs ours, GPU-hours)
# A train stage trains every (arch, stem, seed) of its sweep in one process; a run whose checkpoint
# is complete is restored, not retrained, so adding a seed trains only the new run. Fine-tune sweeps
# start from the run of their init_from sweep with the same arch/stem/seed. Resumable training state
# lives in checkpoints/ (git-ignored, not a DVC output: a local resume cache), so a killed `dvc repro`
# resumes where it stopped, and a clone that ran `dvc pull` reruns no training stage.
"""


BENCHMARKS_HEADER = """\
# GENERATED by `python -m dpnrepro.pipeline`: do not edit by hand.
#
# Wall-clock benchmarks, outside the paper's pipeline so that `dvc repro` (the project root's dvc.yaml)
# rebuilds every table and figure without them. Run: `dvc repro benchmarks/dvc.yaml` (or `dvc repro -P`).
# Stages run from the project root (wdir: ..); paths are relative to it.
"""


# The training curves plotted for every run of a sweep: {plot: (the trainer's dvclive metric, its title)}
CURVES = {"loss": ("train/loss", "training loss"), "lr": ("train/lr", "learning rate"),
          "stem_grad_norm": ("grad_norm/stem", "gradient norm of the stem (before clipping)")}


def curve_plots(params) -> list[dict]:
    """``train-<sweep>/<curve>`` plots: one line per run of the sweep (``runs.sweep_runs``, the iterator the
    train and evaluate stages walk), from the dvclive TSV the trainer writes inside ``runs/<sweep>/<run>/``
    (DVC expands no globs in top-level plots)."""
    from dpnrepro.runs import sweep_runs

    out = []
    for sweep in (s for s in SWEEPS if s in params.sweeps()):
        runs = [run.name for run in sweep_runs(params, sweep)]
        for curve, (metric, title) in CURVES.items():
            field = metric.rsplit("/", 1)[-1]
            out.append({f"train-{sweep}/{curve}": {
                "x": "step", "y": {f"runs/{sweep}/{run}/dvclive/plots/metrics/{metric}.tsv": field for run in runs},
                "title": f"{sweep}: {title}, every run"}})
    return out


def plots(params) -> list[dict]:
    """dvc.yaml's top-level plots: the training curves of every sweep, Fig. 2's CSVs and every report PNG."""
    figure_csvs = [
        {"figure2_depth": {"x": "layer", "y": {FIGURE_CSVS[0]: ["base", "dpn"]},
                           "template": "bar_horizontal", "title": "Fig. 2 (a): gradient norm vs depth"}},
        {"figure2_embedding": {"x": "step", "y": {FIGURE_CSVS[1]: ["base", "dpn"]},
                               "title": "Fig. 2 (b): stem gradient norm over training"}}]
    return [*curve_plots(params), *figure_csvs, *image_plots(stages())]


def image_plots(stages: dict, prefix: str = "") -> list[dict]:
    """Every PNG the ``stages`` write, as DVC image plots (``prefix``: from the stages' ``wdir`` back to the
    dvc.yaml's directory, whose top-level plot paths are relative to it)."""
    return [{prefix + next(iter(o)): {}} for body in stages.values() for o in body.get("outs", [])
            if isinstance(o, dict) and next(iter(o)).endswith(".png")]


def render() -> str:
    """The text of dvc.yaml (its plots list the runs of the active profile, params.yaml)."""
    from dpnrepro.config.params import load_params

    body = yaml.safe_dump({"stages": stages(), "plots": plots(load_params(ROOT / "params.yaml"))},
                          sort_keys=False, width=120)
    return HEADER + body


STUDY_HEADER = """\
# GENERATED by `python -m dpnrepro.pipeline` from study/params.yaml: do not edit by hand.
#
# The powered DPN study (reports/study.md), outside the paper's pipeline: about two hours on 2 CPU cores.
# Run: `dvc repro study/dvc.yaml`, or one cell: `dvc repro study/dvc.yaml:study-<cell>`.
# Stages run from the project root (wdir: ..); paths are relative to it.
"""


def render_all() -> dict:
    """{path: text} of every generated pipeline file."""
    def dump(stages: dict, **top) -> str:
        return yaml.safe_dump({"stages": stages, **top}, sort_keys=False, width=120)

    study = study_stages()  # its figure as an image plot (`dvc plots show` collects every dvc.yaml)
    return {DVC_YAML: render(), BENCHMARKS_DVC_YAML: BENCHMARKS_HEADER + dump(benchmark_stages()),
            STUDY_DVC_YAML: STUDY_HEADER + dump(study, plots=image_plots(study, prefix="../"))}


def enclosing_project(start: Path) -> Path | None:
    """The dpnrepro checkout that holds ``start`` (a folder with pyproject.toml and src/dpnrepro/), or None."""
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "src" / "dpnrepro" / "__init__.py").is_file():
            return folder
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if dvc.yaml is not what the generator writes")
    args = ap.parse_args(argv)
    from dpnrepro.errors import UserError

    here = enclosing_project(Path.cwd().resolve())
    if here is not None and here != ROOT:  # it would read and write the imported checkout, not this one
        print(f"error: {here} is another checkout than the dpnrepro imported ({ROOT}): run it with "
              f"PYTHONPATH={here}/src", file=sys.stderr)
        return 2

    try:
        files = render_all()
    except UserError as exc:  # a malformed params file: one line, nothing written
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        stale = [path.relative_to(ROOT).as_posix() for path, text in files.items()
                 if not path.exists() or path.read_text() != text]
        if stale:
            print(f"{', '.join(stale)} out of date: run `python -m dpnrepro.pipeline`", file=sys.stderr)
            return 1
        return 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote dvc.yaml ({len(stages())} stages), benchmarks/dvc.yaml ({len(benchmark_stages())} stages), "
          f"study/dvc.yaml ({len(study_stages())} stages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
