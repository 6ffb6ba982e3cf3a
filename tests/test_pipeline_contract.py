"""dvc.yaml as the exact contract: generated from one definition of the sweeps, every stage listing exactly
the code it imports and the params it reads, and no execution setting; `dvc status` names exactly the
stages an edit reaches."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from dpnrepro import pipeline
from dpnrepro.codedeps import code_deps, code_files
from dpnrepro.config.sweeps import SWEEPS
from helpers import REPO, clean_env

PAPER_STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
BENCHMARK_STAGES = yaml.safe_load((REPO / "benchmarks/dvc.yaml").read_text())["stages"]
STAGES = {**PAPER_STAGES, **BENCHMARK_STAGES}


def _scripts(body: dict) -> list[str]:
    cmds = body["cmd"] if isinstance(body["cmd"], list) else [body["cmd"]]
    return [cmd.split()[1] for cmd in cmds]


def _loaded(name: str) -> list[str]:
    """The modules stage ``name`` loads by name: an evaluate stage's evaluators (config.sweeps.EVALUATORS)."""
    return pipeline.evaluator_modules([s for s, d in SWEEPS.items() if f"evaluate-{d.report}" == name])


SCRIPTS = sorted({script for body in STAGES.values() for script in _scripts(body)})


def test_dvc_yaml_is_what_the_generator_writes():
    for path, text in pipeline.render_all().items():
        assert path.read_text() == text, f"{path.name}: run `python -m dpnrepro.pipeline`"


def test_every_lock_records_exactly_the_stages_of_its_dvc_yaml():
    """DVC never drops a lock entry of a stage removed from dvc.yaml (the old `fingerprints` stage stayed in
    dvc.lock, outputs and all): a stale entry makes the committed lock disagree with a fresh `dvc repro`."""
    for path in pipeline.render_all():
        lock = path.with_name("dvc.lock")
        if lock.exists():
            defined = set(yaml.safe_load(path.read_text())["stages"])
            recorded = set(yaml.safe_load(lock.read_text())["stages"])
            assert recorded == defined, f"{lock}: stale {sorted(recorded - defined)}, missing {sorted(defined - recorded)}"


def test_every_png_a_pipeline_writes_is_an_image_plot_of_its_dvc_yaml():
    """`dvc plots show` renders every figure: the paper's and the study's (its dvc.yaml runs from the root,
    so its plot paths climb back from study/)."""
    for path, text in pipeline.render_all().items():
        doc = yaml.safe_load(text)
        pngs = {out for body in doc["stages"].values() for o in body.get("outs", [])
                for out in (o if isinstance(o, dict) else {o: None}) if out.endswith(".png")}
        prefix = "" if path == pipeline.DVC_YAML else "../"
        plotted = {next(iter(plot)) for plot in doc.get("plots", [])}
        assert {prefix + png for png in pngs} <= plotted, f"{path.name}: {sorted(pngs)} not all plotted"
    assert "../reports/study.png" in {next(iter(p)) for p in yaml.safe_load(pipeline.STUDY_DVC_YAML.read_text())["plots"]}


def test_the_paper_pipeline_runs_no_benchmark():
    """`dvc repro` (the root dvc.yaml) rebuilds the paper; wall-clock timings live in benchmarks/dvc.yaml,
    run from the project root."""
    assert not any("benchmark" in body["cmd"] or "bench_input" in body["cmd"] for body in PAPER_STAGES.values())
    assert {body["wdir"] for body in BENCHMARK_STAGES.values()} == {".."}


def test_one_train_stage_per_sweep_one_evaluate_stage_per_table_and_tables_follow_the_sweeps():
    from dpnrepro.reports.tables import TABLES

    assert [s.removeprefix("train-") for s in STAGES if s.startswith("train-")] == list(SWEEPS)
    for table, blocks in TABLES.items():
        assert [b.sweep for b in blocks] == [s for s, d in SWEEPS.items() if d.table == table], table
        deps = STAGES[f"table{table}"]["deps"]
        assert [d for d in deps if d.startswith("metrics/")] == [f"metrics/{b.sweep}.json" for b in blocks]
        evaluate = STAGES[f"evaluate-table{table}"]
        assert [next(iter(m)) for m in evaluate["outs"]] == [f"metrics/{b.sweep}.json" for b in blocks]
        assert [d for d in evaluate["deps"] if d.startswith("runs/")] == [f"runs/{b.sweep}" for b in blocks]
    for sweep, definition in SWEEPS.items():
        deps = STAGES[f"train-{sweep}"]["deps"]
        assert ("data/prepared" if definition.dataset == "data" else f"data/upstream/{definition.dataset}") in deps
        assert (f"runs/{definition.init_from}" in deps) == (definition.init_from is not None)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_module_a_stage_loads_is_among_its_code_deps(script):
    """Import the stage script (without running it) and list the project modules Python loaded: each
    must be a dep of the stage. The static closure may hold more (imports inside functions)."""
    probe = (
        "import json, runpy, sys\n"
        f"runpy.run_path({str(REPO / script)!r}, run_name='not_main')\n"
        "print(json.dumps(sorted(m.__file__ for m in list(sys.modules.values())\n"
        f"                       if (getattr(m, '__file__', None) or '').startswith(({str(REPO / 'src')!r},\n"
        f"                                                                          {str(REPO / 'stages')!r})))))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                         check=True)
    loaded = {str(__import__("pathlib").Path(f).relative_to(REPO)) for f in json.loads(out.stdout.splitlines()[-1])}
    assert loaded <= set(code_files(script)), sorted(loaded - set(code_files(script)))
    name, body = next((name, body) for name, body in STAGES.items() if script in _scripts(body))
    assert [d for d in body["deps"] if d.startswith(("src/", "stages/"))] == list(code_deps(script, *_loaded(name)))


def test_an_evaluate_stage_depends_on_the_evaluators_it_runs_and_no_other():
    """stages/evaluate.py loads each sweep's evaluator by name (config.sweeps.EVALUATORS): its stage for a
    report lists the code of those evaluators, so a few-shot edit reruns no top-1-only report."""
    from dpnrepro.config.sweeps import EVALUATORS, reports

    for report in reports():
        evaluators = {SWEEPS[s].evaluate for s, d in SWEEPS.items() if d.report == report}
        deps = set(PAPER_STAGES[f"evaluate-{report}"]["deps"])
        for name, ev in EVALUATORS.items():
            assert (f"src/dpnrepro/{ev.module.split('.', 1)[1].replace('.', '/')}.py" in deps) == (name in evaluators), \
                (report, name)
    assert {SWEEPS[s].evaluate for s, d in SWEEPS.items() if d.report == "table1"} == {"top1", "fewshot"}
    assert "src/dpnrepro/evaluation/fewshot.py" not in PAPER_STAGES["evaluate-table6"]["deps"]


def _sections_read(path) -> set[str]:
    """The concern sections of params.yaml (config.params.SECTIONS) a file reads: ``params.<section>``,
    ``self.params.<section>``, ``load_params().<section>``."""
    import ast

    from dpnrepro.config.params import SECTIONS

    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in SECTIONS
            and "params" in ast.unparse(node.value)}


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_stage_depends_on_the_config_module_of_every_section_it_reads(script):
    """load_params validates every section, loading the concern modules by name, so the code that reads a
    section must import its module for the stage to depend on it (and to rerun when its schema changes)."""
    from dpnrepro.config.params import SECTIONS

    files = code_files(script)
    read = {section for f in files for section in _sections_read(f)}
    assert {f"src/dpnrepro/config/{SECTIONS[s].module}.py" for s in read} <= set(files), read


def test_a_lit_config_edit_reruns_the_lit_stages_only():
    """The point of config by concern: a LiT schema edit reaches no training sweep."""
    users = {name for name, body in PAPER_STAGES.items()
             if any(d in ("src/dpnrepro/config/lit.py", "src/dpnrepro/config") for d in body["deps"])}
    assert users == {"lit_captions", "lit_train", "lit_evaluate", "reports_index"}, users


def test_code_deps_follow_imports_inside_functions(tmp_path):
    root = tmp_path
    (root / "src/dpnrepro/sub").mkdir(parents=True)
    (root / "stages").mkdir()
    (root / "src/dpnrepro/__init__.py").write_text("")
    (root / "src/dpnrepro/sub/__init__.py").write_text("")
    (root / "src/dpnrepro/sub/a.py").write_text("def f():\n    from .b import g\n    return g\n")
    (root / "src/dpnrepro/sub/b.py").write_text("g = 1\n")
    (root / "src/dpnrepro/unused.py").write_text("")
    (root / "stages/s.py").write_text("from dpnrepro.sub.a import f\n")
    assert code_files("stages/s.py", root) == (
        "src/dpnrepro/__init__.py", "src/dpnrepro/sub/__init__.py", "src/dpnrepro/sub/a.py",
        "src/dpnrepro/sub/b.py", "stages/s.py")


def test_no_stage_tracks_execution_settings():
    for name, body in STAGES.items():
        for param in body.get("params", []):
            assert param != "runtime" and not param.endswith(".runtime"), (name, param)
            assert param.split(".")[-1] not in {"eval_batch_size", "log_every", "ckpt_every", "workers", "devices"}


def test_ablation_and_figure_stages():
    """Table 6 and Figure 1 follow their sweeps like the tables; Figures 2-4 read table1's runs."""
    from dpnrepro.config.sweeps import reports

    assert reports()[-2:] == ["table6", "figure1"]
    assert "figure1.variants" in STAGES["train-figure1"]["params"]
    assert "figure1.variants" in STAGES["evaluate-figure1"]["params"]
    assert STAGES["evaluate-figure1"]["cmd"] == "python stages/evaluate.py --report figure1"
    for report in ("table6", "figure1"):
        assert STAGES[report]["cmd"] == f"python stages/ablations.py --report {report}"
        assert f"metrics/{report}.json" in STAGES[report]["deps"]
        assert [next(iter(o)) for o in STAGES[report]["outs"]] == [f"reports/{report}.md", f"reports/{report}.png",
                                                                   f"metrics/{report}_summary.json"]
    assert ("reports/paper" in STAGES["table6"]["deps"]) and ("reports/paper" not in STAGES["figure1"]["deps"])
    figs = STAGES["figures"]
    assert "runs/table1" in figs["deps"] and STAGES["figures"]["params"] == ["figures"]
    assert {f"reports/figure{n}.png" for n in (2, 3, 4)} <= {next(iter(o)) for o in figs["outs"]}


def test_each_stage_lists_its_code_params_and_data():
    """dvc.yaml is pipeline.stages() as is: no generated input between an edit and the stages it reaches."""
    assert PAPER_STAGES == pipeline.stages()
    for name, body in PAPER_STAGES.items():
        scripts = _scripts(body)
        code = [d for d in body["deps"] if d.startswith(("src/", "stages/"))]
        assert code == sorted({d for s in scripts for d in code_deps(s, *_loaded(name))}), name


def _stub_data(root, stages: dict) -> None:
    """A stand-in for every output of ``stages`` and every data dep missing from ``root`` (a file where the
    path has a suffix, else a directory)."""
    for body in stages.values():
        outs = [o if isinstance(o, str) else next(iter(o)) for o in [*body.get("outs", []), *body.get("metrics", [])]]
        for rel in [*outs, *(d for d in body["deps"] if not (root / d).exists())]:
            path = root / rel
            if path.suffix:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("stub\n")
            else:
                path.mkdir(parents=True, exist_ok=True)
                (path / "stub").write_text("stub\n")


def _covers(dep: str, path: str) -> bool:
    """A dep (a file, a directory, a params key or section) covers ``path`` (a file or a dotted key)."""
    return path == dep or path.startswith(dep + ("/" if "/" in path else "."))


def test_dvc_status_names_exactly_the_stages_an_edit_reaches(tmp_path):
    """In a scratch copy with an up-to-date lock (`dvc commit -f` over stand-in data: nothing runs),
    `dvc status` names exactly the stages whose params or code the edit touches, as the generator lists
    them, with no manual step: a tracked param (vtab.lrs), a module only the LiT stages import, and an
    execution setting (runtime), which reaches none."""
    from helpers import copy_project, git_init, run

    root = copy_project(tmp_path / "proj")
    stages = pipeline.stages()
    _stub_data(root, stages)
    git_init(root)
    run(["dvc", "commit", "-f", "dvc.yaml"], root)

    def changed() -> set[str]:
        return set(json.loads(run(["dvc", "status", "--json", "dvc.yaml"], root).stdout))

    assert changed() == set()
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["vtab"]["lrs"] = [*params["vtab"]["lrs"], 0.1]
    params["runtime"]["eval_batch_size"] = 7
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    edited = "src/dpnrepro/lit/towers.py"
    with open(root / edited, "a") as f:
        f.write("# an edit\n")
    expected = {name for name, body in stages.items()
                if any(_covers(d, edited) for d in body["deps"])
                or any(_covers(p, "vtab.lrs") for p in body.get("params", []))}
    assert expected == {"vtab", "lit_train", "lit_evaluate"}  # what a reader of the code expects
    assert changed() == expected


def test_the_generator_refuses_malformed_study_params_in_one_line(tmp_path, monkeypatch, capsys):
    """`python -m dpnrepro.pipeline` on a malformed study/params.yaml: one `error:` line and exit 2, nothing
    written (was a ParamsError traceback)."""
    from dpnrepro import pipeline
    from dpnrepro.errors import ParamsError

    def malformed():
        raise ParamsError("study/params.yaml: cells.x.image_size 27 is not a multiple of the patch size 7")

    monkeypatch.setattr(pipeline, "render_all", malformed)
    assert pipeline.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: study/params.yaml") and err.count("\n") == 1


def test_the_generator_writes_the_project_it_runs_in_or_refuses(tmp_path):
    """Run inside another checkout (a test's scratch copy), `python -m dpnrepro.pipeline` once rewrote the
    imported checkout's dvc.yaml from its params.yaml and left the copy's stale. It now refuses in one line
    (exit 2, nothing written) unless that checkout's src/ is the one imported."""
    from helpers import checkout_env, copy_project, run, tiny_params, write_params

    root = copy_project(tmp_path / "proj")
    params = tiny_params()
    params["table1"]["seeds"] = [0, 1, 7]  # dvc.yaml's plots name every run of a sweep
    write_params(root, params)
    before = {path: path.read_bytes() for path in pipeline.render_all()}
    ours = root / "dvc.yaml"
    committed = ours.read_bytes()
    refused = run([sys.executable, "-m", "dpnrepro.pipeline"], root, check=False)
    assert refused.returncode == 2 and refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
    assert f"PYTHONPATH={root.resolve()}/src" in refused.stderr
    assert {path: path.read_bytes() for path in before} == before and ours.read_bytes() == committed
    run([sys.executable, "-m", "dpnrepro.pipeline"], root, env=checkout_env(root))
    assert ours.read_bytes() != committed and "runs/table1/Mu-7_dpn_s7/" in ours.read_text()
    assert {path: path.read_bytes() for path in before} == before  # the imported checkout untouched
