"""The documentation holds: README.md and docs/*.md link only to files and headings that exist, every
docs page is reachable from the README, every repository path they quote exists (their shell commands are
tests/test_doc_commands.py's), and no tracked file speaks of how the project was built (work sessions,
issue numbers, leads, helpers) instead of what it is: that history lives in `git log`. reports/paper/
transcribes the paper and is left out. What a user reads names no development machine of this project; the
mini profile's step ratio the docs state is the profiles'; `make profile` sets up before it touches
params.yaml.

The checks read files (git ls-files, Makefile, dvc.yaml files, params.yaml, profiles/); only `make -n profile`
and a refused `make profile` run."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

from helpers import REPO, dvc_outputs

# ------------------------------------------------------------------------------------ project history --
# Each pattern names one way of writing project history into a file. They are written for the project's
# own technical vocabulary, which must still pass: `distributed.session` and "the stage's session" (a
# process group), pytest's scope="session", the tests' `helpers` module and "the helpers the config modules
# share", upstream bug reports cited as `owner/repo#N` or "big_vision issue #110", and "lead" the verb
# ("lead to"). tests/test_docs.py holds the patterns and is left out.
HISTORY_PATTERNS = {
    "a numbered session": r"\bsessions?\s*#?\d+",
    "a session in time": r"\b(earlier|previous|past|prior|later|next|last|this|that|another|whole|same|first|second)"
                         r"\s+sessions?\b",
    "the project's sessions": r"\b(project'?s?|earlier|previous|past|prior|later|all|several|many|two|three)\s+sessions\b",
    "a session's budget": r"\bsession'?s?\s+(\d+[- ]minutes?|budget|time\b)",
    "work done in a session": r"\b(calls?|end|start|part)\s+of\s+(a|one|the)\s+session\b"
                              r"|\b(in|by|during)\s+(a|one|the)\s+(GPU\s+)?session\s+that\b",
    "a numbered issue": r"(?<!big_vision )\bissues?\s*#?\d+",
    "the issue as a source": r"\b(the|this|that|an|each|every|from\s+the)\s+issue'?s?\b(?!\s+(a|an)\s)",
    "an issue's possessive": r"\bissue's\b",
    "an issue cited as the source": r"\(issues?\s*[;,:)]",
    "the lead (a person)": r"\blead's\b|\bthe\s+lead\b(?!\s+(to|in|time|of|and)\b)|\b(our|project|tech)\s+lead\b",
    "a helper (a person)": r"\bhelper'?s'?\s+(session|agent|note|report|checkout)|\bhelper's\b"
                           r"|\b(a|the|another|one|each)\s+helper\b(?!\s+(function|module|class|method|script)s?\b)",
    "the tooling that built it": r"\bdevice tool\b|\b(GPU|device) time (budget|left|ran out)",
}
HISTORY_RE = {name: re.compile(p, re.IGNORECASE) for name, p in HISTORY_PATTERNS.items()}
HISTORY_EXEMPT = ("reports/paper/", "tests/test_docs.py", "dvc.lock")
BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gz", ".npz", ".whl", ".pdf"}


def tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout
    files = [f for f in out.decode().split("\0") if f]
    # files of this checkout not yet committed count too (a new docs page)
    out = subprocess.run(["git", "ls-files", "-z", "--others", "--exclude-standard"], cwd=REPO, check=True,
                         capture_output=True).stdout
    files += [f for f in out.decode().split("\0") if f]
    return sorted(f for f in set(files) if (REPO / f).is_file() and not f.startswith(HISTORY_EXEMPT)
                  and Path(f).suffix.lower() not in BINARY_SUFFIXES)


def history_phrases(text: str) -> list[tuple[int, str, str]]:
    """(line, pattern name, matched text) of every history phrase in ``text``."""
    hits = []
    for name, rx in HISTORY_RE.items():
        for m in rx.finditer(text):
            hits.append((text.count("\n", 0, m.start()) + 1, name, m.group(0)))
    return sorted(hits)


def test_history_patterns_catch_history_and_spare_the_vocabulary():
    history = ["measured in session 9", "19 min in an earlier session", "the lead's checkout", "(issue 19)",
               "the issue's targets", "Targets (from the issue)", "no GPU in the session that built it",
               "lent to this project's sessions", "the session's 30-minute budget", "one call of the device tool",
               "a helper measured it", "Issue 4, part 1", "at the end of a session", "in two calls of one session",
               '"mean over 3 runs" (issue; the paper prints', "more than a session's 30 minutes"]
    vocabulary = ["with distributed.session('cpu') as ctx:", "the stage's session (launch.metrics_stage)",
                  '@pytest.fixture(scope="session")', "from helpers import REPO", "the helpers the other config "
                  "modules share", "big_vision issue #110", "NVIDIA/nccl#1497", "this would lead to a hang",
                  "a session of this call's own", "scored in the session ``ctx``", "a helper function",
                  "the lead to the probe", "every session runs this switch",
                  "sessions.append(device_name)", "assert sessions == [recipe]", "this issues a warning"]
    for phrase in history:
        assert history_phrases(phrase), f"not caught: {phrase!r}"
    for phrase in vocabulary:
        assert not history_phrases(phrase), f"caught, but it is the project's vocabulary: {phrase!r}"


def test_no_tracked_file_tells_the_projects_history():
    found = []
    for rel in tracked_text_files():
        try:
            text = (REPO / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{rel}:{line}: {match!r} ({name})" for line, name, match in history_phrases(text)]
    assert not found, ("project history in tracked files (say what the project is; the history is in git log):\n"
                       + "\n".join(found))



# ------------------------------------------------------------------------------ development machines --
# What a user reads speaks of their machine, not of the machines this project was measured on: no lent
# machines and what travels to them, no tool calls, no paths of one machine. Read: the user docs, the
# measurement notes, the reports, the Makefile and the comments of requirements/*.txt.
DEV_MACHINE_PATTERNS = {
    "a lent machine": r"\blent\b|\bstill-warm\b",
    "what travels to it": r"\bcarry`?\s+list\b|\bcarry=\[|\bcarried\s+folder\b|\ba\s+call\s+carries\b",
    "its image": r"\b(GPU|CUDA|device|container)\s+image\b|\bKINDS\.md\b|\bdevice\s+entry\b",
    "its time": r"\bdevice[- ]time\b",
    "the development machines": r"\bdev\s+(VMs?|machines?|box(es)?)\b",
    "a tool call": r"\brun\(\s*kind\s*=|\b(across|several|later)\s+calls\b|\bone-call\b|\b(fits?|in)\s+one\s+call\b"
                   r"(?!\s*\()|\b(minutes\s+of|more\s+than|after)\s+a\s+call\b|\ba\s+call\s+holds\b",
    "a path of one machine": r"(?<![\w.~$/-])/(work|home|root|Users)/[\w.-]",
}
DEV_MACHINE_RE = {name: re.compile(p, re.IGNORECASE) for name, p in DEV_MACHINE_PATTERNS.items()}


def user_facing_files() -> list[str]:
    """README.md, docs/, benchmarks/measured/**.md, reports/*.md (not the paper's), Makefile, requirements/*.txt."""
    return ["README.md", "Makefile",
            *sorted(p.relative_to(REPO).as_posix() for pattern in ("docs/*.md", "benchmarks/measured/**/*.md",
                                                                     "reports/*.md", "requirements/*.txt")
                    for p in REPO.glob(pattern))]


def dev_machine_phrases(text: str, comments_only: bool = False) -> list[tuple[int, str, str]]:
    """(line, pattern name, matched text) of every development-machine phrase in ``text`` (in its ``#``
    comments only, with ``comments_only``)."""
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        if comments_only:
            line = line[line.index("#"):] if "#" in line else ""
        hits += [(n, name, m.group(0)) for name, rx in DEV_MACHINE_RE.items() for m in rx.finditer(line)]
    return hits


def test_dev_machine_patterns_catch_the_machines_and_spare_the_vocabulary():
    machine = ["a lent GPU machine", "through the GPU machine's `carry` list", "the wheels the GPU image lacks",
               "costs device time", "the local CPU file on the dev machines", "on the shared dev VM",
               'run(kind="nvidia-h100-x1", carry=[".gpu_carry"])', "split over several calls of a machine",
               "resumable across calls", "Both fit one call.", "## The GPU tier in one call", "the one-call GPU run",
               "budget minutes of a call for it", "more than a call holds", "the 64 MiB a call carries",
               "--tmp /work/bench100k", "in /home/alice/data", "the device entry's KINDS.md list",
               "on the still-warm machine"]
    vocabulary = ["`eval_batches` calls `malloc_trim(0)`", "aten::mm: 3.43 ms, 100 calls", "the stage commands call `python`",
                  "decodes the batch on the device in one call (nvJPEG)", "a GPU machine reproduces them",
                  "the image's pixels", "/usr/share/datasets/fashion-mnist", "RES=/tmp/gpu_res", "~/.cache/dpnrepro",
                  "make gpu-carry", "the statistics carry class information", "data/raw/imagefolder/train"]
    for phrase in machine:
        assert dev_machine_phrases(phrase), f"not caught: {phrase!r}"
    for phrase in vocabulary:
        assert not dev_machine_phrases(phrase), f"caught, but it is the project's vocabulary: {phrase!r}"
    assert dev_machine_phrases("torch==2.14.1  # as on the dev machines", comments_only=True)
    assert not dev_machine_phrases("lent==1.0", comments_only=True)


def test_user_facing_files_speak_of_the_users_machine():
    found = []
    for rel in user_facing_files():
        text = (REPO / rel).read_text(encoding="utf-8")
        found += [f"{rel}:{line}: {match!r} ({name})"
                  for line, name, match in dev_machine_phrases(text, comments_only=rel.startswith("requirements/"))]
    assert not found, ("words of this project's development machines in what a user reads (say what a user runs on "
                       "their machine):\n" + "\n".join(found))



# ------------------------------------------------------------------------------------ claims checked --
def mini_step_ratios() -> dict[str, float]:
    """Training steps of the mini profile over the smoke profile's: every sweep, VTAB, Sun397, LiT, segmentation."""
    from dpnrepro.config.params import load_params
    from dpnrepro.config.sweeps import SWEEPS, sweep_config

    smoke, mini = load_params(REPO / "profiles/smoke.yaml"), load_params(REPO / "profiles/mini.yaml")
    ratios = {sw: sweep_config(mini, sw, getattr(mini, sw).archs[0]).train.steps
              / sweep_config(smoke, sw, getattr(smoke, sw).archs[0]).train.steps
              for sw in SWEEPS if getattr(smoke, sw, None) and getattr(mini, sw, None)}
    for sec in ("vtab", "sun397_scratch"):
        ratios[sec] = getattr(mini, sec).recipe.train["steps"] / getattr(smoke, sec).recipe.train["steps"]
    ratios["lit"] = mini.lit.train.steps / smoke.lit.train.steps

    def seg_iters(p):
        config = int(re.search(r"^max_iters = (\d+)", (REPO / p.segmentation.config).read_text(), re.M).group(1))
        return p.segmentation.options.get("train_cfg.max_iters", config)
    ratios["segmentation"] = seg_iters(mini) / seg_iters(smoke)
    return ratios


def test_the_mini_step_ratio_the_docs_state_is_the_profiles():
    ratios = mini_step_ratios()
    claim = f"{min(ratios.values()):g}–{max(ratios.values()):g}× the smoke steps"
    rel = "docs/profiles-and-data.md"  # the one page that states it
    assert claim in (REPO / rel).read_text(), f"{rel} should say {claim!r} (profiles/*.yaml: {ratios})"



def test_make_profile_sets_up_before_it_touches_params_yaml():
    """`make profile` runs the set-up (env) before it copies a profile over params.yaml, and refuses an unknown
    profile in one line, params.yaml untouched (`make -n`: nothing runs). Run as a user runs it, not as a
    sub-make of `make test` (whose MAKEFLAGS add "Entering directory" lines)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    dry = subprocess.run(["make", "-n", "profile", "PROFILE=mini"], cwd=REPO, capture_output=True, text=True,
                         check=True, env=env).stdout.splitlines()
    setup = [i for i, line in enumerate(dry) if "tools/setup_env.sh" in line]
    copy = [i for i, line in enumerate(dry) if line.startswith("cp profiles/mini.yaml params.yaml")]
    assert copy and setup and setup[0] < copy[0], "make profile must run the set-up first:\n" + "\n".join(dry)
    before = (REPO / "params.yaml").read_bytes()
    bad = subprocess.run(["make", "profile", "PROFILE=no_such"], cwd=REPO, capture_output=True, text=True, env=env)
    lines = bad.stdout.strip().splitlines()
    assert bad.returncode != 0 and len(lines) == 1 and lines[0].startswith("no profiles/no_such.yaml"), bad.stdout
    assert (REPO / "params.yaml").read_bytes() == before


# ---------------------------------------------------------------------------- links and commands --
DOCS = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))]
LINK_RE = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE_RE = re.compile(r"^```[ \t]*(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# Directories the pipeline writes and git ignores: a path quoted under them names an output, not a file.
OUTPUT_DIRS = ("data/", "runs/", "checkpoints/", "dvc_plots/", ".whl/", ".venv/", "~/", "/")
# Files of the upstream projects the docs cite, named with the project first: `big_vision/configs/vit_i21k.py`.
UPSTREAM = ("big_vision/", "task_adaptation/", "timm/", "mmseg/", "mmsegmentation/", "mmengine/", "mmcv/",
            "open_clip/", "torch/", "pytorch/")


def strip_code(text: str) -> str:
    """``text`` without fenced blocks (their lines kept blank, so line numbers hold)."""
    return FENCE_RE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(rel: str) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in strip_code((REPO / rel).read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def link_errors(rel: str) -> list[str]:
    text = strip_code((REPO / rel).read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # a link inside inline code is an example, not a link
    errors = []
    for m in LINK_RE.finditer(text):
        target = m.group(1) or m.group(2)
        line = text.count("\n", 0, m.start()) + 1
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (REPO / rel).parent / path if path else REPO / rel
        dest_rel = dest.resolve().relative_to(REPO.resolve()).as_posix() if dest.exists() else None
        if dest_rel is None:
            errors.append(f"{rel}:{line}: link to {target!r}: no such file")
        elif anchor and dest_rel.endswith(".md") and anchor not in anchors(dest_rel):
            errors.append(f"{rel}:{line}: link to {target!r}: no heading with that anchor in {dest_rel}")
    return errors


def quoted_path_errors(rel: str) -> list[str]:
    """Inline-code spans that name a repository file (``src/...``, ``tests/x.py``, ``reports/y.md``) must
    exist, at the root or under src/dpnrepro/ (the docs name package files from there: ``data/loader.py``)."""
    text = strip_code((REPO / rel).read_text())
    errors = []
    for m in re.finditer(r"`([^`\n]+)`", text):
        span = m.group(1).strip()
        for token in re.split(r"[\s,;()]+", span):
            token = token.rstrip(":.")
            if not re.fullmatch(r"[\w.\-]+(/[\w.\-]+)+/?", token) or not re.search(r"\.(py|md|yaml|yml|json|sh|txt|toml|csv|png)$|/$", token):
                continue
            if token.startswith(OUTPUT_DIRS + UPSTREAM) or _is_output(token):
                continue
            if not any((base / token).exists() for base in (REPO, REPO / "src/dpnrepro", REPO / "src")):
                errors.append(f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: `{token}`: no such file")
    return errors


def _is_output(token: str) -> bool:
    return token.rstrip("/") in dvc_outputs() or any(o.startswith(token) for o in dvc_outputs())


def readme_reach_errors() -> list[str]:
    """The README links every docs page (docs/ holds what the README leaves out)."""
    readme = strip_code((REPO / "README.md").read_text())
    targets = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme)}
    pages = [p for p in DOCS if p != "README.md"]
    if not pages:
        return ["README.md: no docs/*.md page to link to: the README links each topic it leaves out"]
    return [f"README.md: no link to {p}" for p in pages if p not in targets]


def test_github_slug_is_githubs_anchor():
    assert github_slug("Multi-GPU and multi-node (`dvc repro` owns the launch)") == \
        "multi-gpu-and-multi-node-dvc-repro-owns-the-launch"


def test_links_and_quoted_paths_resolve():
    """(The commands of the docs' shell blocks: tests/test_doc_commands.py, the one doc-command checker.)"""
    errors = readme_reach_errors()
    for rel in DOCS:
        errors += link_errors(rel)
        errors += quoted_path_errors(rel)
    assert not errors, "broken links or paths in the docs:\n" + "\n".join(errors)


# Pages outside docs/ that link into it: the measured records' index and the reports the pipeline writes.
LINKING_PAGES = ["benchmarks/measured/README.md",
                 *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "reports").glob("*.md"))]
DOC_ANCHOR_RE = re.compile(r"docs/([\w-]+\.md)#([\w-]+)")


def test_links_of_the_reports_and_measured_pages_resolve():
    """A heading renamed in docs/ breaks the reports' and records' links too: they are checked like the docs."""
    errors = [e for rel in LINKING_PAGES for e in link_errors(rel)]
    assert not errors, "broken links outside docs/:\n" + "\n".join(errors)


def doc_anchors_named_in(files) -> list[str]:
    """``docs/page.md#anchor`` written in code, configs or scripts whose page has no such heading."""
    errors = []
    for path in files:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for page, anchor in DOC_ANCHOR_RE.findall(line):
                if not (REPO / "docs" / page).is_file() or anchor not in anchors(f"docs/{page}"):
                    errors.append(f"{path}:{n}: docs/{page}#{anchor}")
    return errors


def test_doc_anchors_named_in_code_and_configs_exist(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("# docs/determinism.md#resume\n# docs/determinism.md#no-such-heading\n# docs/nope.md#x\n")
    assert [e.split(": ")[-1] for e in doc_anchors_named_in([probe])] == \
        ["docs/determinism.md#no-such-heading", "docs/nope.md#x"], "the checker misses a broken anchor"
    files = [p for d in ("src", "stages", "tools", "profiles", "benchmarks", "study") for p in (REPO / d).rglob("*")
             if p.is_file() and p.suffix in {".py", ".yaml", ".sh", ".md"}]
    files += [REPO / "params.yaml", REPO / "Makefile"]
    assert len(files) > 50, "the code and config files moved?"
    errors = doc_anchors_named_in(files)
    assert not errors, "anchors that no heading in docs/ gives (rename the link or keep the heading):\n" + \
        "\n".join(errors)


# What a newcomer reads: short enough to read, the README first with what they came for.
READ_PAGES = [*DOCS, "benchmarks/measured/README.md", "reports/reliability.md"]
DOCS_LINE_BUDGET = 900
README_LINE_BUDGET = 120
README_OPENING = ["The two commands", "The results", "One table"]


def test_the_docs_stay_within_their_line_budget_and_the_readme_opens_with_what_a_reader_wants():
    lines = {rel: len((REPO / rel).read_text().splitlines()) for rel in READ_PAGES}
    assert sum(lines.values()) <= DOCS_LINE_BUDGET, (
        f"the docs have {sum(lines.values())} lines, over {DOCS_LINE_BUDGET}: cut before adding "
        f"(per page: {dict(sorted(lines.items(), key=lambda kv: -kv[1]))})")
    assert lines["README.md"] <= README_LINE_BUDGET, f"README.md has {lines['README.md']} lines"
    readme = (REPO / "README.md").read_text()
    headings = re.findall(r"^## (.+)$", strip_code(readme), re.M)
    assert headings[:3] == README_OPENING, f"the README opens with {headings[:3]}, not {README_OPENING}"
    assert "reports/README.md" in readme.split("## One table")[0], \
        "the README points to the results index before anything else"
