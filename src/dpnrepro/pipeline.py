"""dvc.yaml, generated: one definition of the sweeps (:data:`dpnrepro.config.SWEEPS`) and code deps
derived from what each stage really imports.

``python -m dpnrepro.pipeline`` rewrites dvc.yaml; ``--check`` exits 1 when the committed file differs
(tests/test_pipeline_contract.py runs it). A stage depends on exactly:
  * the project files its script imports, followed transitively through ``dpnrepro`` imports (also
    those inside functions; :mod:`dpnrepro.codedeps`), so an edit to imported code reruns it and an
    edit elsewhere does not;
  * the params sections that change its outputs. Execution settings (``runtime``: evaluation batch
    size, logging and checkpoint cadence, workers, device count) are tracked by no stage.
"""

from __future__ import annotations

import argparse
import sys

import yaml

from dpnrepro.codedeps import ROOT, code_deps
from dpnrepro.config import SWEEPS

DVC_YAML = ROOT / "dvc.yaml"


def _stage(script: str, *, args: str = "", deps=(), params=(), outs=(), metrics=(), **extra) -> dict:
    stage = {"cmd": f"python {script}{' ' + args if args else ''}", "deps": [*code_deps(script), *deps]}
    if params:
        stage["params"] = list(params)
    if outs:
        stage["outs"] = list(outs)
    if metrics:
        stage["metrics"] = [{m: {"cache": False}} for m in metrics]
    stage.update(extra)
    return stage


def _prepared(dataset: str) -> str:
    return "data/prepared" if dataset == "data" else f"data/upstream/{dataset}"


def stages() -> dict:
    """Every stage of the pipeline, in order."""
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
                       f"{sweep}.recipe"],
            "outs": [f"runs/{sweep}", {f"checkpoints/{sweep}": {"persist": True, "cache": False}}],
        }
    for table in sorted({d.table for d in SWEEPS.values()}):
        sweeps = [s for s, d in SWEEPS.items() if d.table == table]
        params = ["input"]
        for sweep in sweeps:
            params += [f"{sweep}.{key}" for key in ("archs", "stems", "seeds", "recipe")]
            params += [f"{sweep}.fewshot"] if SWEEPS[sweep].evaluate == "fewshot" else []
        out[f"evaluate-table{table}"] = _stage(
            "stages/evaluate.py", args=f"--table {table}", deps=["data/prepared", *(f"runs/{s}" for s in sweeps)],
            params=params, metrics=[f"metrics/{s}.json" for s in sweeps])
    for table in sorted({d.table for d in SWEEPS.values()}):
        sweeps = [s for s, d in SWEEPS.items() if d.table == table]
        out[f"table{table}"] = _stage(
            "stages/table.py", args=f"--table {table}",
            deps=["reports/paper", *(f"metrics/{s}.json" for s in sweeps)],
            outs=[{f"reports/table{table}.md": {"cache": False}}, {f"reports/table{table}.png": {"cache": False}}],
            metrics=[f"metrics/table{table}_summary.json"])
    out.update(lit_stages())
    out["benchmark"] = _stage(
        "stages/benchmark.py", params=["benchmark", "train.optimizer", "train.lr", "train.weight_decay",
                                       "train.grad_clip"],
        outs=[{"reports/benchmarks.md": {"cache": False}}], metrics=["metrics/benchmarks.json"])
    out["bench_input"] = _stage(
        "stages/bench_input.py", outs=[{"reports/input_pipeline.md": {"cache": False}}],
        metrics=["metrics/input_pipeline.json"])
    return out


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
                               params=[*lit_params, "lit.zeroshot"], metrics=["metrics/lit.json"]),
        "table4": _stage("stages/table4.py", deps=["reports/paper", "metrics/lit.json"],
                         outs=[{"reports/table4.md": {"cache": False}}, {"reports/table4.png": {"cache": False}}],
                         metrics=["metrics/table4_summary.json"]),
    }


HEADER = """\
# GENERATED by `python -m dpnrepro.pipeline` from config.SWEEPS and the stages' imports: do not edit by
# hand (tests/test_pipeline_contract.py fails when this file and the generator disagree).
#
# export_imagefolder -> prepare -> train-<sweep> -> evaluate-table<N> -> table<N>
# lit_captions + train-jft_* -> lit_train -> lit_evaluate -> table4   (LiT, Table 4)
# A train stage trains every (arch, stem, seed) of its sweep in one process; a run whose checkpoint
# is complete is restored, not retrained, so adding a seed trains only the new run. Fine-tune sweeps
# start from the run of their init_from sweep with the same arch/stem/seed. Resumable training state
# lives in checkpoints/ (persist: true), so a killed `dvc repro` resumes where it stopped.
"""


def render() -> str:
    body = yaml.safe_dump({"stages": stages(), "plots": [
        {"runs/table1/*/dvclive/plots/metrics/train/loss.tsv": {"x": "step", "y": "loss"}}]},
        sort_keys=False, width=120)
    return HEADER + body


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if dvc.yaml is not what the generator writes")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if DVC_YAML.read_text() != text:
            print("dvc.yaml is out of date: run `python -m dpnrepro.pipeline`", file=sys.stderr)
            return 1
        return 0
    DVC_YAML.write_text(text)
    print(f"wrote {DVC_YAML.relative_to(ROOT)} ({len(stages())} stages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
