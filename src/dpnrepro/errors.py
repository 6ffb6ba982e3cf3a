"""One error type for problems the user can fix, reported as a single line by the stage entry points, and the
one-line message for a fault of the machine (a full disk, a read-only folder) behind an exception."""

from __future__ import annotations

import errno
import re


class UserError(Exception):
    """A problem with the user's inputs (data, params, checkpoints): one line, naming the fix."""


class DatasetError(UserError):
    """Missing, corrupt or inconsistent dataset."""


class ParamsError(UserError):
    """Malformed or invalid params.yaml."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used (missing, other architecture, unsafe format)."""


# errno values of the faults fault_message names, and what the user does about each
_FAULTS = {
    errno.ENOSPC: ("no space left on device", "free disk space"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota"),
    errno.EFBIG: ("file too large for the file-size limit (`ulimit -f`) or the file system",
                  "raise the limit or write to another file system"),
    errno.EROFS: ("read-only file system", "make it writable or run in a writable copy of the project"),
    errno.EACCES: ("permission denied", "give yourself access (chmod / chown) or run in a writable copy"),
    errno.EPERM: ("operation not permitted", "give yourself access (chmod / chown) or run in a writable copy"),
    errno.EBUSY: ("device or resource busy (a mount point cannot be replaced)",
                  "mount the file system on the folder above the output, not on the output itself"),
}
_OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]")


def fault_errno(exc: BaseException) -> int | None:
    """The errno of a write fault behind ``exc``: an OSError's own, or the ``(os error N)`` that Rust
    libraries (safetensors' ``SafetensorError``) and ``[Errno N]`` that wrappers put in their message,
    following ``__cause__`` / ``__context__``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _FAULTS:
            return exc.errno
        match = _OS_ERROR_IN_TEXT.search(str(exc))
        if match and int(match.group(1) or match.group(2)) in _FAULTS:
            return int(match.group(1) or match.group(2))
        exc = exc.__cause__ or exc.__context__
    return None


def fault_message(exc: BaseException) -> str | None:
    """One line for a fault of the machine the user can fix (:data:`_FAULTS`), naming the output being
    written (io.mark_target) or the file; None for anything else."""
    code = fault_errno(exc)
    if code is None:
        return None
    what, fix = _FAULTS[code]
    target, filename = getattr(exc, "dpnrepro_target", None), getattr(exc, "filename", None)
    where = f" while writing {target}" if target else f": {filename}" if filename else ""
    kept = " (completed checkpoints and outputs are kept; nothing half-written remains)" \
        if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ""
    return f"{what}{where}; {fix} and rerun{kept}"
