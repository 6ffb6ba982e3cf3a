"""DVC outputs carried between machines without a shared remote: a run's outputs packed as one file
(``dvc push`` to a local remote, tarred), unpacked elsewhere (``dvc pull``) and regenerated into reports
without training a step. Made for GPU runs on a lent machine (benchmarks/measured/gpu_check.sh), read on a CPU.

On the machine that ran the stages::

    python tools/dvc_pack.py pack $OUT/gpu_artifacts.tar.gz --stages train-table1 [--compare reports/table1.md ...]

``dvc push`` of the cached outputs of ``--stages`` to a local remote, packed with the run's dvc.lock,
dvc.yaml and params.yaml, the stages' uncached outputs (``cache: false``: metrics JSON) and the ``--compare``
files (what the CPU side must regenerate byte for byte), plus a manifest (git revision, stages, files).
A pack over 15 MiB is cut into ``.partNN`` files (a GPU run returns files of at most 16 MiB).

On another machine, in a clean checkout of the same revision (any other revision, or local changes to
tracked files, are refused: the pack's dvc.lock / dvc.yaml / params.yaml and files would overwrite them)::

    python tools/dvc_pack.py unpack gpu_artifacts.tar.gz [--repro table1 ...]

puts the GPU run's dvc.lock / dvc.yaml / params.yaml and uncached outputs in place, ``dvc pull``s the cached
ones from the packed remote, and with ``--repro`` reruns the data stages the packed ones read (not packed:
remade from the raw data), refuses when DVC's status then says a stage of ``--stages`` would run (its deps
differ from the packing run's: code, params or prepared data), reproduces the targets, and checks every
``--compare`` file byte for byte against the packed one. DVC's pipeline is read through its Python API
(dpnrepro.dvc_graph), never from its printed text.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from dpnrepro import dvc_graph
from dpnrepro.errors import UserError

REMOTE = "dvc-pack"
MANIFEST = "manifest.json"
PART_BYTES = 15 * 2**20
PIPELINE_FILES = ("dvc.lock", "dvc.yaml", "params.yaml")


def _dvc(args: list[str], root: Path) -> None:
    """``dvc ARGS`` in ``root`` (its output shown); a failure is one UserError line with the end of DVC's output."""
    proc = subprocess.run(["dvc", *args], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines())[-2000:]
        raise UserError(f"dvc {' '.join(args)} failed ({proc.returncode}): {tail}")
    sys.stdout.write(proc.stdout)


def uncached_outputs(root: Path, stages: list[str]) -> list[str]:
    """The ``cache: false`` outputs (outs, metrics, plots) of ``stages``, relative to ``root``."""
    return [out.path for stage in stages for out in dvc_graph.stage_outputs(stage, root) if not out.cache]


def _rev(root: Path) -> str | None:
    """The checkout's git revision; on a lent machine (no .git travels) GIT_REV, which gpu_check.sh sets."""
    if os.environ.get("GIT_REV"):
        return os.environ["GIT_REV"]
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _add(tar: tarfile.TarFile, src: Path, arcname: str) -> None:
    if not src.exists():
        raise UserError(f"pack: {src} does not exist")
    tar.add(src, arcname=arcname, recursive=True)


def pack(out: Path, stages: list[str], compare: list[str], root: Path = Path("."), extra: list[str] = ()) -> list[Path]:
    """Push ``stages``' cached outputs to a fresh local remote and pack it (see the module docstring);
    returns the files written (``out`` or its parts)."""
    root = root.resolve()
    with tempfile.TemporaryDirectory(prefix="dvc_pack_") as tmp:
        remote = Path(tmp) / "remote"
        remote.mkdir()
        _dvc(["remote", "add", "--local", "-f", REMOTE, str(remote)], root)
        _dvc(["push", "-r", REMOTE, *stages], root)
        uncached = uncached_outputs(root, stages)
        manifest = {"git_rev": _rev(root), "stages": stages, "uncached": uncached, "compare": compare,
                    "extra": list(extra), "packed": datetime.datetime.now(datetime.timezone.utc).isoformat()}
        buf = Path(tmp) / "pack.tar.gz"  # cut into the written files below
        with tarfile.open(buf, "w:gz") as tar:
            data = json.dumps(manifest, indent=1).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            _add(tar, remote, "remote")
            for name in PIPELINE_FILES:
                _add(tar, root / name, f"pipeline/{name}")
            for path in [*uncached, *compare, *extra]:
                _add(tar, root / path, f"files/{path}")
        return _write_pack(buf, out)


def _write_pack(buf: Path, out: Path) -> list[Path]:
    """``buf`` as ``out``, or cut into ``out.partNN`` files when it is larger than :data:`PART_BYTES`,
    written together (dpnrepro.io.all_or_nothing); the files of an earlier pack's other form are removed."""
    from dpnrepro.io import all_or_nothing, write_bytes_atomic

    single = buf.stat().st_size <= PART_BYTES
    written = []
    with all_or_nothing(), open(buf, "rb") as f:
        while chunk := f.read(PART_BYTES):
            written.append(out if single else out.with_name(f"{out.name}.part{len(written):02d}"))
            write_bytes_atomic(written[-1], chunk)
    for stale in [out, *out.parent.glob(out.name + ".part*")]:
        if stale not in written:
            stale.unlink(missing_ok=True)
    return written


def _read_pack(path: Path) -> bytes:
    parts = sorted(path.parent.glob(path.name + ".part*")) if not path.exists() else [path]
    if not parts:
        raise UserError(f"unpack: no {path} (nor {path}.partNN)")
    return b"".join(p.read_bytes() for p in parts)


def _local_changes(root: Path) -> list[str]:
    """Tracked files of the checkout at ``root`` that differ from its HEAD (staged or not); none where no git
    checkout travelled (a lent machine: GIT_REV)."""
    proc = subprocess.run(["git", "diff", "--name-only", "-z", "HEAD", "--"], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0 and os.environ.get("GIT_REV"):
        return []
    if proc.returncode != 0:
        raise UserError(f"unpack: cannot tell whether {root} has local changes (git diff: "
                        f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}); "
                        "nothing was changed")
    return [name for name in proc.stdout.split("\0") if name]


def _extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract ``tar`` into ``dest`` with tarfile's ``data`` filter (PEP 706). Python 3.10.0-3.10.11 and
    3.11.0-3.11.3 (Debian 12's 3.11.2 among them) lack it: there only folders and regular files whose paths stay
    inside ``dest`` are taken, written with the umask's modes and no owner, and any other member refuses the
    pack before anything is extracted."""
    if hasattr(tarfile, "data_filter"):
        try:
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as exc:
            raise UserError(f"the pack holds a member the data filter refuses ({exc}); nothing was changed") from None
        return
    members, inside = tar.getmembers(), os.path.realpath(dest)
    for member in members:
        target = os.path.realpath(dest / member.name)
        if not (member.isfile() or member.isdir()) or os.path.isabs(member.name) \
                or os.path.commonpath([target, inside]) != inside:
            raise UserError(f"the pack holds {member.name!r}, not a file or folder inside the pack; nothing was changed")
    for member in members:
        tar.extract(member, dest, set_attrs=False)


def unpack(path: Path, root: Path = Path("."), repro: list[str] = ()) -> dict:
    """Restore a pack into the DVC project ``root`` (see the module docstring); returns the manifest with
    ``ran`` (the stages ``dvc repro`` ran) and ``compared`` (files checked byte-identical)."""
    root = root.resolve()
    dest = root / ".dvc" / "tmp" / "dvc_pack"  # git-ignored (.dvc/.gitignore: /tmp)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(_read_pack(path)), mode="r:gz") as tar:
        _extract(tar, dest)
    manifest = json.loads((dest / MANIFEST).read_text())
    packed, here = manifest.get("git_rev"), _rev(root)
    if not packed:
        raise UserError("the pack records no git revision, so no checkout can be shown to match it; nothing was changed")
    if packed != here:  # its pipeline files are not this checkout's: never overwrite them
        raise UserError(f"packed at revision {packed}, this checkout is {here or 'no git checkout'}: unpack into a "
                        f"checkout of {packed} (git worktree add DIR {packed}); nothing was changed")
    changed = _local_changes(root)
    if changed:  # the pack's files would replace these edits
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise UserError(f"this checkout has local changes to {shown}: unpack into a clean checkout of {packed} "
                        f"(git stash, or git worktree add DIR {packed}); nothing was changed")
    for name in PIPELINE_FILES:
        shutil.copy2(dest / "pipeline" / name, root / name)
    for rel in manifest["uncached"] + manifest.get("extra", []):
        _copy(dest / "files" / rel, root / rel)
    _dvc(["remote", "add", "--local", "-f", REMOTE, str(dest / "remote")], root)
    _dvc(["pull", "-r", REMOTE, *manifest["stages"]], root)
    manifest["ran"], manifest["compared"] = [], []
    if repro:
        # the data stages the GPU-made ones read (export, prepare: not packed, remade here from the raw data),
        # then the GPU-made stages must be up to date: else `dvc repro` would train again, and is refused
        upstream = [s for s in dvc_graph.upstream_stages(manifest["stages"], root) if s not in manifest["stages"]]
        manifest["ran"] = list(dvc_graph.reproduce(upstream, root)) if upstream else []
        status = dvc_graph.status(manifest["stages"], root)
        if status:
            raise UserError(f"unpack: dvc repro would rerun the GPU-made stage(s) {sorted(status)}: their deps differ "
                            f"from the GPU run's ({json.dumps(status)[:500]}); no stage after {upstream} was run")
        manifest["ran"] += list(dvc_graph.reproduce(repro, root))
        differ = []
        for rel in manifest["compare"]:
            packed = dest / "files" / rel
            for gpu_file in sorted(p for p in [packed, *packed.rglob("*")] if p.is_file()):
                ours = root / gpu_file.relative_to(dest / "files")
                if not ours.is_file() or ours.read_bytes() != gpu_file.read_bytes():
                    differ.append(str(gpu_file.relative_to(dest / "files")))
                else:
                    manifest["compared"].append(str(gpu_file.relative_to(dest / "files")))
        if differ:
            raise UserError(f"unpack: regenerated file(s) differ from the GPU run's: {differ}")
    return manifest


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="on the GPU machine: dvc push to a local remote, packed as one file")
    p.add_argument("out", type=Path)
    p.add_argument("--stages", nargs="+", required=True, help="stages whose outputs travel (dvc push targets)")
    p.add_argument("--compare", nargs="*", default=[], help="files the CPU side must regenerate byte-identical")
    p.add_argument("--extra", nargs="*", default=[], help="other files to carry and restore as they are")
    u = sub.add_parser("unpack", help="on a CPU machine: restore, dvc pull, and dvc repro without training")
    u.add_argument("pack", type=Path)
    u.add_argument("--repro", nargs="*", default=[], help="dvc repro targets to regenerate from the pulled outputs")
    args = ap.parse_args(argv)
    dvc_graph.log_to_terminal()  # DVC's own progress lines (the stages it runs) on the terminal
    try:
        if args.cmd == "pack":
            files = pack(args.out, args.stages, args.compare, extra=args.extra)
            print(f"packed {', '.join(f'{f} ({f.stat().st_size / 2**20:.1f} MiB)' for f in files)}")
        else:
            m = unpack(args.pack, repro=args.repro)
            print(f"unpacked {args.pack} (git {str(m.get('git_rev'))[:12]}, stages {m['stages']}); "
                  f"dvc repro ran {m['ran'] or 'nothing'}; {len(m['compared'])} file(s) byte-identical to the GPU's")
    except UserError as exc:
        print(f"dvc_pack: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
