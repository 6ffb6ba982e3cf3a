"""dvc.yaml as the exact contract: generated from one definition of the sweeps, every stage depending on
exactly the code it imports and on no execution setting (through its fingerprint, fingerprints/<stage>.json)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from dpnrepro import pipeline
from dpnrepro.codedeps import code_deps, code_files
from dpnrepro.config import SWEEPS
from helpers import REPO

PAPER_STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
BENCHMARK_STAGES = yaml.safe_load((REPO / "benchmarks/dvc.yaml").read_text())["stages"]
STAGES = {**PAPER_STAGES, **BENCHMARK_STAGES}
# what each stage depends on (its code deps and params reach DVC through its fingerprint)
EXACT = {**pipeline.exact_stages(), **BENCHMARK_STAGES}


def _scripts(body: dict) -> list[str]:
    cmds = body["cmd"] if isinstance(body["cmd"], list) else [body["cmd"]]
    return [cmd.split()[1] for cmd in cmds]


SCRIPTS = sorted({script for body in STAGES.values() for script in _scripts(body)})


def test_dvc_yaml_is_what_the_generator_writes():
    for path, text in pipeline.render_all().items():
        assert path.read_text() == text, f"{path.name}: run `python -m dpnrepro.pipeline`"


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
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    loaded = {str(__import__("pathlib").Path(f).relative_to(REPO)) for f in json.loads(out.stdout.splitlines()[-1])}
    assert loaded <= set(code_files(script)), sorted(loaded - set(code_files(script)))
    if script == "stages/fingerprints.py":  # reads every stage's code: depends on all of it
        assert PAPER_STAGES[pipeline.FINGERPRINT_STAGE]["deps"] == list(pipeline.CODE_ROOTS)
        assert all(f.startswith(tuple(r + "/" for r in pipeline.CODE_ROOTS)) for f in code_files(script))
        return
    stage_deps = next(body["deps"] for body in EXACT.values() if script in _scripts(body))
    assert [d for d in stage_deps if d.startswith(("src/", "stages/"))] == list(code_deps(script))


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
    for name, body in {**STAGES, **EXACT}.items():
        for param in body.get("params", []):
            assert param != "runtime" and not param.endswith(".runtime"), (name, param)
            assert param.split(".")[-1] not in {"eval_batch_size", "log_every", "ckpt_every", "workers", "devices"}


def test_ablation_and_figure_stages():
    """Table 6 and Figure 1 follow their sweeps like the tables; Figures 2-4 read table1's runs."""
    from dpnrepro.config import reports

    assert reports()[-2:] == ["table6", "figure1"]
    assert "figure1.variants" in EXACT["train-figure1"]["params"]
    assert "figure1.variants" in EXACT["evaluate-figure1"]["params"]
    assert STAGES["evaluate-figure1"]["cmd"] == "python stages/evaluate.py --report figure1"
    for report in ("table6", "figure1"):
        assert STAGES[report]["cmd"] == f"python stages/ablations.py --report {report}"
        assert f"metrics/{report}.json" in STAGES[report]["deps"]
        assert [next(iter(o)) for o in STAGES[report]["outs"]] == [f"reports/{report}.md", f"reports/{report}.png",
                                                                   f"metrics/{report}_summary.json"]
    assert ("reports/paper" in STAGES["table6"]["deps"]) and ("reports/paper" not in STAGES["figure1"]["deps"])
    figs = STAGES["figures"]
    assert "runs/table1" in figs["deps"] and EXACT["figures"]["params"] == ["figures"]
    assert {f"reports/figure{n}.png" for n in (2, 3, 4)} <= {next(iter(o)) for o in figs["outs"]}


def test_each_stage_depends_on_its_fingerprint_and_its_data():
    """dvc.yaml = exact_stages with each stage's code deps and params replaced by its fingerprint, written by
    the first stage, which reads every code file and exactly the union of the stages' params."""
    exact = pipeline.exact_stages()
    first, *rest = PAPER_STAGES
    assert first == pipeline.FINGERPRINT_STAGE and rest == list(exact)
    for name, body in exact.items():
        ours = PAPER_STAGES[name]
        assert ours["deps"] == [f"fingerprints/{name}.json",
                                *(d for d in body["deps"] if not d.startswith(("src/", "stages/")))], name
        assert "params" not in ours, name
        assert {k: v for k, v in ours.items() if k != "deps"} == {k: v for k, v in body.items()
                                                                  if k not in ("deps", "params")}, name
    fp = PAPER_STAGES[pipeline.FINGERPRINT_STAGE]
    assert fp["params"] == list(dict.fromkeys(k for body in exact.values() for k in body.get("params", [])))
    assert fp["outs"] == [{f"fingerprints/{name}.json": {"cache": False}} for name in exact]


def _project(tmp_path):
    import shutil

    for part in pipeline.CODE_ROOTS:
        shutil.copytree(REPO / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    return tmp_path


def test_a_fingerprint_holds_exactly_the_stage_code_files_and_params(tmp_path):
    import hashlib

    root = _project(tmp_path)
    (root / "src/dpnrepro/__pycache__").mkdir(exist_ok=True)
    (root / "src/dpnrepro/__pycache__/x.pyc").write_bytes(b"not code")  # .dvcignore hides these from DVC
    params = yaml.safe_load((root / "params.yaml").read_text())
    prints = {path: json.loads(text) for path, text in pipeline.fingerprints(root).items()}
    assert list(prints) == [f"fingerprints/{name}.json" for name in pipeline.exact_stages()]
    for name, body in pipeline.exact_stages().items():
        fp = prints[f"fingerprints/{name}.json"]
        scripts = _scripts(body)
        assert sorted(fp["code"]) == sorted({f for s in scripts for f in code_files(s)}), name
        for rel, md5 in fp["code"].items():
            assert md5 == hashlib.md5((root / rel).read_bytes()).hexdigest()
        assert list(fp["params"]) == body.get("params", []), name
        for key, value in fp["params"].items():
            section, *rest = key.split(".")
            expected = params[section]
            for part in rest:
                expected = expected[part]
            assert value == expected, (name, key)


def test_a_fingerprint_changes_exactly_when_the_stage_code_or_params_change(tmp_path):
    """Editing a file changes the fingerprints of the stages importing it and no other; editing an
    execution setting changes none; editing a tracked param changes those of the stages reading it."""
    root = _project(tmp_path)
    exact = pipeline.exact_stages()
    before = pipeline.fingerprints(root)

    def changed():
        now = pipeline.fingerprints(root)
        return {path.removeprefix("fingerprints/").removesuffix(".json") for path in now if now[path] != before[path]}

    edited = "src/dpnrepro/reports/tables.py"
    with open(root / edited, "a") as f:
        f.write("# an edit\n")
    importers = {name for name, body in exact.items() if any(edited in code_files(s) for s in _scripts(body))}
    assert importers and "train-table1" not in importers and changed() == importers
    (root / edited).write_bytes((REPO / edited).read_bytes())
    assert changed() == set()

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["runtime"]["eval_batch_size"] = 7
    params["splus"]["runtime"] = {"log_every": 2}
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert changed() == set()
    params["train"]["lr"] = params["train"]["lr"] * 2
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert changed() == {name for name, body in exact.items() if "train" in body.get("params", [])}


def test_the_fingerprints_stage_writes_into_the_workspace_it_runs_in(tmp_path, monkeypatch):
    """DVC runs the stage in the workspace whose files it hashes (a scratch copy in the end-to-end tests),
    which need not be the checkout dpnrepro is imported from."""
    root = _project(tmp_path)
    monkeypatch.chdir(root)
    (root / "fingerprints").mkdir()
    (root / "fingerprints/a_removed_stage.json").write_text("{}\n")
    pipeline.write_fingerprints()
    assert sorted(p.name for p in (root / "fingerprints").iterdir()) == sorted(
        f"{name}.json" for name in pipeline.exact_stages())
    assert {f"fingerprints/{p.name}": p.read_text() for p in (root / "fingerprints").iterdir()} == \
        pipeline.fingerprints(root)
