"""Every command the documentation shows runs, or names the test that runs the same path.

The shell blocks of README.md, docs/*.md, benchmarks/measured/README.md and reports/benchmarks_gpu.md are
read with mktestdocs. Each simple command in them (split at `&&`, `;` and `|`, comments and leading
`VAR=value` dropped) is one of:

- cheap: run for real in a scratch copy of the project (`dvc status`, `dvc metrics diff`, ...);
- long (training, GPUs, the network, the whole suite): listed in LONG with the test that runs the same path,
  and that test must exist; a `python SCRIPT` it names must answer `--help` from a clean shell and define
  every `--flag` the command passes, a `bash SCRIPT` must exist and define a `phase_<name>` for each
  phase it is given.

A command that is neither fails, and so does a guarantee in the README that names a test which does not
exist. Every command, cheap or long, must also name what exists (read, not run): a Makefile target, a DVC
stage or pipeline file, a params key, a script, module or test file. This is the one checker of the
documented commands (tests/test_docs.py checks the pages' links and quoted paths)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml
from helpers import REPO, checkout_env, copy_project, dvc_files, dvc_outputs, git_init, make_targets, run
from mktestdocs import grab_code_blocks

DOC_FILES = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")),
             "benchmarks/measured/README.md", "reports/benchmarks_gpu.md", "reports/reliability.md")

# What the suite gives every command: the project's interpreter and dvc on PATH, the repository as cwd.
ENVIRONMENT = {"source .venv/bin/activate", "cd /path/to/clone"}

# Run for real in a scratch copy (git-initialised, two commits), each exit status 0.
CHEAP = {
    "dvc status",
    "dvc params diff",
    "dvc metrics diff",
    "dvc metrics diff HEAD~1 --md",
    "dvc metrics show",
    "dvc metrics show metrics/headline/table1.json",
    "python -m dpnrepro.pipeline --check",
    "python -c 'import torch; print(torch.cuda.is_available())'",
    "mkdir -p $RUN_DIR",
    "git add .dvc/config",
}

# Long commands, by their leading words: the test that runs the same path.
LONG = {
    "make repro": "tests/test_pipeline.py::test_committed_metrics_and_tables_are_what_the_pipeline_produces",
    "make test": "tests/test_workflow.py::test_every_run_step_is_a_make_target_or_a_script_the_suite_runs",
    "make env": "tests/test_fresh_clone.py::test_a_clone_with_nothing_beside_it_collects_and_skips_the_paper_tests_naming_the_variable",
    "make profile": "tests/test_docs.py::test_make_profile_sets_up_before_it_touches_params_yaml",
    "make pr-report": "tests/test_pr_report.py::test_a_params_change_that_reaches_table6_reports_its_params_stages_metrics_and_tables",
    "make gpu-carry": "tests/test_gpu_carry.py::test_the_torch_stub_is_the_gpu_machines_version_without_dependencies",
    "dvc repro study/dvc.yaml": "tests/test_study.py::test_runs_are_bit_identical_whatever_the_worker_count_and_report_builds",
    "dvc repro benchmarks/dvc.yaml": "tests/test_benchmark.py::test_stage_cli_writes_outputs",
    "dvc repro -s -f": "tests/test_pipeline.py::test_table_regenerates_byte_identical_from_cached_metrics",
    "dvc repro": "tests/test_pipeline.py::test_committed_metrics_and_tables_are_what_the_pipeline_produces",
    "dvc exp run": "tests/test_pipeline.py::test_param_change_shows_in_params_and_metrics_diff",
    "dvc plots": "tests/test_pipeline.py::test_plots_show_renders_every_plot",
    "dvc remote add": "tests/test_dvc_pack.py::test_a_clone_of_the_same_revision_pulls_the_packed_outputs_and_regenerates_the_report_without_training",
    "dvc push": "tests/test_dvc_pack.py::test_a_clone_of_the_same_revision_pulls_the_packed_outputs_and_regenerates_the_report_without_training",
    "dvc pull": "tests/test_dvc_pack.py::test_a_clone_of_the_same_revision_pulls_the_packed_outputs_and_regenerates_the_report_without_training",
    "git add": "tests/test_pr_report.py::test_a_params_change_that_reaches_table6_reports_its_params_stages_metrics_and_tables",
    "git commit": "tests/test_pr_report.py::test_a_params_change_that_reaches_table6_reports_its_params_stages_metrics_and_tables",
    "sbatch": "tests/test_distributed.py::test_two_node_agents_on_loopback_match_one_node",
    "python tools/pr_report.py": "tests/test_pr_report.py::test_a_params_change_that_reaches_table6_reports_its_params_stages_metrics_and_tables",
    "python tools/dvc_pack.py": "tests/test_dvc_pack.py::test_a_clone_of_the_same_revision_pulls_the_packed_outputs_and_regenerates_the_report_without_training",
    "python stages/segment.py": "tests/test_faults.py::test_single_run_flags_name_only_runs_the_params_define",
    "python stages/bench_input.py": "tests/test_benchmark.py::test_input_stage_cli_writes_outputs",
    "python stages/benchmark.py": "tests/test_benchmark.py::test_stage_cli_writes_outputs",
    "python -m pip download": "tests/test_gpu_carry.py::test_the_gpu_machines_packages_are_dropped_whatever_their_spelling",
    "bash benchmarks/measured/gpu_check.sh": "tests/test_gpu_check.py::test_the_dry_run_from_a_bare_checkout_repros_twice_resumes_a_killed_run_and_hands_back",
}

TEST_ID = re.compile(r"tests/test_\w+\.py(?:::\w+)?")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def simple_commands(block: str) -> list[list[str]]:
    """The simple commands of a shell block, each as its words (comments and leading assignments dropped)."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token in {"&&", "||", ";", "|", "&"}:
                while words and ASSIGNMENT.match(words[0]):
                    words.pop(0)
                if words:
                    commands.append(words)
                words = []
            else:
                words.append(token)
    return commands


def normalised(words: list[str]) -> str:
    """The command as the tables above spell it: the venv's interpreter and `python3` read as `python`."""
    if words[0] in {".venv/bin/python", "python3"}:
        words = ["python", *words[1:]]
    return " ".join(w if re.fullmatch(r"[\w@%+=:,./~$*{}\-]+", w) else shlex.quote(w) for w in words)


@cache
def documented() -> list[tuple[str, str]]:
    """(page, command) of every simple command in a shell block of the documentation."""
    found = []
    for rel in DOC_FILES:
        text = (REPO / rel).read_text()
        for lang in ("bash", "sh", "shell"):
            for block in grab_code_blocks(text, lang=lang):
                found += [(rel, normalised(words)) for words in simple_commands(block)]
    return found


def long_entry(command: str) -> str | None:
    """The LONG key that ``command`` starts with (the longest), or None."""
    keys = [k for k in LONG if command == k or command.startswith(k + " ")]
    return max(keys, key=len) if keys else None


def named_test_exists(test_id: str) -> bool:
    path, _, name = test_id.partition("::")
    source = REPO / path
    return source.is_file() and (not name or re.search(rf"^def {name}\(", source.read_text(), re.M) is not None)


def unexplained(commands: list[tuple[str, str]]) -> list[str]:
    return [f"{page}: `{cmd}`: neither run by this test (CHEAP) nor listed as long with its test (LONG)"
            for page, cmd in commands if cmd not in ENVIRONMENT | CHEAP and long_entry(cmd) is None]


def test_every_fenced_block_with_commands_is_a_shell_block():
    """An unlabelled fence would hide its commands from this test: every fence names its language."""
    bare = []
    for rel in DOC_FILES:
        inside = False
        for n, line in enumerate((REPO / rel).read_text().splitlines(), 1):
            if line.startswith("```"):
                if not inside and line.strip() == "```":
                    bare.append(f"{rel}:{n}")
                inside = not inside
    assert not bare, f"fences without a language (use bash, python or text): {bare}"


def test_every_documented_command_is_run_here_or_listed_as_long():
    assert documented(), "no shell block found: the documentation pages moved?"
    assert not unexplained(documented()), "\n".join(unexplained(documented()))


def test_the_tests_named_for_long_commands_and_guarantees_exist():
    named = set(LONG.values())
    for rel in DOC_FILES:
        named |= set(TEST_ID.findall((REPO / rel).read_text()))
    missing = sorted(t for t in named if not named_test_exists(t))
    assert not missing, f"named tests that do not exist: {missing}"


# ------------------------------------------------------ every command names what exists (read, not run) --
@cache
def dvc_stages() -> dict[str, frozenset[str]]:
    """dvc.yaml path -> its stage names."""
    return {f: frozenset((yaml.safe_load((REPO / f).read_text()) or {}).get("stages") or {}) for f in dvc_files()}


@cache
def params_keys() -> frozenset[str]:
    keys = set()

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                keys.add(prefix + str(k))
                walk(v, prefix + str(k) + ".")
    for f in ("params.yaml", "study/params.yaml"):
        walk(yaml.safe_load((REPO / f).read_text()), "")
    return frozenset(keys)


def module_exists(name: str) -> bool:
    top = name.split(".")[0]
    if top == "dpnrepro":
        base = REPO / "src" / Path(*name.split("."))
        return base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _stage_target_error(target: str) -> str | None:
    """``target`` of ``dvc repro``/``status``/...: a stage of dvc.yaml, a dvc.yaml file, or file:stage."""
    file, _, stage = target.rpartition(":") if ":" in target else ("", "", target)
    if target.endswith("dvc.yaml"):
        file, stage = target, ""
    if file:
        if file not in dvc_stages():
            return f"no pipeline file {file}"
        return None if not stage or stage in dvc_stages()[file] else f"no stage {stage!r} in {file}"
    return None if stage in dvc_stages().get("dvc.yaml", ()) else f"no stage {stage!r} in dvc.yaml"


def command_error(words: list[str]) -> str | None:
    """Why the command ``words`` names something that does not exist, or None."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # FOO=1 cmd
        words = words[1:]
    if not words:
        return None
    prog, args = words[0], words[1:]
    if prog == "make":
        for a in args:
            if a.startswith("-") or "=" in a:
                continue
            if a not in make_targets():
                return f"no Makefile target {a!r}"
        return None
    if prog in ("python", "python3"):
        if args[:1] == ["-m"] and len(args) > 1:
            if not module_exists(args[1]):
                return f"no module {args[1]}"
            rest = args[2:]
        elif args and not args[0].startswith("-"):
            if not (REPO / args[0]).is_file():
                return f"no script {args[0]}"
            rest = args[1:]
        else:
            return None
        for a in rest:  # files a command reads (python -m pytest tests/test_x.py)
            if re.fullmatch(r"[\w./-]+\.py(::\S+)?", a) and not (REPO / a.split("::")[0]).is_file():
                return f"no file {a}"
        return None
    if prog == "torchrun":
        scripts = [a for a in args if a.endswith(".py")]
        return None if all((REPO / s).is_file() for s in scripts) else f"no script among {scripts}"
    if prog == "bash" and args and args[0].endswith(".sh"):
        return None if (REPO / args[0]).is_file() else f"no script {args[0]}"
    if prog != "dvc" or not args:
        return None
    sub = args[0]
    if sub == "exp" and args[1:2] == ["run"]:
        sub, args = "exp run", args[1:]
    rest = args[1:]
    positional, i = [], 0
    while i < len(rest):
        a = rest[i]
        if a in ("-S", "--set-param"):
            key = rest[i + 1].split("=", 1)[0]
            key = key.split(":", 1)[1] if ":" in key else key
            if key not in params_keys():
                return f"no params key {key!r} (dvc exp run -S)"
            i += 2
            continue
        if a in ("-s", "--single-item"):
            i += 1
            continue
        if a.startswith("-"):
            i += 1
            continue
        positional.append(a)
        i += 1
    if sub in ("repro", "exp run", "status", "push", "pull", "commit", "fetch", "checkout"):
        for t in positional:
            if "/" in t and not t.endswith("dvc.yaml") and ":" not in t and sub != "repro":
                if not (REPO / t).exists() and t not in dvc_outputs():
                    return f"no file or output {t}"
                continue
            err = _stage_target_error(t)
            if err:
                return err
        return None
    if sub in ("metrics", "plots", "params"):
        for t in positional[1:]:
            if re.search(r"\.(json|yaml|csv|tsv|png)$", t) and not (REPO / t).exists() and t not in dvc_outputs():
                return f"no file {t}"
        return None
    return None




def test_every_documented_command_names_what_exists():
    """A Makefile target, DVC stage or pipeline file, params key (``dvc exp run -S``), script or module."""
    errors = [f"{page}: `{cmd}`: {why}" for page, cmd in documented() if (why := command_error(shlex.split(cmd)))]
    assert not errors, "commands in the docs that name what does not exist:\n" + "\n".join(errors)


def test_the_name_checker_catches_what_is_broken():
    broken = [["make", "no-such-target"], ["dvc", "repro", "no_such_stage"], ["dvc", "repro", "study/dvc.yaml:nope"],
              ["python", "-m", "dpnrepro.no_such_module"], ["python", "stages/no_such_stage.py"],
              ["dvc", "exp", "run", "-S", "train.no_such_key=1"], ["PROFILE=mini", "make", "profle"],
              ["python", "-m", "pytest", "tests/test_no_such_file.py"]]
    for words in broken:
        assert command_error(words), f"not caught: {' '.join(words)}"
    fine = [["make", "profile", "PROFILE=mini"], ["dvc", "repro"], ["dvc", "repro", "table1"], ["make", "test"],
            ["dvc", "repro", "benchmarks/dvc.yaml"], ["python", "-m", "dpnrepro.pipeline"],
            ["dvc", "exp", "run", "-S", "train.lr=0.002"], ["dvc", "metrics", "diff", "HEAD~1", "--md"]]
    for words in fine:
        assert command_error(words) is None, f"refused: {' '.join(words)}: {command_error(words)}"


def shell_script_problems(words: list[str]) -> list[str]:
    """What is wrong with ``bash SCRIPT ARGS``: a missing script, or an argument that is not one of its phases."""
    script = REPO / words[1]
    if not script.is_file():
        return [f"{words[1]}: no such script"]
    phases = set(re.findall(r"^phase_(\w+)\(\)", script.read_text(), re.M))
    return [f"{words[1]}: {arg!r} is not one of its phases {sorted(phases)}" for arg in words[2:] if arg not in phases]


def python_script_problems(words: list[str], help_text: str) -> list[str]:
    """Flags of ``python SCRIPT ...`` that the script's ``--help`` does not define."""
    flags = {w.split("=", 1)[0] for w in words if w.startswith("--")}
    return [f"{' '.join(words[:2])}: no option {flag}" for flag in sorted(flags) if flag not in help_text]


def script_of(words: list[str]) -> list[str] | None:
    """``python SCRIPT`` / ``python -m MODULE`` of a Python command, else None."""
    if words[0] != "python" or len(words) < 2:
        return None
    if words[1] == "-m":
        return None if words[2] == "pip" else words[:3]
    return None if words[1] == "-c" else words[:2]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A copy of the project as git sees it, committed twice (so `HEAD~1` exists)."""
    root = copy_project(tmp_path_factory.mktemp("doc_commands"))
    git_init(root)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "second"], root)
    return root


def help_in_process(script: list[str]) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``python SCRIPT --help`` (``python -m MODULE --help``) run in this
    process: argparse prints and exits before the script does any work. That each script answers --help from a
    clean shell is tests/test_stage_arguments.py's (stages) and tests/test_scripts_clean_shell.py's (tools,
    modules); here only the flags its help text defines are read, without a process of its own."""
    import contextlib
    import io
    import runpy

    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    code = 0
    try:
        sys.argv = [script[-1], "--help"]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if script[1] == "-m":
                runpy.run_module(script[2], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(REPO / script[1]), run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def test_long_commands_name_scripts_phases_and_flags_that_exist():
    problems = []
    helps: dict[tuple[str, ...], str] = {}
    for page, cmd in documented():
        words = shlex.split(cmd)
        if long_entry(cmd) is None:
            continue
        if words[0] == "bash":
            problems += [f"{page}: {p}" for p in shell_script_problems(words)]
        elif (script := script_of(words)) is not None:
            key = tuple(script)
            if key not in helps:
                code, stdout, stderr = help_in_process(script)
                helps[key] = stdout if code == 0 else ""
                if code:
                    problems.append(f"{page}: `{' '.join(script)} --help` exits {code}: {stderr.strip()[-300:]}")
            if helps[key]:
                problems += [f"{page}: {p}" for p in python_script_problems(words, helps[key])]
    assert not problems, "\n".join(problems)


def test_cheap_commands_run_for_real_in_a_scratch_copy(scratch):
    env = checkout_env(scratch)
    failed = []
    for cmd in sorted({cmd for _, cmd in documented() if cmd in CHEAP}):
        words = shlex.split(cmd)
        if words[0] == "python":
            words[0] = sys.executable
        if words[0] == "mkdir":
            words = [w.replace("$RUN_DIR", str(scratch / "run_dir")) for w in words]
        proc = subprocess.run(words, cwd=scratch, env=env, capture_output=True, text=True, timeout=120)
        if proc.returncode:
            failed.append(f"`{cmd}` exits {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-400:]}")
    assert not failed, "\n".join(failed)


def test_a_phase_the_script_does_not_define_is_caught():
    """The check that guards the GPU report's rerun command: a run directory passed where phases go fails."""
    assert shell_script_problems(["bash", "benchmarks/measured/gpu_check.sh", "/tmp/gpu_bench"])
    assert not shell_script_problems(["bash", "benchmarks/measured/gpu_check.sh", "start", "collect"])
    assert unexplained([("x.md", "bash tools/nowhere.sh")])
    assert not unexplained([("x.md", "dvc repro table1")])
