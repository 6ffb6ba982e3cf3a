"""Atomic file and directory writes: a failed stage never leaves a half-written output behind.

Outputs get the modes of ordinary files and folders under the process's umask (0644 / 0755 under umask
022), not the private 0600 / 0700 of ``tempfile``, so a team sharing a server can read them. Inside
:func:`all_or_nothing` the files written are renamed into place together at the end of the block, or
none of them is.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

# The files staged by the innermost all_or_nothing() block: [(temporary, final path)], or None outside one.
_pending: contextvars.ContextVar[list | None] = contextvars.ContextVar("_pending", default=None)


def umask() -> int:
    """The process's umask (read without a window in which it is changed, where Linux allows)."""
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open("/proc/self/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith("Umask:")), 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def share_tree(root: Path) -> None:
    """Give every folder and file under ``root`` the ordinary modes under the umask (0755 / 0644 under 022):
    libraries that write private files (safetensors writes 0600) do not decide who can read an output."""
    mask = umask()
    os.chmod(root, 0o777 & ~mask)
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o777 & ~mask)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, 0o666 & ~mask)


def mark_target(exc: BaseException, path: Path) -> None:
    """Record on ``exc`` the output that was being written when it was raised (the innermost one wins), so
    that the stage's one-line error can name it (cli.stage)."""
    if getattr(exc, "dpnrepro_target", None) is None:
        with contextlib.suppress(AttributeError, TypeError):
            exc.dpnrepro_target = str(path)


def _temporaries(path: Path) -> list[Path]:
    """The temporaries this module names after ``path`` (``.<name>.<8 random characters>.tmp``, as
    ``tempfile.mkstemp`` / ``mkdtemp`` make them): those of no other target, and no other file."""
    own = re.compile(rf"\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp")
    with contextlib.suppress(OSError):
        return [p for p in path.parent.iterdir() if own.fullmatch(p.name)]
    return []


def _remove(path: Path) -> None:
    """Remove a file or folder tree; nothing if it is not there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _previous(path: Path) -> Path:
    return path.with_name(f".{path.name}.previous")


def recover_file(path: str | os.PathLike) -> None:
    """Finish what a killed :func:`all_or_nothing` left beside ``path``: the previous contents it kept at
    ``.<name>.previous`` are removed beside a complete ``path``, and go back to ``path`` where it is missing
    (as a kill between the two renames of this module's earlier scheme left it)."""
    path = Path(path)
    previous = _previous(path)
    if not os.path.lexists(previous):
        return
    if os.path.lexists(path):
        _remove(previous)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.replace(previous, path)


def remove_stale_temporaries(path: Path) -> None:
    """Remove the temporary files a killed earlier write of ``path`` left beside it."""
    for stale in _temporaries(path):
        _remove(stale)
    recover_file(path)


def check_writable(folder: str | os.PathLike) -> None:
    """Create ``folder`` (and its parents) and make sure a file can be created in it, as the atomic writers
    will: a read-only or unwritable output folder fails now, before the work, with the OSError marked with
    ``folder`` (errors.fault_message names it)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".writable.", suffix=".tmp", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        mark_target(exc, folder)
        raise


def _keep_previous(path: Path) -> Path | None:
    """A second name for ``path``'s current contents (``.<name>.previous``: a hard link, or a copy where the
    filesystem has none), so that a failed block can put them back; None where ``path`` does not exist.
    ``path`` itself stays in place: no moment without it."""
    recover_file(path)
    if not os.path.lexists(path):
        return None
    previous = _previous(path)
    try:
        os.link(path, previous, follow_symlinks=False)
    except OSError:
        shutil.copy2(path, previous, follow_symlinks=False)
    return previous


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike):
    """An open binary file whose contents replace ``path`` when the ``with`` block ends (inside
    :func:`all_or_nothing`: when that block ends), written to a temporary file beside it and renamed into
    place; a failed block leaves ``path`` as it was. A successful write removes the temporaries of
    ``path`` that a killed earlier write left."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except BaseException as exc:
        mark_target(exc, path)
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~umask())
            yield f
            f.flush()
            os.fsync(f.fileno())
        pending = _pending.get()
        if pending is not None:
            pending.append((tmp, path))
            return
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        mark_target(exc, path)
        raise
    remove_stale_temporaries(path)
    _fsync_dir(path.parent)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_file`."""
    with atomic_file(path) as f:
        f.write(data)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def read_json(path: str | os.PathLike, *, fix: str, error: type[Exception] | None = None):
    """A JSON file the pipeline wrote, read back; missing or damaged (truncated, not UTF-8): a one-line
    ``error`` (a :class:`~dpnrepro.errors.UserError` by default) that ends with ``fix``, how to get it back
    (or a callable that says it, called only then)."""
    from dpnrepro.errors import UserError

    path = Path(path)
    error = error or UserError
    if not path.exists():
        recover_file(path)
    if not path.exists():
        raise error(f"{path} is missing; {fix() if callable(fix) else fix}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path} is not valid JSON ({exc}; truncated?); {fix() if callable(fix) else fix}") from None


def json_text(obj) -> str:
    """Deterministic JSON: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    """:func:`json_text`, written atomically."""
    write_text_atomic(path, json_text(obj))


@contextlib.contextmanager
def all_or_nothing():
    """Files written with :func:`write_bytes_atomic` (and its text / JSON forms) inside the block replace
    their paths together when the block ends, or, if the block or any rename fails, none does (the
    replaced ones get their previous contents back). A path written twice in the block gets its last
    contents. A block inside another joins the outer one."""
    if _pending.get() is not None:
        yield
        return
    pending: list = []
    token = _pending.set(pending)
    try:
        yield
    except BaseException:
        for tmp, _ in pending:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    finally:
        _pending.reset(token)
    last: dict[str, tuple[str, Path]] = {}  # one rename per file: its last write
    for tmp, path in pending:
        earlier = last.pop(os.path.abspath(path), None)
        if earlier is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(earlier[0])
        last[os.path.abspath(path)] = (tmp, path)
    # Each path keeps a second name for its previous contents until every rename is done, and is replaced
    # by one atomic rename: a kill at any moment leaves every path complete (old or new contents; the stage's
    # rerun writes them again) and the next write or read of a path removes what was kept for it.
    done: list[tuple[Path, Path | None]] = []  # (path, its previous contents kept, or None)
    path = None
    try:
        for tmp, path in last.values():
            done.append((path, _keep_previous(path)))
        for tmp, path in last.values():
            os.replace(tmp, path)
    except BaseException as exc:
        for done_path, backup in reversed(done):
            with contextlib.suppress(OSError):
                if backup is None:
                    os.unlink(done_path)
                elif os.path.samefile(backup, done_path):  # not replaced yet (a rename would do nothing)
                    os.unlink(backup)
                else:
                    os.replace(backup, done_path)
        for tmp, _ in last.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        mark_target(exc, path)
        raise
    for path, backup in done:
        if backup is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(backup)
        remove_stale_temporaries(path)
        _fsync_dir(path.parent)


def recover_dir(path: str | os.PathLike) -> None:
    """Finish what a killed :func:`atomic_dir` left: its previous output moved aside (``.<name>.old``)
    and the new one not yet in place goes back to ``path``; beside a complete ``path`` it is removed."""
    path = Path(path)
    old = path.with_name(f".{path.name}.old")
    if not old.exists():
        return
    if path.exists():
        _remove(old)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.replace(old, path)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike):
    """Yield a temporary directory that replaces ``path`` only if the block succeeds. No failure loses the
    previous output: it is moved aside to ``.<name>.old`` between two renames, put back if the second
    fails, and recovered by the next call (:func:`recover_dir`) after a kill between them."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        recover_dir(path)
        remove_stale_temporaries(path)  # left by a killed earlier attempt
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    except BaseException as exc:
        mark_target(exc, path)
        raise
    try:
        yield tmp
        share_tree(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            os.replace(path, old)
            try:
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):  # else the next call recovers it
                    os.replace(old, path)
                raise
            _remove(old)
        else:
            os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        mark_target(exc, path)
        raise


def read_yaml(path: str | os.PathLike, *, fix: str, error: type[Exception] | None = None) -> dict:
    """A YAML mapping the project keeps (a committed input), read; missing, truncated or malformed (not
    YAML, not UTF-8, not a mapping): a one-line ``error`` (a :class:`~dpnrepro.errors.UserError` by
    default) naming the file and ending with ``fix``, how to restore it."""
    import yaml

    from dpnrepro.errors import UserError

    path = Path(path)
    error = error or UserError
    if not path.exists():
        recover_file(path)
    if not path.exists():
        raise error(f"{path} is missing; {fix}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise error(f"{path} is not valid YAML{where} ({getattr(exc, 'problem', None) or exc}; truncated?); "
                    f"{fix}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); {fix}") from None
    if not isinstance(data, dict):
        raise error(f"{path} holds {'nothing' if data is None else type(data).__name__}, not a mapping "
                    f"(truncated?); {fix}")
    return data
