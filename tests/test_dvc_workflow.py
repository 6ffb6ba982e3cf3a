"""The user's DVC workflow: `dvc metrics show/diff` list only the headline numbers, `dvc plots show`
renders every plot dvc.yaml defines, and two dvc.lock files are compared output by output (the end-to-end
test, tests/test_pipeline.py, uses that on the real smoke `dvc repro`)."""

from __future__ import annotations

import json
import re
import sys

import pytest
import yaml

from helpers import REPO, copy_project, differing_outputs, git_init, run

GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
# `dvc metrics show` of the whole repository (paper, study and benchmarks): the smoke profile has 242 values
# (167 of them the paper's); the bound: a few hundred, a diff a person reads.
MAX_METRIC_VALUES = 300
DVC_YAMLS = ("dvc.yaml", "study/dvc.yaml", "benchmarks/dvc.yaml")


def _leaves(tree) -> int:
    return sum(_leaves(v) for v in tree.values()) if isinstance(tree, dict) else 1


def test_only_headline_files_are_dvc_metrics():
    """Every stage that writes a report declares exactly its metrics/headline/<report>.json as metrics; the
    per-run and per-seed files are ordinary uncached outputs."""
    for name in DVC_YAMLS:
        stages = yaml.safe_load((REPO / name).read_text())["stages"]
        for stage, body in stages.items():
            metrics = [next(iter(m)) for m in body.get("metrics", [])]
            assert all(re.fullmatch(r"metrics/headline/[\w-]+\.json", m) for m in metrics), (name, stage, metrics)
            summaries = [next(iter(o)) for o in body.get("outs", []) if next(iter(o)).endswith("_summary.json")]
            if body["cmd"].startswith(("python stages/benchmark.py", "python stages/bench_input.py")):
                assert len(metrics) == 1, (name, stage)  # a wall-clock benchmark: its headline, no summary
            else:
                assert len(metrics) == len(summaries), (name, stage)


def test_headline_verdict_is_the_one_paired_test_recorded():
    from dpnrepro.reports.headline import NO_VERDICT, difference

    assert difference({"mean": 1.0, "ci95": 0.5, "verdict": "better", "n": 3}) == \
        {"mean": 1.0, "ci95": 0.5, "verdict": "better"}
    assert difference({"mean": 1.0, "ci95": None, "verdict": "not resolved", "why": "1 training run"}) == \
        {"mean": 1.0, "verdict": "not resolved (1 training run)"}
    assert difference({"mean": 1.0, "ci95": 0.5, "verdict": "better", "learned": False})["verdict"] == NO_VERDICT
    with pytest.raises(ValueError, match="paired_test"):
        difference({"mean": 1.0, "ci95": 0.5})  # no interval rule of its own


def _build_every_report(root) -> None:
    """What the report stages write, from the committed metrics (no training): tables, ablations, study;
    Figures 2-4 need the runs, so their headline is cut from the committed summary as stages/figures.py does."""
    from dpnrepro.reports import headline
    from dpnrepro.reports.ablations import build_report
    from dpnrepro.reports.build import build_table
    from dpnrepro.reports.table4 import build_table4
    from dpnrepro.reports.table5 import build_table5
    from dpnrepro.reports.transfer_tables import build_transfer_table
    from dpnrepro.study.report import build_study_report

    dirs = {"metrics_dir": root / "metrics", "reports_dir": root / "reports"}
    for table in (1, 2):
        build_table(table, **dirs)
    for table in (3, 7):
        build_transfer_table(table, **dirs)
    build_table4(**dirs)
    build_table5(**dirs)
    for report in ("table6", "figure1"):
        build_report(report, **dirs)
    build_study_report(**dirs)
    summary = json.loads((root / "metrics/figures_summary.json").read_text())
    headline.write_headline("figures", headline.figures(summary), root / "metrics")


@pytest.fixture(scope="module")
def headline_repo(tmp_path_factory):
    root = copy_project(tmp_path_factory.mktemp("headline"))
    _build_every_report(root)
    git_init(root)
    return root


def test_metrics_show_lists_a_few_hundred_values_at_most(headline_repo):
    revs = json.loads(run(["dvc", "metrics", "show", "--json"], headline_repo).stdout)
    (shown,) = (rev["data"] for rev in revs.values())  # one revision: the workspace
    errors = {path: entry["error"] for path, entry in shown.items() if entry.get("error")}
    assert not errors, errors
    counts = {path: _leaves(entry["data"]) for path, entry in shown.items()}
    print(counts, sum(counts.values()))
    assert all(path.startswith("metrics/headline/") for path in counts), sorted(counts)
    declared = {next(iter(m)) for name in DVC_YAMLS
                for body in yaml.safe_load((REPO / name).read_text())["stages"].values()
                for m in body.get("metrics", [])}
    assert set(counts) == declared and all(counts.values())  # 9 paper reports + the study
    assert sum(counts.values()) <= MAX_METRIC_VALUES, counts


def test_metrics_diff_between_two_commits_reads_as_a_table(headline_repo, tmp_path):
    """A second commit where one Table 1 run scores 1 point more (as a changed param would make it): the
    diff is a short Markdown table of exactly the Table 1 numbers that moved."""
    import shutil

    from dpnrepro.reports.build import build_table

    root = tmp_path / "repo"
    shutil.copytree(headline_repo, root, symlinks=True)
    path = root / "metrics/table1.json"
    metrics = json.loads(path.read_text())
    run_metrics = metrics["runs"]["Mu-7_dpn_s0"]
    run_metrics["val_top1"] += 1.0
    path.write_text(json.dumps(metrics))
    build_table(1, metrics_dir=root / "metrics", reports_dir=root / "reports")
    run([*GIT, "commit", "-qam", "dpn s0 +1 point"], root)

    md = run(["dvc", "metrics", "diff", "HEAD~1", "HEAD", "--md"], root).stdout
    print(md)
    assert md.lstrip().startswith("| Path ") and md.count("\n") <= 10, md  # what the user reads: a short table
    diff = json.loads(run(["dvc", "metrics", "diff", "HEAD~1", "HEAD", "--json"], root).stdout)
    assert set(diff) == {"metrics/headline/table1.json"}, diff
    changed = diff["metrics/headline/table1.json"]
    assert set(changed) <= {"table1.Mu/7.dpn", "table1.Mu/7.dpn-conv.mean", "table1.Mu/7.dpn-conv.ci95",
                            "table1.Mu/7.dpn-conv.verdict"}, sorted(changed)
    assert changed["table1.Mu/7.dpn"]["diff"] == pytest.approx(0.5)  # mean over 2 seeds
    assert changed["table1.Mu/7.dpn-conv.mean"]["diff"] == pytest.approx(0.5)
    everything = run(["dvc", "metrics", "diff", "HEAD~1", "HEAD", "--all", "--json"], root).stdout
    assert _leaves(json.loads(everything)) <= 3 * MAX_METRIC_VALUES  # old / new / diff per value


def _plot_files(plots: list[dict]) -> list[str]:
    files = []
    for entry in plots:
        (name, spec), = entry.items()
        files += list(spec["y"]) if isinstance(spec.get("y"), dict) else [name]
    return files


def test_plot_definitions_name_real_files_and_every_curve():
    """dvc.yaml's plots name real files (no globs: DVC does not expand them) and every training curve. That DVC
    renders every one is tests/test_pipeline.py::test_plots_show_renders_every_plot's, on the real outputs of
    the smoke `dvc repro` (a stand-in copy rendered here as well cost a project copy and a DVC process)."""
    plots = yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]
    files = _plot_files(plots)
    assert files and not [f for f in files if set(f) & set("*?[")], "DVC does not expand globs in top-level plots"
    curves = [next(iter(entry)) for entry in plots if next(iter(entry)).startswith("train-")]
    assert curves and {n.split("/")[1] for n in curves} == {"loss", "lr", "stem_grad_norm"}


@pytest.mark.parametrize("profile", ["smoke", "mini", "full"])
def test_curve_plots_name_every_run_the_trainer_writes(profile):
    from dpnrepro.artifacts import run_dir
    from dpnrepro.config.params import load_params
    from dpnrepro.pipeline import curve_plots
    from dpnrepro.runs import sweep_runs

    params = load_params(REPO / "profiles" / f"{profile}.yaml")
    for entry in curve_plots(params):
        (name, spec), = entry.items()
        sweep = name.removeprefix("train-").split("/")[0]
        dirs = [f.split("/dvclive/")[0] for f in spec["y"]]
        assert dirs == [run_dir(sweep, *run).as_posix() for run in sweep_runs(params, sweep)], name


def test_lock_comparison_names_every_output_that_differs():
    def lock(**outs):
        return {"schema": "2.0",
                "stages": {"s": {"cmd": "x", "outs": [{"path": p, "md5": h} for p, h in outs.items()]}}}

    committed = lock(**{"runs/seg": "a.dir", "metrics/m.json": "b", "reports/t.md": "c"})
    ours = lock(**{"runs/seg": "z.dir", "metrics/m.json": "b", "reports/new.md": "d"})
    assert differing_outputs(ours, committed) == [
        "runs/seg: committed a.dir != ours z.dir", "reports/t.md: committed c != ours missing",
        "reports/new.md: committed missing != ours d"]
    assert differing_outputs(committed, committed) == []
    real = yaml.safe_load((REPO / "dvc.lock").read_text())
    assert differing_outputs(real, real) == [] and len(differing_outputs({"stages": {}}, real)) > 40


def _sub_folder_project(root):
    """A DVC project whose ``sub/dvc.yaml`` runs from the root (``wdir: ..``, as study/ and benchmarks/ do):
    ``sub/dvc.yaml:make`` writes a cached folder, an uncached metric and a persist file, and reads the root
    stage ``raw``'s output; its command prints the restore hint it would give into ``hint.txt``."""
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"raw": {"cmd": "echo raw > raw.txt", "outs": ["raw.txt"]}}}))
    hint = ("from pathlib import Path; from dpnrepro.cli import restore_hint; "
            "Path('out').mkdir(); Path('out/a').write_text('a'); Path('metrics').mkdir(exist_ok=True); "
            "Path('metrics/m.json').write_text('{}'); Path('hint.txt').write_text(restore_hint())")
    (root / "sub").mkdir()
    (root / "sub/dvc.yaml").write_text(yaml.safe_dump({"stages": {"make": {
        "cmd": f"{sys.executable} -c \"{hint}\"", "wdir": "..", "deps": ["raw.txt"],
        "outs": ["out", {"hint.txt": {"persist": True, "cache": False}}],
        "metrics": [{"metrics/m.json": {"cache": False}}]}}}))
    git_init(root)
    run(["dvc", "init", "-q"], root)
    return root


def test_stage_outputs_of_a_sub_folder_stage_resolve_wdir_and_keep_dvc_s_flags(tmp_path):
    from dpnrepro.dvc_graph import Output, stage_outputs, upstream_stages

    root = _sub_folder_project(tmp_path / "p")
    assert stage_outputs("sub/dvc.yaml:make", root) == [
        Output("out", cache=True, persist=False, metric=False, plot=False),
        Output("hint.txt", cache=False, persist=True, metric=False, plot=False),
        Output("metrics/m.json", cache=False, persist=False, metric=True, plot=False)]
    assert upstream_stages(["sub/dvc.yaml:make"], root) == ["raw"]


def test_restore_hint_under_a_real_dvc_repro_names_the_paths_a_sub_folder_stage_writes(tmp_path):
    """The hint is computed inside the stage while `dvc repro` holds the repository's lock (no deadlock, no
    lock error), and names the root-relative paths: `git checkout -- metrics/m.json`, not `sub/metrics/...`."""
    from dpnrepro import dvc_graph

    root = _sub_folder_project(tmp_path / "p")
    run(["dvc", "repro", "sub/dvc.yaml"], root, timeout=300)
    assert (root / "hint.txt").read_text() == (
        " (dvc removed this stage's previous outputs before running it; `dvc checkout --force out` and "
        "`git checkout -- metrics/m.json` restores them)")
    assert dvc_graph.status([], root) == {}
    (root / "raw.txt").unlink()
    assert dvc_graph.status(["sub/dvc.yaml"], root) == {"sub/dvc.yaml:make": [{"changed deps": {"raw.txt": "deleted"}}]}
    assert set(dvc_graph.status([], root)) == {"raw", "sub/dvc.yaml:make"}
    assert list(dvc_graph.reproduce(["sub/dvc.yaml"], root)) == ["raw"]  # the same raw.txt again: make is up to date
    times = tmp_path / "times.json"
    ran = dvc_graph.reproduce(["sub/dvc.yaml:make"], root, record=times, force=True, single_item=True)
    assert list(ran) == ["sub/dvc.yaml:make"] and ran["sub/dvc.yaml:make"] > 0
    assert json.loads(times.read_text()) == ran
    assert dvc_graph.status([], root) == {}


def test_the_pipeline_helper_imports_without_dvc():
    out = run([sys.executable, "-c", "import sys, dpnrepro.dvc_graph; print('dvc' in sys.modules)"], REPO).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("command", ["status", "repro"])
def test_the_pipeline_helper_refuses_an_unknown_stage_in_one_line(command):
    proc = run([sys.executable, "-m", "dpnrepro.dvc_graph", command, "no_such_stage"], REPO, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "no_such_stage" in proc.stderr


# DVC's internals (no dvc.api for stages, their graph, reproduce or status): dpnrepro.dvc_graph is the one
# module that uses them; these pin what it relies on, so a DVC upgrade that changes them fails here.
PUBLIC_DVC = ("dvc.api", "dvc.exceptions")


def _dvc_imports(path) -> list[str]:
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    return [m for m in names if m == "dvc" or m.startswith("dvc.")]


def test_only_dvc_graph_imports_dvc_internals():
    tracked = run(["git", "ls-files", "*.py"], REPO).stdout.split()
    owner = "src/dpnrepro/dvc_graph.py"
    internal = {p: [m for m in _dvc_imports(REPO / p) if not m.startswith(PUBLIC_DVC)]
                for p in tracked if (REPO / p).is_file() and p not in (owner, "tests/test_dvc_workflow.py")}
    assert not {p: m for p, m in internal.items() if m}
    assert set(_dvc_imports(REPO / owner)) - set(PUBLIC_DVC) == {"dvc.repo", "dvc.repo.reproduce", "dvc.logger"}


def test_the_dvc_internals_dvc_graph_relies_on_keep_their_signatures():
    import inspect

    from dvc.logger import setup
    from dvc.output import Output as DvcOutput
    from dvc.repo import Repo
    from dvc.repo import reproduce as repro_module
    from dvc.repo.stage import StageLoad

    def params(fn) -> dict:
        return inspect.signature(fn).parameters

    kind = inspect.Parameter
    assert list(params(repro_module._reproduce_stage)) == ["stage", "kwargs"]
    assert params(repro_module._reproduce_stage)["kwargs"].kind is kind.VAR_KEYWORD
    # Repo.reproduce(targets, single_item=, **kwargs) hands **kwargs (force, dry, repro_fn) to _reproduce, whose
    # repro_fn is called per stage as repro_fn(stage, upstream=, force=, **kwargs) instead of _reproduce_stage
    reproduce = params(Repo.reproduce)
    assert list(reproduce)[:2] == ["self", "targets"] and {"single_item", "kwargs"} <= set(reproduce)
    assert params(repro_module._reproduce)["repro_fn"].default is repro_module._reproduce_stage
    assert "repro_fn(stage, upstream=upstream, force=force_stage, **kwargs)" in inspect.getsource(repro_module._reproduce)
    assert list(params(StageLoad.collect))[:2] == ["self", "target"]
    assert list(params(Repo.status))[:2] == ["self", "targets"]
    assert "uninitialized" in params(Repo.__init__)
    assert "index" in vars(Repo)  # the cached index (its graph); repo.stage: the behaviour test below
    assert {"persist", "metric", "plot"} <= set(params(DvcOutput.__init__))  # flags read back as attributes
    assert list(params(setup)) == ["level", "log_colors"]  # dvc.logger.setup(): DVC's log on the terminal


def test_the_dvc_internals_dvc_graph_relies_on_behave_as_it_expects(tmp_path):
    """On a real project: ``repro_fn`` gets each stage with ``upstream``/``force`` and its return value is
    ``_reproduce_stage``'s (None: up to date); ``index.graph`` is a networkx DiGraph with an edge from a stage
    to the stage it depends on; ``stage.collect`` of an address gives that one stage."""
    from pathlib import Path

    import networkx as nx

    from dpnrepro import dvc_graph

    root = _sub_folder_project(tmp_path / "p")
    calls = []
    with dvc_graph.open_repo(root) as repo:
        graph = repo.index.graph
        make, = repo.stage.collect("sub/dvc.yaml:make")
        raw, = repo.stage.collect("raw")
        assert isinstance(graph, nx.DiGraph) and graph.has_edge(make, raw) and not graph.has_edge(raw, make)
        out = make.outs[1]  # hint.txt: persist, not cached
        assert (Path(out.fs_path).name, out.use_cache, out.persist, out.metric, out.plot) == \
            ("hint.txt", False, True, False, False)
        from dvc.repo.reproduce import _reproduce_stage

        def spy(stage, **kwargs):
            result = _reproduce_stage(stage, **kwargs)
            calls.append((dvc_graph.address(stage, repo.root_dir), {"upstream", "force"} <= set(kwargs), result))
            return result

        repo.reproduce(["raw"], repro_fn=spy, single_item=True)
        repo.reproduce(["raw"], repro_fn=spy, single_item=True)
    assert [(name, ok, result is None) for name, ok, result in calls] == [("raw", True, False), ("raw", True, True)]


def test_dvc_log_lines_reach_the_terminal_once():
    """`python -m dpnrepro.dvc_graph repro` (what `make repro` runs) shows each of DVC's lines once: importing DVC
    already installs its console handlers, so a second `dvc.logger.setup()` printed every line twice."""
    import logging

    from dpnrepro.dvc_graph import log_to_terminal

    log_to_terminal()
    log_to_terminal()
    kinds = [(type(h).__name__, h.level) for h in logging.getLogger("dvc").handlers]  # one handler per level
    assert kinds and len(kinds) == len(set(kinds)), kinds
