"""What a change did to the paper's tables: one Markdown report for a pull request (docs/ci.md).

    python tools/pr_report.py --base REV [--out FILE] [--link-prefix URL | --artifact-url URL]
    make pr-report BASE=REV [OUT=FILE]

Compares the git revision BASE with this checkout (after ``dvc repro``): the params that changed
(``dvc.api.params_show`` at both), the stages that reran (the stage entries of ``dvc.lock`` that differ), every
headline metric that moved (``metrics/headline/``, read with ``dvc.api.metrics_show(rev=)``), the verdicts that flipped and the
tables and figures under ``reports/`` whose bytes changed. Links are relative to the report's folder, or
start with ``--link-prefix`` (a URL of the repository's files); CI, whose files were regenerated and not
committed, names them and links ``--artifact-url`` (the run's uploaded ``reports/``) instead. Exit 2
with one ``error:`` line when BASE is not a revision or DVC cannot read the project.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml

from dpnrepro.io import write_text_atomic

WORKSPACE = "workspace"
LOCK_FILES = ("dvc.lock", "study/dvc.lock", "benchmarks/dvc.lock")
HEADLINE_DIR = "metrics/headline/"
REPORTS_DIR = "reports"
REPORT_SUFFIXES = (".md", ".png")
LOCK_KEYS = ("cmd", "deps", "params", "outs")
MISSING = "—"


class ReportError(Exception):
    """A fault that ends the report with one ``error:`` line."""


def git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, check=check)


def file_at(root: Path, rev: str, rel: str) -> bytes | None:
    """The bytes of ``rel`` at git revision ``rev`` (the working tree for ``workspace``); None if absent."""
    if rev == WORKSPACE:
        path = root / rel
        return path.read_bytes() if path.is_file() else None
    proc = git(root, "cat-file", "blob", f"{rev}:{rel}", check=False)
    return proc.stdout if proc.returncode == 0 else None


# What GitHub gives as a push's `before` when the push creates the branch: no base; the first parent stands in.
NO_BASE = "0" * 40


def resolve(root: Path, rev: str) -> str:
    """The commit ``rev`` names; GitHub's all-zero ``before`` (:data:`NO_BASE`) means the first parent."""
    rev = "HEAD~1" if rev == NO_BASE else rev
    proc = git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if proc.returncode != 0:
        raise ReportError(f"BASE {rev!r} is not a git revision of {root}")
    return proc.stdout.decode().strip()


def flatten(tree, prefix: str = "") -> dict[str, object]:
    """``{dotted.key: leaf}`` of a nested dict, the keys written as ``dvc metrics diff`` writes them."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, object] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _differs(root: Path, base: str, rel: str) -> bool:
    """Whether ``rel`` may differ between BASE and the workspace: its bytes differ, or git at BASE does not
    hold it (a DVC-cached file, or none: DVC says which)."""
    old = file_at(root, base, rel)
    return old is None or old != file_at(root, WORKSPACE, rel)


def _shown(show, rel: str, root: Path, base: str) -> dict[str, dict]:
    """``{rev: flattened content}`` of ``rel`` at BASE and in the workspace, read by ``show`` (``dvc.api``'s
    ``params_show`` / ``metrics_show`` of one file, so its keys are its own); a revision without it is left out."""
    out = {}
    for rev in (base, WORKSPACE):
        try:  # an absolute target: DVC resolves a relative one against the working directory, not the repo
            out[rev] = flatten(show(str(root / rel), repo=str(root), rev=None if rev == WORKSPACE else rev))
        except FileNotFoundError:
            if file_at(root, rev, rel) is not None:
                raise ReportError(f"DVC does not find {rel} at {rev}, though git has it") from None
    return out


def params_files(root: Path, base: str) -> list[str]:
    """The params files the stages read (each dvc.lock's ``params`` at BASE and in the workspace), and
    ``params.yaml``."""
    files = {"params.yaml"}
    for rev in (base, WORKSPACE):
        files |= {f for entry in stage_entries(root, rev).values() for f in (entry.get("params") or {})}
    return sorted(files)


def params_changed(root: Path, base: str) -> list[dict]:
    """``[{file, param, old, new}]``: each params file's values that differ between BASE and the workspace,
    read with ``dvc.api.params_show`` (only files whose bytes differ are read)."""
    import dvc.api

    rows = []
    for rel in params_files(root, base):
        if not _differs(root, base, rel):
            continue
        shown = _shown(dvc.api.params_show, rel, root, base)
        old, new = shown.get(base, {}), shown.get(WORKSPACE, {})
        rows += [{"file": rel, "param": key, "old": old.get(key), "new": new.get(key)}
                 for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    return rows


def headline_metrics(root: Path, base: str) -> dict[str, dict[str, dict]]:
    """``{"base" | "head": {table: {dotted key: leaf}}}`` of every headline metrics file at BASE and in the
    workspace, read with ``dvc.api.metrics_show(rev=)`` (a file a revision lacks is left out of it; a file
    whose bytes are the same at both is read in neither, as nothing in it moved)."""
    import dvc.api

    listed = git(root, "ls-tree", "--name-only", f"{base}:{HEADLINE_DIR}", check=False).stdout.decode().split()
    names = {HEADLINE_DIR + n for n in listed if n.endswith(".json")} | {
        f"{HEADLINE_DIR}{p.name}" for p in (root / HEADLINE_DIR).glob("*.json")}
    out: dict[str, dict] = {"base": {}, "head": {}}
    for rel in sorted(names):
        if not _differs(root, base, rel):
            continue
        shown = _shown(dvc.api.metrics_show, rel, root, base)
        for rev, label in ((base, "base"), (WORKSPACE, "head")):
            if rev in shown:
                out[label][Path(rel).stem] = shown[rev]
    return out


def moved_metrics(metrics: dict) -> list[dict]:
    """Every numeric headline value that differs between base and head: ``[{table, metric, old, new}]``."""
    rows = []
    for table in sorted(set(metrics["base"]) | set(metrics["head"])):
        old, new = metrics["base"].get(table, {}), metrics["head"].get(table, {})
        for key in [*old, *(k for k in new if k not in old)]:
            a, b = old.get(key), new.get(key)
            numeric = all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in (a, b))
            if numeric and a != b:
                rows.append({"table": table, "metric": key, "old": a, "new": b})
    return rows


def flipped_verdicts(metrics: dict) -> list[dict]:
    """Every ``verdict`` of a headline block that differs between base and head: ``[{table, block, old, new}]``."""
    rows = []
    for table in sorted(set(metrics["base"]) | set(metrics["head"])):
        old, new = metrics["base"].get(table, {}), metrics["head"].get(table, {})
        keys = [k for k in [*old, *(k for k in new if k not in old)] if k.split(".")[-1] == "verdict"]
        rows += [{"table": table, "block": key.removesuffix(".verdict"), "old": old.get(key), "new": new.get(key)}
                 for key in keys if old.get(key) != new.get(key)]
    return rows


def stage_entries(root: Path, rev: str) -> dict[str, dict]:
    """``{stage address: lock entry}`` of every dvc.lock at ``rev`` (``study/dvc.yaml:<stage>`` outside the
    root), only the keys that say what a run read and wrote."""
    entries = {}
    for lock in LOCK_FILES:
        text = file_at(root, rev, lock)
        if text is None:
            continue
        try:
            stages = (yaml.safe_load(text) or {}).get("stages") or {}
        except yaml.YAMLError as exc:
            raise ReportError(f"{lock} at {rev} is not YAML: {str(exc).splitlines()[0]}") from None
        prefix = "" if lock == "dvc.lock" else f"{lock.removesuffix('.lock')}.yaml:"
        entries.update({prefix + name: {k: body.get(k) for k in LOCK_KEYS} for name, body in stages.items()})
    return entries


def rerun_stages(root: Path, base: str) -> list[dict]:
    """The stages whose lock entry differs from BASE's, in the workspace's lock order: ``[{stage, how}]``
    (``reran``, ``new``: BASE had no outputs for it, ``removed``)."""
    old, new = stage_entries(root, base), stage_entries(root, WORKSPACE)
    rows = [{"stage": s, "how": "reran" if s in old else "new"} for s, body in new.items() if old.get(s) != body]
    return rows + [{"stage": s, "how": "removed"} for s in old if s not in new]


def changed_reports(root: Path, base: str, exclude: set[str]) -> list[str]:
    """``reports/*.md|png`` whose bytes differ between BASE and the workspace (or that only one has)."""
    listed = git(root, "ls-tree", "--name-only", f"{base}:{REPORTS_DIR}", check=False).stdout.decode().split()
    names = {f"{REPORTS_DIR}/{n}" for n in listed} | {
        f"{REPORTS_DIR}/{p.name}" for p in (root / REPORTS_DIR).glob("*") if p.is_file()}
    return [rel for rel in sorted(names) if rel.endswith(REPORT_SUFFIXES) and rel not in exclude
            and file_at(root, base, rel) != file_at(root, WORKSPACE, rel)]


def _value(v) -> str:
    if v is None:
        return MISSING
    if isinstance(v, float):
        return f"{v:.4g}"
    return f"`{v}`" if isinstance(v, (list, dict)) else str(v)


def _change(old, new) -> str:
    return f"{new - old:+.4g}" if isinstance(old, (int, float)) and isinstance(new, (int, float)) else MISSING


def render(base_label: str, base_sha: str, found: dict, link, artifact_url: str | None = None) -> str:
    """The report's Markdown from what :func:`collect` found; ``link(rel)`` is the URL of a repository file;
    with ``artifact_url`` the changed files are named, not linked, and that URL (where they are) is given."""
    params, stages, verdicts, moved, reports = (found[k] for k in ("params", "stages", "verdicts", "metrics",
                                                                   "reports"))
    lines = ["## What this change does to the paper's tables", "",
             f"Against `{base_label}` (`{base_sha[:10]}`), with this checkout's outputs after `dvc repro`.", ""]
    if not any(found.values()):
        return "\n".join([*lines, "**Nothing changed**: no param, no stage rerun, no headline metric, no "
                          "verdict, no table or figure.", ""])
    lines.append(f"{len(params)} param(s) changed, {len(stages)} stage(s) reran, {len(verdicts)} verdict(s) "
                 f"flipped, {len(moved)} headline value(s) moved, {len(reports)} table/figure file(s) changed.")
    if params:
        lines += ["", "### Params changed", "", "| Param | Base | New |", "|---|---|---|",
                  *(f"| `{p['file']}`: `{p['param']}` | {_value(p['old'])} | {_value(p['new'])} |" for p in params)]
    if stages:
        lines += ["", "### Stages the change reran", "",
                  ", ".join(f"`{s['stage']}`" + ("" if s["how"] == "reran" else f" ({s['how']})") for s in stages)]
    lines += ["", "### Verdicts flipped", ""]
    lines += ["| Table | Block | Base | New |", "|---|---|---|---|",
              *(f"| {v['table']} | `{v['block']}` | {v['old'] or MISSING} | **{v['new'] or MISSING}** |"
                for v in verdicts)] if verdicts else ["None: every verdict reads as at base."]
    if moved:
        lines += ["", "### Headline metrics moved", "", "| Table | Metric | Base | New | Change |",
                  "|---|---|---|---|---|",
                  *(f"| {m['table']} | `{m['metric']}` | {_value(m['old'])} | {_value(m['new'])} | "
                    f"{_change(m['old'], m['new'])} |" for m in moved)]
    if reports and artifact_url:
        lines += ["", "### Tables and figures changed", "",
                  f"Regenerated by this run, not committed: they are in its artifact [reports]({artifact_url}).",
                  "", *(f"- `{rel}`" for rel in reports)]
    elif reports:
        lines += ["", "### Tables and figures changed", ""]
        lines += [f"- [{rel}]({link(rel)})" for rel in reports if rel.endswith(".md")]
        lines += [f"![{rel}]({link(rel)})" for rel in reports if rel.endswith(".png")]
    return "\n".join([*lines, ""])


def collect(root: Path, base_sha: str, exclude: set[str]) -> dict:
    """Everything the report lists, BASE against the workspace of the DVC project at ``root``."""
    from dvc.exceptions import DvcException

    try:
        params = params_changed(root, base_sha)
        metrics = headline_metrics(root, base_sha)
    except DvcException as exc:
        raise ReportError(f"DVC cannot read {root}: {str(exc).splitlines()[0]}") from None
    return {"params": params, "stages": rerun_stages(root, base_sha), "verdicts": flipped_verdicts(metrics),
            "metrics": moved_metrics(metrics), "reports": changed_reports(root, base_sha, exclude)}


def build(root: Path, base: str, out: Path | None = None, link_prefix: str | None = None,
          artifact_url: str | None = None) -> str:
    """The report of ``root``'s workspace against ``base``; ``out`` (if given) is where it will be written."""
    root = root.resolve()
    base_sha = resolve(root, base)
    out_rel = None
    if out is not None and out.resolve().is_relative_to(root):
        out_rel = out.resolve().relative_to(root).as_posix()
    found = collect(root, base_sha, exclude={out_rel} if out_rel else set())

    def link(rel: str) -> str:
        if link_prefix:
            return link_prefix + rel + ("?raw=true" if rel.endswith(".png") else "")
        here = (out.resolve().parent if out is not None else root)
        return Path(os.path.relpath(root / rel, here)).as_posix()

    return render(base, base_sha, found, link, artifact_url)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the git revision to compare with (the PR's base)")
    ap.add_argument("--out", type=Path, help="write the report here (default: print it)")
    ap.add_argument("--link-prefix", help="URL prefix of the repository's files (default: relative links)")
    ap.add_argument("--artifact-url", help="where CI uploaded the regenerated reports/ (named, not linked)")
    ap.add_argument("--root", type=Path, default=Path("."), help="the DVC project (default: .)")
    args = ap.parse_args(argv)
    try:
        text = build(args.root, args.base, args.out, args.link_prefix, args.artifact_url)
        if args.out is None:
            sys.stdout.write(text)
            return 0
        write_text_atomic(args.out, text)
    except (ReportError, OSError) as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    print(f"pr_report: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
