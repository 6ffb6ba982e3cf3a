# The two commands of the README:
#   make repro   set up a fresh machine and run the smoke pipeline (dvc repro)
#   make test    set up the same way and run the test suite (what the project's CI runs, via .ci/run)
VENV ?= .venv
BIN := $(VENV)/bin
# dvc.yaml's stage commands call `python`: the project's interpreter, not whatever is first on PATH.
export PATH := $(abspath $(BIN)):$(PATH)
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export DVC_NO_ANALYTICS ?= 1
PROFILE ?= smoke
# Test workers (pytest-xdist): tests run their stages on one thread each, so 2 workers use both CI cores.
# A file's tests stay on one worker (--dist loadfile): module fixtures (a trained scratch project) are built once.
# Files go out in collection order (--no-loadscope-reorder; xdist would otherwise sort them by test count):
# tests/conftest.py puts the end-to-end file, the longest, first and the files with slow tests next.
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: env repro test test-fast test-report pr-report profile clean gpu-carry

# uv installs the pins (pip where uv cannot: DPNREPRO_INSTALLER=pip forces it); a second run only checks.
env:
	bash tools/setup_env.sh

repro: env
	$(BIN)/python -m dpnrepro.quick_repro

test: env
	$(PYTEST)

test-fast: env
	$(PYTEST) -m "not slow"

# The pull-request report's tests, end to end ones included (marked slow): the fork's CI runs them beside test-fast.
test-report: env
	$(PYTEST) tests/test_pr_report.py

# What the workspace's outputs changed against the git revision BASE (docs/ci.md): params, stages rerun,
# headline metrics, flipped verdicts, changed tables and figures, as one Markdown file (CI's job summary).
OUT ?= pr-report.md
pr-report: env
	@test -n "$(BASE)" || { echo "error: make pr-report needs BASE=<git revision>" >&2; exit 2; }
	$(BIN)/python tools/pr_report.py --base "$(BASE)" --out "$(OUT)" $(PR_REPORT_ARGS)

# Switch the active profile: copies profiles/$(PROFILE).yaml to params.yaml (shows in `dvc params diff`) and
# regenerates dvc.yaml, whose plots name every run of the profile's sweeps. The set-up (env) runs first, so
# params.yaml is never changed on a machine that cannot regenerate dvc.yaml.
profile:
	@test -f profiles/$(PROFILE).yaml || { echo "no profiles/$(PROFILE).yaml (have: $$(ls profiles | tr "\n" " "))"; exit 2; }
	@$(MAKE) --no-print-directory env
	cp profiles/$(PROFILE).yaml params.yaml
	$(BIN)/python -m dpnrepro.pipeline
	@echo "params.yaml is now the $(PROFILE) profile; run: make repro"

# .gpu_carry/ (git-ignored) for a GPU machine without network (benchmarks/measured/README.md): what its Python 3.12
# + torch 2.11 lacks, installed here into site.tar.xz, + Fashion-MNIST; GPU_CARRY_ARGS="--with seg,lit,data" adds more.
gpu-carry: env
	$(BIN)/python tools/gpu_carry.py $(GPU_CARRY_ARGS)

clean:
	rm -rf data runs checkpoints
