"""reports/README.md: one table listing every table and figure of the paper's pipeline.

Per report: the DVC stage that writes it, the profile, hardware and seeds of its results, an identifier
of those results, the paper's headline Δ next to ours, and what it would cost on a GPU at the full
profile. Everything is read from committed files, so ``dvc repro`` rebuilds the page byte for byte:

* which reports exist and what they are built from: the entries (:func:`report_entries`) of the
  pipeline's stages, which the stage script passes in (``stages/reports_index.py`` reads
  :func:`dpnrepro.pipeline.stages`, what dvc.yaml is generated from): every stage that writes a
  ``reports/<x>.md``; its ``metrics/*_summary.json``; the sweep metrics it depends on, where a
  dependency ``runs/<sweep>`` stands for ``metrics/<sweep>.json``. So a new table cannot be left out,
  and the definition is a code dep of the stage. This module does not import the pipeline (the
  pipeline imports it for :func:`index_inputs`; tests/test_imports.py forbids import circles);
* profile, hardware label and seeds: the sweep metrics (every one records them);
* paper vs ours: the summaries (ours) and ``reports/paper/`` (the paper's printed numbers; Δ derived
  as DPN − base of the printed values, as the reports do);
* cost: :mod:`dpnrepro.cost.gpu_hours`, from ``profiles/full.yaml`` (the paper's recipes) and
  ``benchmarks/measured/gpu_throughput_summary.json`` (measured GPU throughput, a plain git-tracked
  file, so no benchmark stage is pulled into ``dvc repro``); this module renders its estimates.
* Findings (what the results say, in words): :mod:`dpnrepro.reports.findings`, from the summaries above, the
  study's record ``study/findings.json`` and the committed GPU runs under ``reports/gpu/``.

Revision. The page records no git commit: HEAD changes with every commit, so a page naming it would
differ after each one and never be reproducible from its inputs. It records, per report, the md5 of
the summary the report was built from, the same md5 DVC writes for that file in ``dvc.lock``:
``git log -S<md5> --oneline -- dvc.lock`` names the commit that produced those results. The GPU
measurement carries its own ``git_rev`` (the code it timed), which the page repeats.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from dpnrepro.cost.gpu_hours import (ASSUMED_MFU, FULL_PROFILE, INPUTS, THROUGHPUT, Throughput, Workload,
                                     assumed_device, estimate, full_profile_workloads, load_throughput)
from dpnrepro.reports.ablations import FIGURE1_REFERENCE, TABLE6_STEMS
from dpnrepro.reports.findings import (GPU_RUNS, STUDY_RECORD, gpu_runs, gpu_text, read_study_record, smoke_text,
                                       study_text)
from dpnrepro.reports.paper import load_paper_table
from dpnrepro.reports.table4 import SWEEP_STEPS
from dpnrepro.reports.table5 import LEARNED_MARGIN as SEG_LEARNED_MARGIN
from dpnrepro.reports.tables import BASE_STEM, TABLES
from dpnrepro.reports.transfer_tables import GROUPS
from dpnrepro.stats import LEARNED_MARGIN, MIN_PAIRS, verdict_text

INDEX = Path("reports/README.md")
PAPER_DIR = "reports/paper"
DPN_STEM = "dpn"

# Reports outside `dvc repro` (the paper's dvc.yaml): listed with how to build them, never read.
STATIC_REPORTS = (
    ("study.md", "Powered study (DPN vs conv at n seeds)", "`dvc repro study/dvc.yaml`"),
    ("benchmarks.md", "Training throughput, CPU", "`dvc repro benchmarks/dvc.yaml`"),
    ("input_pipeline.md", "Input pipeline throughput", "`dvc repro benchmarks/dvc.yaml`"),
    ("benchmarks_gpu.md", "Training throughput, GPU", "measured on a GPU machine, committed with "
                                                       "`benchmarks/measured/gpu_throughput_summary.json`"),
    ("gpu/README.md", "The smoke pipeline on a GPU", "`benchmarks/measured/gpu_check.sh` on a GPU machine, "
                                                     "committed under `reports/gpu/`"),
    ("reliability.md", "What happens when things go wrong", "hand-written"),
)

# Figures print no numbers: the paper's claim, as the figure reports state it.
FIGURE_CLAIMS = {
    "figure1": "Sec. 5.2: DPN helps all 5 archs; no placement beats pre-LN (plot only)",
    "figure2": "Sec. 8.1: DPN scales the stem's gradient norm down (plot only)",
    "figure3": "Sec. 8.2: larger scales at the patch's centre and corners (plot only)",
    "figure4": "App. H: as Fig. 2 for B/32, S/32, S/16 (plot only)",
}


# ---------------------------------------------------------------------------------------------------
# Which reports exist (the pipeline's stages)


@dataclass(frozen=True)
class ReportEntry:
    """One ``reports/<name>.md`` of the paper's pipeline and the files it was built from."""

    name: str                  # "table1", "figure2"
    stage: str                 # the dvc.yaml stage that writes it
    summary: str | None        # metrics/<x>_summary.json
    metrics: tuple[str, ...]   # the sweep metrics behind it
    runs: tuple[str, ...]      # runs/<sweep> it reads directly (Figures 2-4)


def _paths(entries) -> list[str]:
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries or ()]


def report_entries(dvc_stages: dict) -> list[ReportEntry]:
    """Every report a stage of ``dvc_stages`` (dvc.yaml's ``stages``, :func:`dpnrepro.pipeline.stages`)
    writes, tables then figures."""
    out = []
    for stage, body in dvc_stages.items():
        outs = [p for p in _paths(body.get("outs"))
                if re.fullmatch(r"reports/[^/]+\.md", p) and p != INDEX.as_posix()]
        deps = _paths(body.get("deps"))
        summaries = [p for p in _paths([*body.get("outs", []), *body.get("metrics", [])])
                     if p.endswith("_summary.json")]
        runs = tuple(d for d in deps if re.fullmatch(r"runs/[^/]+", d))
        metrics = tuple(d for d in deps if re.fullmatch(r"metrics/[^/]+\.json", d)) + \
            tuple(f"metrics/{r.removeprefix('runs/')}.json" for r in runs)
        out += [ReportEntry(Path(p).stem, stage, summaries[0] if summaries else None, metrics, runs) for p in outs]
    return sorted(out, key=_report_order)


def _report_order(entry: ReportEntry) -> tuple:
    kind, number = re.fullmatch(r"(\D*)(\d*)", entry.name).groups()
    return ({"table": 0, "figure": 1}.get(kind, 2), kind, int(number or 0))


def index_inputs(dvc_stages: dict) -> list[str]:
    """Every file the index reads (the deps of its stage), given the other stages of dvc.yaml."""
    entries = report_entries(dvc_stages)
    results = [p for e in entries for p in (e.summary, *e.metrics) if p]
    return [*dict.fromkeys(results), PAPER_DIR, *INPUTS, STUDY_RECORD.as_posix(), GPU_RUNS.as_posix()]


# ---------------------------------------------------------------------------------------------------
# Provenance: profile, hardware, seeds, results md5


def _committed_json(root: Path, rel: str):
    """A committed metrics file of a report, read back (missing or damaged: one line saying how to restore it)."""
    from dpnrepro.io import read_json

    return read_json(root / rel, fix=f"restore it with `git checkout -- {rel}` or rerun the stage that writes it "
                                     f"(`dvc repro`)")


def _sweep_docs(root: Path, entry: ReportEntry) -> list[dict]:
    return [_committed_json(root, p) for p in entry.metrics]


def provenance(docs: list[dict]) -> dict:
    """{profiles, hardware, seeds} recorded by a report's sweep metrics (top level or per run)."""
    profiles, hardware, seeds = [], [], set()
    for doc in docs:
        profiles += [doc["profile"]] if "profile" in doc else []
        runs = list(doc["runs"].values()) if isinstance(doc.get("runs"), dict) else []
        hardware += [doc["hardware"]] if "hardware" in doc else []
        hardware += [r["hardware"] for r in runs if "hardware" in r]
        if "seeds" in doc:
            seeds.update(doc["seeds"])
        elif "seed" in doc:
            seeds.add(doc["seed"])
        else:
            seeds.update(r["seed"] for r in runs if "seed" in r)
    return {"profiles": list(dict.fromkeys(profiles)), "hardware": list(dict.fromkeys(hardware)),
            "seeds": sorted(seeds)}


def md5_of(path: Path) -> str:
    """The file's md5, as dvc.lock records it."""
    return hashlib.md5(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------
# Paper vs ours


def paper_deltas(table: int, **match) -> dict[str, list[float]]:
    """{arch: [DPN − base, ...]} of the paper's printed rows matching ``match``, paired on every other key."""
    pairs: dict[tuple, dict] = {}
    for row in load_paper_table(table)["rows"]:
        if all(str(row.get(k)) == str(v) for k, v in match.items()):
            key = tuple(sorted((k, str(v)) for k, v in row.items() if k not in ("variant", "value", "ci95")))
            pairs.setdefault(key, {})[row["variant"]] = float(row["value"])
    out: dict[str, list[float]] = {}
    for key, pair in pairs.items():
        if {"base", DPN_STEM} <= pair.keys():
            out.setdefault(dict(key)["arch"], []).append(pair[DPN_STEM] - pair["base"])
    return out


def _mean(values) -> float:
    return sum(values) / len(values) + 0.0  # + 0.0: no "-0.0"


def _paper_text(label: str, deltas: dict[str, list[float]]) -> str:
    means = {arch: _mean(v) for arch, v in deltas.items()}
    if len(means) <= 3:
        return f"{label}: " + ", ".join(f"{a} {m:+.1f}" for a, m in means.items())
    return f"{label}: {min(means.values()):+.1f} to {max(means.values()):+.1f} ({len(means)} archs)"


def delta_verdict(delta: dict) -> str:
    """``no verdict: <stem> at chance`` where a side of the Δ did not learn (the summary's ``learned``), else
    the verdict :func:`stats.paired_test` recorded in the summary (with why, where too few training runs)."""
    if delta.get("learned") is False:
        return f"no verdict: {' and '.join(delta.get('at_chance') or ['a run'])} at chance"
    if "verdict" not in delta:
        raise ValueError(f"a Δ without stats.paired_test's verdict: {sorted(delta)}")
    return verdict_text(delta)


def _delta_text(delta: dict) -> str:
    ci = delta.get("ci95")
    mean = round(delta["mean"], 2) + 0.0  # + 0.0: no "-0.00"
    return f"{mean:+.2f}" + (f" ± {ci:.2f}" if ci is not None else "") + f", {delta_verdict(delta)}"


def _ours_text(label: str, by_arch: dict[str, dict], paper: dict[str, list[float]]) -> str:
    """``label: <arch> <Δ ± CI>, <verdict> (paper <Δ>)`` for every arch."""
    parts = []
    for arch, delta in by_arch.items():
        printed = paper.get(arch.replace("-", "/"))
        parts.append(f"{arch} {_delta_text(delta)}" + (f" (paper {_mean(printed):+.1f})" if printed else ""))
    return f"{label}: " + "; ".join(parts)


def all_deltas(node) -> list[dict]:
    """Every Δ in a summary: ``delta_*`` / ``gain*`` entries with a mean (or ``{setting: Δ}``, Table 7)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key.startswith(("delta_", "gain")) and isinstance(value, dict):
                if "mean" in value:
                    found.append(value)
                    continue
                if all(isinstance(v, dict) and "mean" in v for v in value.values()):  # {setting: Δ} (Table 7)
                    found += list(value.values())
                    continue
            found += all_deltas(value)
    return found


def verdict_words(deltas: list[dict]) -> list[str]:
    """Each Δ's verdict in one word: better, worse, not resolved, no verdict."""
    return [delta_verdict(d).split(" (")[0].split(":")[0] for d in deltas]


def verdict_counts(deltas: list[dict]) -> str:
    if not deltas:
        return "—"
    words = verdict_words(deltas)
    kinds = ("better", "worse", "not resolved") + (("no verdict",) if "no verdict" in words else ())
    return f"{len(words)}: " + ", ".join(f"{words.count(w)} {w}" for w in kinds)


def _by_arch(node: dict, key: str = f"delta_{DPN_STEM}") -> dict[str, dict]:
    return {arch: entry[key] for arch, entry in node.items() if key in entry}


def _tables_1_2(n: int, summary: dict, docs: list[dict]) -> tuple[str, str, list[dict]]:
    block = next(b for b in TABLES[n] if b.sweep in summary)  # the table's first block (Table 1: ViT AugReg)
    paper = {a: v for a, v in paper_deltas(n, part=block.part, block=block.block, **dict(block.match)).items()
             if a.endswith("+") == bool(block.arch_suffix)}  # S/16+ is its own sweep
    return (_paper_text(block.title, paper), _ours_text(block.sweep, _by_arch(summary[block.sweep]), paper),
            all_deltas(summary))


def _table3(summary: dict, docs: list[dict]) -> tuple[str, str, list[dict]]:
    group = next(g for g in GROUPS if g in summary["groups"])
    paper = paper_deltas(3, group=group)
    return (_paper_text(f"{group} mean", paper), _ours_text(f"{group} mean", _by_arch(summary["groups"][group]), paper),
            all_deltas(summary["tasks"]))


def _table4(summary: dict, docs: list[dict]) -> tuple[str, str, list[dict]]:
    lit = docs[0]
    classifier = lit["classifiers"][0]  # the table's headline classifier
    node = summary[lit["headline"]][classifier]
    sweep = next(s for s in SWEEP_STEPS if s in node)
    paper = paper_deltas(4, steps=SWEEP_STEPS[sweep])
    return (_paper_text(f"{SWEEP_STEPS[sweep]} steps", paper),
            _ours_text(f"{lit['headline']} ({classifier}), {sweep}", _by_arch(node[sweep]), paper), all_deltas(summary))


def _table5(summary: dict, docs: list[dict]) -> tuple[str, str, list[dict]]:
    fraction = "1" if "1" in summary else list(summary)[-1]
    paper = paper_deltas(5, fraction=fraction)
    ours = {docs[0]["arch"]: summary[fraction][f"delta_{DPN_STEM}"]}
    return _paper_text(f"fraction {fraction}", paper), _ours_text(f"fraction {fraction}", ours, paper), \
        all_deltas(summary)


def _table6(summary: dict, docs: list[dict]) -> tuple[str, str, list[dict]]:
    gains = [float(r["value"]) for r in load_paper_table(6)["rows"]]
    paper = (f"alternative − DPN: {min(gains):+.1f} to {max(gains):+.1f} "
             f"({len(gains)} archs × alternatives, {sum(g > 0 for g in gains)} above 0)")
    ours = {arch: [entry[f"gain_{stem}"]["mean"] for stem in TABLE6_STEMS if f"gain_{stem}" in entry]
            for arch, entry in summary.items()}
    return paper, "; ".join(f"{arch}: {min(g):+.2f} to {max(g):+.2f} ({len(g)} alternatives)"
                            for arch, g in ours.items() if g), all_deltas(summary)


def _as_delta(delta) -> dict:
    """A Δ of Table 7's summary: ``{mean, ci95, chance, learned, at_chance}``, or a bare number (a summary
    written before summaries recorded ``learned``)."""
    return delta if isinstance(delta, dict) else {"mean": delta, "ci95": None}


def _table7(summary: dict, docs: list[dict]) -> tuple[str, str, list[dict]]:
    ours_settings = next(iter(summary.values()))[f"delta_{DPN_STEM}"]
    setting = next(r["setting"] for r in load_paper_table(7)["rows"] if r["setting"] in ours_settings)
    paper = paper_deltas(7, setting=setting)
    ours = {arch: _as_delta(entry[f"delta_{DPN_STEM}"][setting]) for arch, entry in summary.items()}
    return _paper_text(setting, paper), _ours_text(f"{setting}, one model per row", ours, paper), all_deltas(summary)


def _figure1(summary: dict, docs: list[dict]) -> tuple[str, str, list[dict]]:
    key = f"{DPN_STEM}/{FIGURE1_REFERENCE[1]}"  # DPN with the default pre-LN, over conv with pre-LN
    ours = {arch: entry[key]["gain"] for arch, entry in summary.items() if "gain" in entry.get(key, {})}
    return FIGURE_CLAIMS["figure1"], _ours_text(f"DPN vs {'/'.join(FIGURE1_REFERENCE)}", ours, {}), all_deltas(summary)


def _stem_ratios(claim: str, profiles: dict) -> tuple[str, str, list[dict]]:
    ratios = {arch: p[DPN_STEM]["stem"]["mean"] / p[BASE_STEM]["stem"]["mean"] for arch, p in profiles.items()}
    return claim, "stem gradient norm DPN / base: " + ", ".join(f"{a} {r:.3f}" for a, r in ratios.items()), []


def _figure3(summary: dict, docs: list[dict]) -> tuple[str, str, list[dict]]:
    scale = list(_leaves(summary["figure3"]["scale"]))
    return FIGURE_CLAIMS["figure3"], f"{summary['figure3']['run']}: scale {min(scale):.3f} to {max(scale):.3f}", []


# report -> (summary, its sweep metrics) -> (paper, ours, every Δ of ours); a report without one shows "—"
HEADLINES = {
    "table1": lambda summary, docs: _tables_1_2(1, summary, docs),
    "table2": lambda summary, docs: _tables_1_2(2, summary, docs),
    "table3": _table3, "table4": _table4, "table5": _table5, "table6": _table6, "table7": _table7,
    "figure1": _figure1,
    "figure2": lambda summary, docs: _stem_ratios(FIGURE_CLAIMS["figure2"],
                                                 {summary["figure2"]["arch"]: summary["figure2"]["depth"]}),
    "figure3": _figure3,
    "figure4": lambda summary, docs: _stem_ratios(FIGURE_CLAIMS["figure4"], summary["figure4"]),
}


def headline(name: str, summary: dict, docs: list[dict]) -> tuple[str, str, list[dict]]:
    """(paper, ours, every Δ of ours) of report ``name``."""
    if name in HEADLINES:
        return HEADLINES[name](summary, docs)
    return "—", "—", all_deltas(summary)


def _leaves(node):
    if isinstance(node, list):
        for item in node:
            yield from _leaves(item)
    else:
        yield node


# ---------------------------------------------------------------------------------------------------
# GPU-hours at the full profile (estimated by dpnrepro.cost.gpu_hours)


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 10 else f"{h:.1f}"


METHOD_TEXT = {"measured": "measured img/s", "mfu": "FLOPs at measured MFU", "assumed": "FLOPs at assumed MFU"}
METHOD_TAG = {"measured": "measured", "mfu": "MFU-scaled", "assumed": "assumed MFU"}


def cost_cell_and_note(workloads: list[Workload], tp: Throughput | None,
                       compile_: bool) -> tuple[float, str, str]:
    """(GPU-hours, table cell, one-line note) of a report's workloads."""
    hours: dict[str, float] = {}
    shapes: dict[str, dict[str, list[str]]] = {}  # method -> source -> ["B/32 384 px", ...]
    for w in workloads:
        h, method, source = estimate(w, tp, compile_=compile_)
        hours[method] = hours.get(method, 0.0) + h
        shape = f"{w.arch} {w.img_size} px"
        by_source = shapes.setdefault(method, {}).setdefault(source if method == "mfu" else "", [])
        by_source += [shape] if shape not in by_source else []
    methods = [m for m in METHOD_TEXT if m in hours]
    total = sum(hours.values())
    cell = f"{_hours(total)} ({' + '.join(METHOD_TAG[m] for m in methods)})"
    parts = [f"{_hours(hours[m])} h from {METHOD_TEXT[m]} ("
             + "; ".join((f"{source}: " if source else "") + ", ".join(s) for source, s in shapes[m].items()) + ")"
             for m in methods]
    labels = ", ".join(dict.fromkeys(w.label for w in workloads))
    images = sum(w.images for w in workloads)
    return total, cell, (f"{sum(w.runs for w in workloads)} runs ({labels}), {images / 1e9:,.1f} G training images: "
                         + "; ".join(parts))


# ---------------------------------------------------------------------------------------------------
# The page


def build_index(entries: list[ReportEntry], root: Path = Path("."), *, throughput: Path | None = None) -> str:
    """The text of reports/README.md: the reports ``entries`` (:func:`report_entries`) from the committed
    files under ``root``."""
    tp = load_throughput(root / (throughput or THROUGHPUT))
    workloads, compile_ = full_profile_workloads(root)
    hardware_ids: dict[str, str] = {}
    rows, notes, total_hours, found = [], [], 0.0, []
    for entry in entries:
        docs = _sweep_docs(root, entry)
        prov = provenance(docs)
        for hw in prov["hardware"]:
            hardware_ids.setdefault(hw, f"H{len(hardware_ids) + 1}")
        summary = _committed_json(root, entry.summary) if entry.summary else {}
        paper, ours, deltas = headline(entry.name, summary, docs) if summary else ("—", "—", [])
        title = _title(entry.name)
        found.append((f"[{title}]({entry.name}.md)", ", ".join(prov["profiles"]), verdict_words(deltas)))
        if entry.name in workloads:
            hours, cell, note = cost_cell_and_note(workloads[entry.name], tp, compile_)
            total_hours += hours
            notes.append(f"- [{title}]({entry.name}.md): {note}")
        elif entry.runs:
            cell = f"0 (reads {', '.join(f'`{r}`' for r in entry.runs)})"
        else:
            cell = "not estimated"
        rows.append([f"[{title}]({entry.name}.md)", f"`{entry.stage}`", ", ".join(prov["profiles"]) or "—",
                     ", ".join(hardware_ids[h] for h in prov["hardware"]) or "—",
                     ", ".join(map(str, prov["seeds"])) or "—",
                     f"`{md5_of(root / entry.summary)[:8]}`" if entry.summary else "—",
                     paper, ours, verdict_counts(deltas), cell])
    for path, title, how in STATIC_REPORTS:
        rows.append([f"[{title}]({path})", how, *["—"] * 8])
    runs = gpu_runs(root)
    for run in runs:
        rel = run.relative_to(GPU_RUNS).as_posix()
        rows.append([f"[GPU run {rel}](gpu/{rel}/README.md)",
                     f"`python -m dpnrepro.reports.gpu_run {run.as_posix()}`, from its committed files", *["—"] * 8])
    header = ["Report", "Stage", "Profile", "Hardware", "Seeds", "Results md5", "Paper Δ (DPN − base)",
              "Ours Δ ± 95 % CI, verdict", "Our Δs", "GPU-hours, full profile"]
    lines = [
        "# Reports: every table and figure",
        "",
        "Generated by `dvc repro reports_index` from dvc.yaml, the metrics each report is built from, "
        f"`{PAPER_DIR}/`, `{FULL_PROFILE.as_posix()}`, `{THROUGHPUT.as_posix()}`, `{STUDY_RECORD.as_posix()}` and "
        f"`{GPU_RUNS.as_posix()}/`; do not edit by hand. "
        f"`dvc repro` rebuilds every report but the last {len(STATIC_REPORTS) + len(runs)} rows, which are built as "
        "their Stage column says.",
        "",
        "## Findings",
        "",
        f"Computed from the results (src/dpnrepro/reports/findings.py); the verdict rule is under the table.",
        "",
        f"- {smoke_text(found)}",
        f"- {study_text(read_study_record(root))}",
        *(f"- {gpu_text(run, root)}" for run in runs),
        "",
        "## Every table and figure",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        "- **Hardware**: " + "; ".join(f"{i} = {hw}" for hw, i in hardware_ids.items()) + ".",
        "- **Results md5**: the md5 of the report's `metrics/*_summary.json`, as `dvc.lock` records it; "
        "`git log -S<md5> --oneline -- dvc.lock` names the commit that produced those results "
        "(a commit id on this page would change with every commit; src/dpnrepro/reports/index.py).",
        "- **Paper vs ours**: the headline block of each table; Δ = DPN − base (Table 6: alternative − DPN; "
        "Figure 1: run − conv with pre-LN); paper Δ from the printed values (mean over a block's rows per arch). "
        f"Verdict (`stats.paired_test`; docs/tables-and-figures.md#statistics): better / worse when the 95 % CI "
        f"of Δ excludes 0 over at least {MIN_PAIRS} independent training pairs: training seeds, few-shot draws "
        "averaged within each (Tables 3, 4, 5: pretrained pairs, fine-tunes averaged within each), else "
        "not resolved, with the number of training or pretraining runs where there are fewer; no verdict where a side "
        f"of Δ did not learn (less than {LEARNED_MARGIN:g} points of accuracy, Table 5: {SEG_LEARNED_MARGIN:g} "
        "points of mIoU, above its chance rate; `stats.learned`). "
        "*Our Δs* counts every Δ of the report's summary.",
        "",
        "## GPU-hours at the full profile",
        "",
        _cost_preamble(tp),
        "",
        *notes,
        f"- **All tables and figures**: {_hours(total_hours)} GPU-hours.",
        "",
    ]
    return "\n".join(lines)


def _title(name: str) -> str:
    kind, number = re.fullmatch(r"(\D*)(\d*)", name).groups()
    return f"{kind.capitalize()} {number}".strip() if number else name


def _cost_preamble(tp: Throughput | None) -> str:
    method = ("Training steps of `profiles/full.yaml` only (no evaluation, data loading or checkpoints); per group "
              "of identical runs, ")
    if tp is None:
        peak, device = assumed_device()
        return (f"**No GPU measurement is committed yet** (`{THROUGHPUT.as_posix()}` lists no runs), so every figure "
                f"below is derived, not measured. {method}training FLOPs (`benchmarks/flops.py`, 3 × forward) at an "
                f"assumed {ASSUMED_MFU * 100:.0f} % MFU of an {device} ({peak:g} TFLOP/s dense bf16).")
    batches = sorted({r["batch_size"] for r in tp.runs if "batch_size" in r})
    facts = [f"{tp.peak_tflops:g} TFLOP/s dense bf16 peak" if tp.peak_tflops else "bf16 peak unknown"]
    facts += [f"batch {', '.join(map(str, batches))} per GPU"] if batches else []
    facts += [f"torch {tp.torch}"] if tp.torch else []
    facts += [f"measured {tp.measured}"] if tp.measured else []
    facts += [f"code at {tp.git_rev}"] if tp.git_rev else []
    return (f"Device: **{tp.device}** ({', '.join(facts)}; `{THROUGHPUT.as_posix()}`). {method}training images ÷ "
            "the measured images/s per GPU at that arch and resolution (*measured img/s*); where none was measured "
            "(and for LiT, whose step is not a ViT training step), training FLOPs ÷ (peak × the MFU measured for the "
            "nearest arch) (*FLOPs at measured MFU*).")


def write_index(entries: list[ReportEntry], root: Path = Path(".")) -> Path:
    from dpnrepro.io import write_text_atomic

    write_text_atomic(root / INDEX, build_index(entries, root))
    return root / INDEX
