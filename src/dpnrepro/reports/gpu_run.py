"""reports/gpu/<run>/README.md: the page of one committed GPU run of the smoke pipeline, built from the run's
folder alone (plain json/yaml, no torch), so it never drifts when ``main``'s results are regenerated.

The folder (``reports/gpu/smoke-H200-2026-11-27/`` is the first):

* ``env.json`` (GPU, driver, CUDA, torch, ``git_rev``, CPUs), ``jobs.tsv`` (each ``dvc repro``: exit status, wall
  time), ``stage_times_copy<i>.json`` (seconds per stage; ``null``: started, not finished), optionally
  ``stage_times_rerun.json`` (a later run in copy 0);
* ``copy<i>/dvc.lock`` and ``copy<i>/params.yaml``: the copies run side by side (a lock lists only the stages
  that ran there); optionally ``copy0_after/dvc.lock``: copy 0 after more stages ran in it alone;
* ``gpu/metrics/...``: the GPU-made metrics compared, ``cpu/metrics/...`` and ``cpu/dvc.lock``: the committed CPU
  results at ``git_rev`` (``git show <git_rev>:<path>``); every metrics file must have the md5 its lock records;
* ``notes.yaml``: the changes the run needed and the failures it found (observations, rendered as written);
  ``segment_resume.log`` and ``RUN.md``: the log excerpt and how the run was made.

``python -m dpnrepro.reports.gpu_run reports/gpu/<run>`` writes README.md and ``gpu_vs_cpu.png``;
``--check`` exits 1 when the committed page is not what the folder gives.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

RUNS_DIR = Path("reports/gpu")  # one folder per committed run
PAGE = "README.md"
FIGURE = "gpu_vs_cpu.png"
COPIES = ("copy0", "copy1")
AFTER = "copy0_after"
# Per compared file: the leaves compared (every numeric leaf, or those under this key).
LEAVES_UNDER = {"lit.json": "zeroshot"}
SKIP = {"n"}  # counts, not values
TITLES = {"figure1_summary": "Figure 1", "figures": "Figures 2-4 (stem gradient norms)",
          "lit": "LiT zero-shot (`lit_evaluate`; Table 4 did not run)"}


def _fix(folder: Path) -> str:
    return f"restore it with `git checkout -- {folder}` (the run's files: {folder}/RUN.md)"


def _json(folder: Path, rel: str):
    from dpnrepro.io import read_json

    return read_json(folder / rel, fix=_fix(folder))


def _yaml(folder: Path, rel: str) -> dict:
    from dpnrepro.io import read_yaml

    return read_yaml(folder / rel, fix=_fix(folder))


def lock_outs(lock: dict) -> dict[str, dict[str, str]]:
    """{stage: {output path: md5}} of a dvc.lock (its stages in the lock's order)."""
    return {stage: {o["path"]: o.get("md5", "") for o in body.get("outs", [])}
            for stage, body in (lock.get("stages") or {}).items()}


def compare_copies(a: dict[str, str] | None, b: dict[str, str] | None) -> str:
    """The two copies' outputs of one stage: ``equal (n outputs)``, ``differs: <paths>``, or which copy alone."""
    if a is None and b is None:
        return "—"
    if a is None or b is None:
        return "copy 0 only" if b is None else "copy 1 only"
    differ = sorted(p for p in {*a, *b} if a.get(p) != b.get(p))
    if differ:
        return f"differs: {', '.join(f'`{p}`' for p in differ)}"
    return f"equal ({len(a)} output{'s' * (len(a) != 1)})"


@dataclass(frozen=True)
class Leaf:
    path: str           # "table1/Mu/7/dpn"
    gpu: float
    cpu: float
    delta: dict | None  # the GPU and CPU Δ entries ({mean, ci95, verdict}) where the leaf is a Δ's mean
    difference: bool = False  # a difference without a verdict (under a ``gain*``/``delta*`` key: Figure 1)

    @property
    def is_value(self) -> bool:
        """An accuracy (or other measured value), not a difference between two."""
        return self.delta is None and not self.difference


def _leaves(node, prefix: str = "", under: str | None = None):
    """(path, value, the Δ entry it is the mean of or None) of every numeric leaf; a Δ entry (a dict with a
    ``verdict``) gives one leaf, its mean."""
    if isinstance(node, dict):
        if "verdict" in node:
            if under is None:
                yield prefix, node.get("mean"), node
            return
        for key, value in node.items():
            if key in SKIP:
                continue
            yield from _leaves(value, f"{prefix}/{key}" if prefix else str(key),
                               None if under is None or key == under else under)
    elif isinstance(node, (int, float)) and not isinstance(node, bool) and under is None:
        yield prefix, float(node), None


def _is_difference(path: str) -> bool:
    return any(part.startswith(("gain", "delta")) for part in path.split("/"))


def compare_metrics(gpu: dict, cpu: dict, under: str | None = None) -> list[Leaf]:
    """Every leaf the GPU and the CPU file both hold, in the GPU file's order."""
    cpu_leaves = {p: (v, d) for p, v, d in _leaves(cpu, under=under)}
    return [Leaf(p, v, cpu_leaves[p][0], {"gpu": d, "cpu": cpu_leaves[p][1]} if d else None, _is_difference(p))
            for p, v, d in _leaves(gpu, under=under) if p in cpu_leaves and v is not None]


def _delta_text(d: dict) -> str:
    from dpnrepro.stats import verdict_text

    ci = f" ± {d['ci95']:.2f}" if d.get("ci95") is not None else ""
    return f"{d['mean']:+.2f}{ci}, {verdict_text(d)}"


def title(rel: str) -> str:
    stem = Path(rel).stem
    if stem in TITLES:
        return TITLES[stem]
    kind, number = stem.rstrip("0123456789"), stem[len(stem.rstrip("0123456789")):]
    return f"{kind.capitalize()} {number}".strip()


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def metrics_files(folder: Path) -> list[str]:
    """The compared metrics files (``metrics/...`` paths present under both ``gpu/`` and ``cpu/``)."""
    found = [p.relative_to(folder / "gpu").as_posix() for p in (folder / "gpu" / "metrics").rglob("*.json")
             if (folder / "cpu" / p.relative_to(folder / "gpu")).exists()]
    kind = {"table": 0, "figure": 1}
    return sorted(found, key=lambda rel: (kind.get(re.match(r"[a-z]*", Path(rel).stem)[0], 2), rel))


@dataclass
class Run:
    env: dict
    jobs: list[list[str]]
    stages: list[str]                       # every stage of the run's revision (cpu/dvc.lock), in order
    outs: dict[str, dict]                   # copy0, copy1, copy0_after -> lock_outs
    times: dict[str, dict]                  # copy0, copy1, rerun -> {stage: s or None}
    tables: dict[str, list[Leaf]]           # metrics path -> leaves
    notes: dict


def load_run(folder: Path) -> Run:
    """The run's folder, read and checked: each compared metrics file has the md5 its lock records."""
    from dpnrepro.errors import UserError

    folder = Path(folder)
    if not (folder / "env.json").is_file():
        raise UserError(f"{folder} is not a GPU run's folder (no env.json); see reports/gpu/README.md")
    outs = {c: lock_outs(_yaml(folder, f"{c}/dvc.lock")) for c in COPIES}
    if (folder / AFTER / "dvc.lock").exists():
        outs[AFTER] = lock_outs(_yaml(folder, f"{AFTER}/dvc.lock"))
    cpu_outs = lock_outs(_yaml(folder, "cpu/dvc.lock"))
    # the compared GPU files are copy 0's (its later lock, where there is one, holds its last state)
    gpu_md5 = {p: m for c in ("copy0", AFTER) for body in outs.get(c, {}).values() for p, m in body.items()}
    cpu_md5 = {p: m for body in cpu_outs.values() for p, m in body.items()}
    tables = {}
    for rel in metrics_files(folder):
        for side, md5s in (("gpu", gpu_md5), ("cpu", cpu_md5)):
            if md5s.get(rel) != _md5(folder / side / rel):
                raise UserError(f"{folder / side / rel}: md5 {_md5(folder / side / rel)} is not the "
                                f"{md5s.get(rel) or 'absent'} its dvc.lock records; {_fix(folder)}")
        tables[rel] = compare_metrics(_json(folder, f"gpu/{rel}"), _json(folder, f"cpu/{rel}"),
                                      LEAVES_UNDER.get(Path(rel).name))
    times = {c: _json(folder, f"stage_times_{c}.json") for c in COPIES}
    if (folder / "stage_times_rerun.json").exists():
        times["rerun"] = _json(folder, "stage_times_rerun.json")
    jobs_path = folder / "jobs.tsv"
    if not jobs_path.exists():
        raise UserError(f"{jobs_path} is missing; {_fix(folder)}")
    jobs = [row for row in csv.reader(jobs_path.read_text().splitlines(), delimiter="\t") if row]
    notes = _yaml(folder, "notes.yaml") if (folder / "notes.yaml").exists() else {}
    return Run(_json(folder, "env.json"), jobs, list(cpu_outs), outs, times, tables, notes)


def summary(run: Run) -> dict:
    """What the run showed, in numbers: the stages both copies ran and whether every output hash agrees;
    per compared file, the values' mean and largest |GPU − CPU| and the verdicts that stayed the same."""
    both = [s for s in run.outs["copy0"] if s in run.outs["copy1"]]
    n_outs = sum(len(run.outs["copy0"][s]) for s in both)
    differ = [s for s in both if not compare_copies(run.outs["copy0"][s], run.outs["copy1"][s]).startswith("equal")]
    per_file = {}
    for rel, leaves in run.tables.items():
        values = [abs(leaf.gpu - leaf.cpu) for leaf in leaves if leaf.is_value]
        deltas = [leaf.delta for leaf in leaves if leaf.delta]
        per_file[rel] = {"values": len(values), "mean_abs_diff": sum(values) / len(values) if values else None,
                         "max_abs_diff": max(values, default=None), "verdicts": len(deltas),
                         "same_verdict": sum(d["gpu"]["verdict"] == d["cpu"]["verdict"] for d in deltas)}
    ran = {s for lock in run.outs.values() for s in lock}
    return {"device": run.env.get("nvidia_smi", run.env.get("device", "?")), "git_rev": run.env.get("git_rev", "?"),
            "stages_both": len(both), "outputs_both": n_outs, "differ": differ,
            "not_run": [s for s in run.stages if s not in ran], "tables": per_file}


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "—" if x is None else format(x + 0.0, fmt)


def _where(run: Run, stage: str) -> str:
    copies = [c for c in COPIES if stage in run.outs[c]]
    if copies:
        return ("CUDA, copies " if len(copies) > 1 else "CUDA, copy ") + " and ".join(c[-1] for c in copies)
    if stage in run.outs.get(AFTER, {}):
        return "CUDA, copy 0 afterwards"
    started = [c for c in (*COPIES, "rerun") if stage in run.times.get(c, {})]
    return "started, not finished" if started else "not run"


def _time(times: dict, stage: str) -> str:
    if stage not in times:
        return "—"
    return "unfinished" if times[stage] is None else f"{times[stage]:.1f}"


def build_page(folder: Path, run: Run | None = None) -> str:
    """The text of the run's README.md, from its folder."""
    folder = Path(folder)
    run = run or load_run(folder)
    s = summary(run)
    env = run.env
    lines = [f"# The smoke pipeline on {s['device'].split(',')[0]}: the run of `{folder.name}`", "",
             f"Generated by `python -m dpnrepro.reports.gpu_run {(RUNS_DIR / folder.name).as_posix()}` "
             "from the files of this folder "
             "(src/dpnrepro/reports/gpu_run.py); do not edit by hand. How the run was made: [RUN.md](RUN.md).", "",
             "## Machine and software (`env.json`)", "",
             *(f"- **{k}**: {v}" for k, v in env.items()), "",
             "`dvc repro` per copy (`jobs.tsv`): " + "; ".join(
                 f"{row[0]} {', '.join(row[1:])}" for row in run.jobs) + ".", "",
             "## Per stage: where it ran, its time, and the two copies' output hashes", "",
             f"Both copies ran {s['stages_both']} stages; over their {s['outputs_both']} outputs "
             + (f"the hashes differ in {', '.join(s['differ'])}." if s["differ"] else "every hash is equal.")
             + " Hashes from `copy0/dvc.lock` and `copy1/dvc.lock`"
             + (f" (`{AFTER}/dvc.lock`: copy 0 after more stages ran in it alone)" if AFTER in run.outs else "")
             + "; stages in the order of the run's `cpu/dvc.lock`; times in seconds (`stage_times_*.json`).", "",
             "| Stage | Ran on | Copy 0 (s) | Copy 1 (s) | Rerun in copy 0 (s) | Output hashes, copy 0 vs copy 1 |",
             "|---|---|---|---|---|---|"]
    for stage in run.stages:
        a = run.outs["copy0"].get(stage) or run.outs.get(AFTER, {}).get(stage)
        lines.append(f"| `{stage}` | {_where(run, stage)} | {_time(run.times['copy0'], stage)} | "
                     f"{_time(run.times['copy1'], stage)} | {_time(run.times.get('rerun', {}), stage)} | "
                     f"{compare_copies(a, run.outs['copy1'].get(stage))} |")
    lines += ["", "## GPU against the committed CPU results", "",
              f"GPU values (`gpu/`, from the locks above) beside the CPU ones committed at `{s['git_rev'][:7]}` "
              "(`cpu/`, `git show <git_rev>:<path>`). A Δ row gives each side's mean ± 95 % CI and verdict as its "
              "metrics file records them. Accuracies in points.", ""]
    for rel, leaves in run.tables.items():
        t = s["tables"][rel]
        lines += [f"### {title(rel)} (`{rel}`)", "",
                  f"{t['values']} value{'s' * (t['values'] != 1)}: mean |GPU − CPU| {_num(t['mean_abs_diff'])}, "
                  "largest "
                  f"{_num(t['max_abs_diff'])}" + (f"; verdict unchanged in {t['same_verdict']} of {t['verdicts']} Δs"
                                                   if t["verdicts"] else "") + ".", "",
                  "| Entry | GPU | CPU | GPU − CPU |", "|---|---|---|---|"]
        for leaf in leaves:
            if leaf.delta:
                gpu, cpu = _delta_text(leaf.delta["gpu"]), _delta_text(leaf.delta["cpu"])
            else:
                gpu, cpu = _num(leaf.gpu), _num(leaf.cpu)
            tag = "" if leaf.is_value else " (Δ)"
            lines.append(f"| {leaf.path}{tag} | {gpu} | {cpu} | {leaf.gpu - leaf.cpu + 0.0:+.2f} |")
        lines.append("")
    if (folder / FIGURE).exists():
        lines += [f"![GPU against CPU, every value compared]({FIGURE})", ""]
    lines += ["## What did not run on CUDA", "",
              *(f"- `{stage}`: {_where(run, stage)}" for stage in s["not_run"])]
    if (folder / "segment_resume.log").exists():
        last = [ln for ln in (folder / "segment_resume.log").read_text().splitlines() if ln.strip()]
        error = next((ln for ln in reversed(last) if "Error" in ln and not ln.startswith(("WARNING", "error"))), "")
        lines.append(f"- `segment`'s resume after the budget's interrupt failed: `{error.strip()}` "
                     "([segment_resume.log](segment_resume.log))")
    for heading, key in (("What the run needed", "changes"), ("What it found", "failures")):
        if run.notes.get(key):
            lines += ["", f"## {heading} (`notes.yaml`)", "", *(f"{i}. {t}" for i, t in enumerate(run.notes[key], 1))]
    return "\n".join(lines) + "\n"


def draw_figure(run: Run, path: Path) -> None:
    """GPU against CPU, one point per accuracy value compared (Δs left out), one colour per file."""
    from dpnrepro.reports.plotting import pyplot, save_png

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 5), dpi=100)
    lo, hi = float("inf"), float("-inf")
    for rel, leaves in run.tables.items():
        pts = [(leaf.cpu, leaf.gpu) for leaf in leaves if leaf.is_value]
        if pts and Path(rel).stem != "figures":
            ax.scatter(*zip(*pts), s=14, label=title(rel).split(" (")[0])
            lo, hi = min(lo, *(min(p) for p in pts)), max(hi, *(max(p) for p in pts))
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8)
    ax.set_xlabel("CPU (committed), %")
    ax.set_ylabel("GPU, %")
    ax.set_title("Smoke profile: GPU against CPU")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)


def write(folder: Path) -> Path:
    from dpnrepro.io import write_text_atomic

    folder = Path(folder)
    run = load_run(folder)
    draw_figure(run, folder / FIGURE)
    write_text_atomic(folder / PAGE, build_page(folder, run))
    return folder / PAGE


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="a GPU run's folder, e.g. reports/gpu/smoke-H200-2026-11-27")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if the committed README.md is not what the folder gives")
    args = ap.parse_args(argv)
    from dpnrepro.errors import UserError

    try:
        if args.check:
            if not (args.folder / PAGE).exists() or (args.folder / PAGE).read_text() != build_page(args.folder):
                print(f"{args.folder / PAGE} out of date: run `python -m dpnrepro.reports.gpu_run {args.folder}`",
                      file=sys.stderr)
                return 1
            return 0
        print(f"wrote {write(args.folder)}")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
