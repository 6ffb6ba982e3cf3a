"""The "Findings" section of reports/README.md: what the reproduction found, in words, computed from the results.

Three sources, each read where it is committed:

* the smoke profile's tables and figures: every Δ of each report's summary and its verdict
  (:func:`dpnrepro.reports.index.all_deltas`), passed in by the index;
* the powered study: ``study/findings.json``, a plain git-tracked record of ``metrics/study_summary.json``'s
  verdicts. The study's outputs belong to ``study/dvc.yaml``; a dep of the index on them would pull the study's
  hours of training into ``dvc repro`` (DVC builds one graph over every dvc.yaml), so the index reads this record
  instead. ``python -m dpnrepro.reports.findings`` rewrites it from the study summary, ``--check`` says whether it
  is current (tests/test_reports_index.py checks it too);
* the committed GPU runs: ``reports/gpu/<run>/`` (:mod:`dpnrepro.reports.gpu_run`).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from dpnrepro.reports.gpu_run import RUNS_DIR as GPU_RUNS

STUDY_SUMMARY = Path("metrics/study_summary.json")
STUDY_RECORD = Path("study/findings.json")
VERDICTS = ("better", "worse", "not resolved")


def _verdict_word(delta: dict) -> str:
    return delta["verdict"].split(" (")[0]


def study_record(summary: dict, md5: str) -> dict:
    """The study's verdicts, from its summary (``comparison``: DPN − conv per cell; ``plateau``: the
    saturation cells, each stem's gain from doubling the longest schedule and DPN − conv there)."""
    cells = [{"cell": c["cell"], "dataset": c["dataset"], "arch": c["arch"], "schedule": c["schedule"],
              "steps": c["steps"], "seeds": c["delta"]["n"], "mean": c["delta"]["mean"], "ci95": c["delta"]["ci95"],
              "verdict": c["delta"]["verdict"]} for c in summary["comparison"]]
    plateau = [{"cell": p["cell"], "dataset": p["dataset"], "arch": p["arch"], "steps": p["steps"],
                "vs_steps": p["vs_steps"], "seeds": p["delta"]["n"], "verdict": p["delta"]["verdict"],
                "gain_verdicts": {stem: g["verdict"] for stem, g in sorted(p["gain"].items())}}
               for p in summary.get("plateau", [])]
    return {"source": STUDY_SUMMARY.as_posix(), "source_md5": md5, "cells": cells, "plateau": plateau}


def _counts(words: list[str]) -> str:
    return ", ".join(f"{kind} in {words.count(kind)}" for kind in VERDICTS)


def study_text(record: dict) -> str:
    """The study's outcome in two sentences."""
    cells = record["cells"]
    seeds = sorted({c["seeds"] for c in cells})
    datasets = sorted({c["dataset"] for c in cells})
    text = (f"**Powered study** ([study.md](study.md); `{STUDY_RECORD.as_posix()}`): over {len(cells)} dataset × "
            f"patch × schedule cells ({', '.join(datasets)}; {'/'.join(map(str, seeds))} seeds each), DPN − conv "
            f"top-1 is {_counts([_verdict_word(c) for c in cells])}.")
    longest = max(c["steps"] for c in cells)
    at_longest = [_verdict_word(c) for c in cells if c["steps"] == longest]
    text += f" At the longest schedule ({longest} steps) it is {_counts(at_longest)} of {len(at_longest)} cells"
    plateau = record.get("plateau") or []
    if plateau:
        gains = [v for p in plateau for v in p["gain_verdicts"].values()]
        resolved = sum(v != "not resolved" for v in gains)
        text += (f"; doubling it ({', '.join(sorted({str(p['steps']) for p in plateau}))} steps, {len(plateau)} cells, "
                 f"{'/'.join(map(str, sorted({p['seeds'] for p in plateau})))} seeds) "
                 + (f"resolves none of the {len(gains)} stems' gains (the longest schedule is at its plateau)"
                    if not resolved else f"resolves {resolved} of the {len(gains)} stems' gains")
                 + f", and DPN − conv there is {_counts([p['verdict'] for p in plateau])} of {len(plateau)}")
    return text + "."


def smoke_text(rows: list[tuple[str, str, list[str]]]) -> str:
    """``rows``: (report link, profile label, every Δ's verdict word) per report that has Δs."""
    profiles = sorted({p for _, p, words in rows if words for p in p.split(", ") if p})
    parts = [f"{link} {len(words)} Δs: {', '.join(f'{words.count(k)} {k}' for k in VERDICTS)}"
             + (f", {len(words) - sum(words.count(k) for k in VERDICTS)} no verdict"
                if len(words) > sum(words.count(k) for k in VERDICTS) else "")
             for link, _, words in rows if words]
    return (f"**Tables and figures** (profile {', '.join(profiles) or '?'}: a CI-sized run that checks the "
            "pipeline, not the paper's effect; DPN − base per block): " + "; ".join(parts) + ".")


def gpu_text(folder: Path, root: Path) -> str:
    """What one committed GPU run showed: the copies' hashes, the verdicts against CPU, mean |GPU − CPU|."""
    from dpnrepro.reports.gpu_run import load_run, summary as run_summary, title

    s = run_summary(load_run(root / folder))
    rel = folder.relative_to(GPU_RUNS).as_posix()
    tables = s["tables"]
    verdicts = sum(t["verdicts"] for t in tables.values())
    same = sum(t["same_verdict"] for t in tables.values())
    diffs = "; ".join(f"{title(p).split(' (')[0]} {t['mean_abs_diff']:.2f} "
                      f"({t['values']} value{'s' * (t['values'] != 1)})"
                      for p, t in tables.items() if t["mean_abs_diff"] is not None and Path(p).stem != "figures")
    copies = (f"both copies' {s['stages_both']} stages gave the same {s['outputs_both']} output hashes"
              if not s["differ"] else f"the copies' hashes differ in {', '.join(s['differ'])}")
    return (f"**GPU run** [{rel}](gpu/{rel}/README.md) ({s['device'].split(',')[0]}, code at `{s['git_rev'][:7]}`): "
            f"{copies}; against the committed CPU results the verdict is unchanged in {same} of {verdicts} Δs, "
            f"mean |GPU − CPU| in points: {diffs}; not run on CUDA: {', '.join(s['not_run'])}.")


def gpu_runs(root: Path) -> list[Path]:
    """The committed GPU runs (folders of reports/gpu/ with an env.json), relative to ``root``."""
    return sorted(p.parent.relative_to(root) for p in (root / GPU_RUNS).glob("*/env.json"))


def read_study_record(root: Path) -> dict:
    from dpnrepro.io import read_json

    return read_json(root / STUDY_RECORD, fix="rewrite it with `python -m dpnrepro.reports.findings`")


def current_study_record(root: Path) -> dict:
    from dpnrepro.io import read_json

    path = root / STUDY_SUMMARY
    summary = read_json(path, fix="restore it with `git checkout -- metrics/study_summary.json` "
                                  "or `dvc repro study/dvc.yaml`")
    return study_record(summary, hashlib.md5(path.read_bytes()).hexdigest())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help=f"exit 1 if {STUDY_RECORD} is not what the study summary gives")
    args = ap.parse_args(argv)
    from dpnrepro.errors import UserError
    from dpnrepro.io import write_json_atomic

    root = Path(".")
    try:
        record = current_study_record(root)
        if args.check:
            if not (root / STUDY_RECORD).exists() or read_study_record(root) != record:
                print(f"{STUDY_RECORD} out of date: run `python -m dpnrepro.reports.findings`", file=sys.stderr)
                return 1
            return 0
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_json_atomic(root / STUDY_RECORD, record)
    print(f"wrote {STUDY_RECORD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
