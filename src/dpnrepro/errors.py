"""One error type for problems the user can fix, reported as a single line by the stage entry points."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's inputs (data, params, checkpoints): one line, naming the fix."""


class DatasetError(UserError):
    """Missing, corrupt or inconsistent dataset."""


class ParamsError(UserError):
    """Malformed or invalid params.yaml."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used (missing, other architecture, unsafe format)."""
