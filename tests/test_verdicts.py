"""One verdict function: every report, headline and the index take better / worse / not resolved from
``stats.paired_test``, and draws of one trained pair never decide (docs/tables-and-figures.md#statistics)."""

from __future__ import annotations

import json
import re

import pytest

from dpnrepro import stats
from dpnrepro.reports import ablations, headline, index, table4, table5, tables, transfer_tables
from dpnrepro.study import report as study_report
from helpers import REPO

SENTINEL = "sentinel verdict"
DECIDING_MODULES = [*sorted((REPO / "src" / "dpnrepro" / "reports").glob("*.py")),
                    REPO / "src" / "dpnrepro" / "study" / "report.py"]


def _metrics(name: str) -> dict:
    return json.loads((REPO / "metrics" / f"{name}.json").read_text())


def _summaries() -> dict[str, tuple[dict, list[dict], dict]]:
    """``{report: (summary, its Δs, its headline)}`` of every report with a verdict, from the committed metrics."""
    t12 = {n: {s: tables.summarize_sweep(_metrics(s)) for s in tables.table_sweeps(n)
               if (REPO / "metrics" / f"{s}.json").exists()} for n in (1, 2)}
    lit = _metrics("lit")
    t3, t4, t5 = (transfer_tables.summarize_vtab(_metrics("vtab")), table4.summarize(lit),
                  table5.summarize(_metrics("seg")))
    t6, t7 = ablations.summarize_table6(_metrics("table6")), transfer_tables.summarize_scratch(_metrics("sun397_scratch"))
    fig1 = ablations.summarize_figure1(_metrics("figure1"))
    study = study_report.summarize(study_report.load_cells(REPO / "metrics"))
    study_deltas = [d for row in study["comparison"] + study["plateau"] for d in [row["delta"], *row.get("gain", {}).values()]]
    study_deltas += [row["vs_dpn"] for cell in study["ablations"] for row in cell["rows"] if "vs_dpn" in row]
    return {
        "table1": (t12[1], index.all_deltas(t12[1]), headline.tables_1_2(t12[1])),
        "table2": (t12[2], index.all_deltas(t12[2]), headline.tables_1_2(t12[2])),
        "table3": (t3, index.all_deltas(t3), headline.table3(t3)),
        "table4": (t4, index.all_deltas(t4), headline.table4(t4, lit["headline"])),
        "table5": (t5, index.all_deltas(t5), headline.table5(t5)),
        "table6": (t6, index.all_deltas(t6), headline.table6(t6)),
        "table7": (t7, index.all_deltas(t7), headline.table7(t7)),
        "figure1": (fig1, index.all_deltas(fig1), {}),
        "study": (study, study_deltas, headline.study(study)),
    }


def _headline_verdicts(node) -> list[str]:
    if isinstance(node, dict):
        return ([node["verdict"]] if "verdict" in node else []) + \
            [v for value in node.values() for v in _headline_verdicts(value)]
    return []


def test_every_report_takes_its_verdict_from_paired_test(monkeypatch):
    """With ``paired_test`` replaced by a sentinel, every Δ of every summary, headline and index row carries
    the sentinel's verdict (or ``no verdict`` where a side did not learn): nothing else decides."""
    calls = []

    def sentinel(treated, control, *, training_pairs, **_):
        calls.append(training_pairs)
        return {"mean": 0.0, "ci95": None, "low": None, "high": None, "p": None, "n": len(treated),
                "training_pairs": training_pairs, "test": "sentinel", "verdict": SENTINEL}

    for module in (stats, tables, table4, table5, transfer_tables, ablations, study_report):
        if hasattr(module, "paired_test"):
            monkeypatch.setattr(module, "paired_test", sentinel)
    for report, (summary, deltas, head) in _summaries().items():
        assert deltas, report
        for delta in deltas:
            shown = index.delta_verdict(delta)
            assert shown == SENTINEL or (delta.get("learned") is False and shown.startswith("no verdict")), \
                (report, delta)
        verdicts = _headline_verdicts(head)
        assert all(v in (SENTINEL, headline.NO_VERDICT) for v in verdicts), (report, verdicts)
        assert SENTINEL in verdicts or report == "figure1", report
    assert calls


def _seeds(metrics: dict) -> set:
    return {run["seed"] for run in metrics["runs"].values()}


def _independent_pairs() -> dict[str, int | dict[str, int]]:
    """Each report's independent training pairs, counted from its metrics alone: the training seeds of runs
    trained from scratch (and of fine-tunes whose seed s starts from pretraining run s: Tables 1 and 2
    right), the pretraining seeds of fine-tunes of given pretrained pairs (Table 3: ``init_seed``; Table 4:
    the towers' ``tower_seed``; Table 5: the seed in ``pretrained``), one for a model trained once per row
    (Table 7); for Tables 1 and 2 per sweep."""
    seg = _metrics("seg")
    return {
        **{f"table{n}": {s: len(_seeds(_metrics(s))) for s in tables.table_sweeps(n)
                         if (REPO / "metrics" / f"{s}.json").exists()} for n in (1, 2)},
        "table3": len({_metrics("vtab")["init_seed"]}),
        "table4": len({run["tower_seed"] for run in _metrics("lit")["runs"].values()}),
        "table5": len({seg["pretrained"]}) if seg["pretrained"] else len(_seeds(seg)),
        "table6": len(_seeds(_metrics("table6"))),
        "table7": len({_metrics("sun397_scratch")["seed"]}),
        "figure1": len(_seeds(_metrics("figure1"))),
    }


def test_every_verdict_counts_independent_training_runs():
    """Every Δ's ``training_pairs`` is the number of independent training pairs behind it: fine-tuning
    seeds of one pretrained pair (Tables 3 and 5) and LiT seeds of one pair of towers (Table 4) narrow the
    estimate but are not training runs, so with fewer than MIN_PAIRS pretrained pairs no Δ is decided."""
    expected = _independent_pairs()
    summaries = _summaries()
    for n in (1, 2):
        for sweep, pairs in expected[f"table{n}"].items():
            deltas = index.all_deltas(summaries[f"table{n}"][0][sweep])
            assert deltas and all(d["training_pairs"] == pairs for d in deltas), (sweep, pairs, deltas)
    for report in ("table3", "table4", "table5", "table6", "table7", "figure1"):
        deltas = summaries[report][1]
        assert deltas, report
        wrong = [(d["training_pairs"], d["n"]) for d in deltas if d["training_pairs"] != expected[report]]
        assert not wrong, (report, expected[report], wrong)
        if expected[report] < stats.MIN_PAIRS:
            assert {d["verdict"] for d in deltas} == {"not resolved"}, report
    assert expected["table3"] == expected["table5"] == 1  # every profile fine-tunes one pretrained pair
    for report in ("table3", "table4", "table5"):
        assert {stats.verdict_text(d) for d in summaries[report][1]} == {"not resolved (1 pretraining run)"}, report
    for delta in summaries["study"][1]:  # the study trains every seed from scratch
        assert delta["over"] == "seeds" and delta["training_pairs"] == len(delta["seeds"]) == delta["n"]


def test_no_other_module_compares_an_interval_to_zero():
    """Only :mod:`dpnrepro.stats` turns an interval into better / worse."""
    deciding = re.compile(r"outside_ci|\"better\" if|\"worse\" if|\bverdict\(|low\"?\]? > 0|high\"?\]? < 0")
    for path in DECIDING_MODULES:
        hits = [line.strip() for line in path.read_text().splitlines() if deciding.search(line)]
        assert not hits, (path.relative_to(REPO).as_posix(), hits)


def _fewshot_metrics(seeds: int, draws: int, conv: float = 38.0) -> dict:
    """A few-shot sweep where DPN beats conv (``conv`` %) by 6 points on every draw of every seed (±0.2), on a
    `val` split whose majority class is 10 %."""
    runs = {}
    for stem, offset in (("conv", conv), ("dpn", conv + 6.0)):
        for seed in range(seeds):
            accs = [offset + 0.2 * ((seed + d) % 3) + (0.1 * seed if stem == "dpn" else 0.0) for d in range(draws)]
            runs[f"{stem}_s{seed}"] = {"arch": "Mu-7", "stem": stem, "seed": seed, "fewshot_5shot_top1": sum(accs) / draws,
                                       "fewshot_5shot_top1_draws": accs}
    return {"evaluate": "fewshot", "data": {"majority_val": 10.0}, "runs": runs}


def test_table2_draws_of_one_training_run_are_shown_but_never_decide():
    entry = tables.summarize_sweep(_fewshot_metrics(seeds=1, draws=20))["Mu-7"]
    delta = entry["delta_dpn"]
    assert delta["mean"] == pytest.approx(6.0) and delta["low"] > 0  # the draws' spread excludes 0
    assert delta["verdict"] == "not resolved" and stats.verdict_text(delta) == "not resolved (1 training run)"
    assert entry["dpn"]["over"] == "few-shot draws" and delta["over"] == "few-shot draws"
    head = headline.tables_1_2({"jft_220k": {"Mu-7": entry}})["jft_220k"]["Mu-7"]["dpn-conv"]
    assert head["verdict"] == "not resolved (1 training run)"
    assert index.verdict_counts([delta]) == "1: 0 better, 0 worse, 1 not resolved"


def test_tables_1_and_2_give_no_verdict_where_a_side_is_at_chance():
    """The docs' "learned first" rule holds in Tables 1 and 2 as in 3, 5 and 7: conv at 16 %, less than 10
    points above a majority class of 10 %, learned nothing, so DPN's resolved +6 (22 %) gets ``no verdict`` in
    the summary's flag, the headline and the Markdown row."""
    metrics = {**_fewshot_metrics(seeds=3, draws=5, conv=16.0), "recipe": "r"}
    summary = tables.summarize_sweep(metrics)
    entry = summary["Mu-7"]
    assert entry["conv"]["learned"] is False and entry["dpn"]["learned"] is True
    assert entry["delta_dpn"]["verdict"] == "better" and entry["delta_dpn"]["at_chance"] == ["conv"]
    assert headline.tables_1_2({"jft_220k": summary})["jft_220k"]["Mu-7"]["dpn-conv"]["verdict"] == "no verdict"
    context = {"profile": "smoke", "dataset": "d", "val_examples": 1000, "chance": 10.0, "hardware": "h",
               "recipes": {"jft_220k": "r"}}
    row = next(line for line in tables.render_markdown(2, {"jft_220k": metrics}, {"jft_220k": summary},
                                                        context).splitlines() if line.startswith("| Mu-7 |"))
    assert "*at chance*" in row and "| no verdict |" in row and "better" not in row, row
    learned = tables.summarize_sweep(_fewshot_metrics(seeds=3, draws=5))["Mu-7"]
    assert learned["conv"]["learned"] and learned["delta_dpn"]["learned"]


@pytest.mark.parametrize("seeds", [2, 3])
def test_table2_draws_are_averaged_within_each_seed_and_judged_over_seeds(seeds):
    delta = tables.summarize_sweep(_fewshot_metrics(seeds=seeds, draws=5))["Mu-7"]["delta_dpn"]
    assert delta["n"] == delta["training_pairs"] == seeds and delta["over"] == "seeds"
    assert delta["per_seed"] == pytest.approx([6.0 + 0.1 * s for s in range(seeds)])
    assert delta["verdict"] == ("better" if seeds >= stats.MIN_PAIRS else "not resolved")


def test_table5_pairs_fine_tunes_by_pretraining_and_scratch_runs_by_seed():
    from dpnrepro.errors import UserError

    seg = {"pretrained": "runs/table1/Mu-7_<stem>_s0", "chance": {"mIoU": 2.0}, "runs": {
        f"{stem}{seed}": {"stem": stem, "fraction": "1", "seed": seed, "mIoU": 30.0 + 5 * (stem == "dpn") + seed}
        for stem in ("conv", "dpn") for seed in range(4)}}
    fine_tuned = table5.summarize(seg)["1"]["delta_dpn"]
    assert fine_tuned["training_pairs"] == 1 and stats.verdict_text(fine_tuned) == "not resolved (1 pretraining run)"
    scratch = table5.summarize({**seg, "pretrained": None})["1"]["delta_dpn"]
    assert scratch["training_pairs"] == 4 and scratch["verdict"] == "better"
    with pytest.raises(UserError, match="names no pretraining seed"):
        table5.summarize({**seg, "pretrained": "runs/table1/elsewhere"})
