"""The suite runs on anyone's clone: a clone with nothing beside it collects every test, and each test that
needs the paper's text (tests/paper_text.py) skips there with a reason naming the variable that provides it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from paper_text import ENV, REPO

# One test of each file that reads the paper's text (or the thesis DeiT's recipe comes from).
NEEDS_PAPER = ("tests/test_paper_numbers.py::test_printed_values_occur_in_seed",
               "tests/test_recipes.py::test_pretraining_regimes_match_section_5_1",
               "tests/test_recipes.py::test_deit_recipe_matches_table_3_9",
               "tests/test_segmentation.py::test_full_config_is_appendix_g",
               "tests/test_lit.py::test_full_recipe_is_the_papers_and_big_visions")


def test_a_clone_with_nothing_beside_it_collects_and_skips_the_paper_tests_naming_the_variable(tmp_path):
    clone = tmp_path / "clone"  # tmp_path holds nothing else: no ../shared beside the clone
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k != ENV and not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(clone / "src")

    def pytest(*args):
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=clone,
                              env=env, capture_output=True, text=True)

    collect = pytest("--collect-only", "-q")
    assert collect.returncode == 0, collect.stdout[-4000:] + collect.stderr[-2000:]
    # "N tests collected", or "N/M tests collected (K deselected)": the experiments are deselected by default
    assert re.search(r"^\d+(/\d+)? tests collected", collect.stdout, re.MULTILINE), collect.stdout[-2000:]
    assert all(node in collect.stdout for node in NEEDS_PAPER), collect.stdout[-2000:]

    run = pytest("-q", "-rs", *NEEDS_PAPER)
    assert run.returncode == 0, run.stdout[-4000:]
    skips = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    n_run = int(re.search(r"(\d+) skipped", run.stdout).group(1))
    assert n_run >= len(NEEDS_PAPER) and "passed" not in run.stdout and "failed" not in run.stdout, run.stdout
    assert skips and all(ENV in line for line in skips), "\n".join(skips)
