"""Every command the documentation shows runs, or names the test that runs the same path.

The shell blocks of README.md, docs/*.md, benchmarks/measured/README.md and reports/benchmarks_gpu.md are
read with mktestdocs. Each simple command in them (split at `&&`, `;` and `|`, comments and leading
`VAR=value` dropped) is one of:

- cheap: run for real in a scratch copy of the project (`dvc status`, `dvc metrics diff`, ...);
- long (training, GPUs, the network, the whole suite): listed in LONG with the test that runs the same path,
  and that test must exist; a `python SCRIPT` it names must answer `--help` from a clean shell and define
  every `--flag` the command passes, a `bash SCRIPT` must exist and define a `phase_<name>` for each
  phase it is given, a `make TARGET` must be a target `make -n` accepts.

A command that is neither fails, and so does a guarantee in the README that names a test which does not
exist."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from helpers import REPO, copy_project, git_init, run, stage_env
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
    "dvc plots": "tests/test_dvc_workflow.py::test_plot_definitions_render_without_error",
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


def test_long_commands_name_scripts_phases_flags_and_targets_that_exist(scratch):
    problems = []
    helps: dict[tuple[str, ...], str] = {}
    for page, cmd in documented():
        words = shlex.split(cmd)
        if long_entry(cmd) is None:
            continue
        if words[0] == "bash":
            problems += [f"{page}: {p}" for p in shell_script_problems(words)]
        elif words[0] == "make":
            targets = [w for w in words[1:] if "=" not in w]
            proc = run(["make", "-n", *targets], scratch, check=False, timeout=60)
            if proc.returncode:
                problems.append(f"{page}: `{cmd}`: make -n: {proc.stderr.strip()[-300:]}")
        elif (script := script_of(words)) is not None:
            key = tuple(script)
            if key not in helps:
                proc = run([sys.executable, *script[1:], "--help"], scratch, check=False, timeout=120)
                helps[key] = proc.stdout if proc.returncode == 0 else ""
                if proc.returncode:
                    problems.append(f"{page}: `{' '.join(script)} --help` exits {proc.returncode}: "
                                    f"{proc.stderr.strip()[-300:]}")
            if helps[key]:
                problems += [f"{page}: {p}" for p in python_script_problems(words, helps[key])]
    assert not problems, "\n".join(problems)


def test_cheap_commands_run_for_real_in_a_scratch_copy(scratch):
    env = stage_env()
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
