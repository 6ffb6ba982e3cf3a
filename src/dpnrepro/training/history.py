"""A run's logged curves (dvclive), kept in every checkpoint so that a resumed run logs what an
uninterrupted one does."""

from __future__ import annotations


class Curves:
    """A run's dvclive curves, kept so that a resumed run logs exactly what an uninterrupted one does.

    :meth:`log` sends one step's values to ``live`` (None: not logged, e.g. ranks other than 0) and keeps
    them in :attr:`history` (plain JSON: ``[step, [[name, value], ...]]``, in logging order, which is the
    order of dvclive's ``metrics.json``). The trainers store the history in every checkpoint; a run
    resumed from one first logs it again (:meth:`replay`), so its dvclive files (every TSV and
    ``metrics.json``) are byte for byte those of the run that wrote the checkpoint, whether it resumes
    mid-training or is restored from a complete checkpoint after DVC deleted the run directory.
    """

    def __init__(self, live=None):
        self.live = live
        self.history: list = []

    def log(self, step: int, values: dict) -> None:
        self.history.append([step, [[name, value] for name, value in values.items()]])
        if self.live is not None:
            self.live.step = step
            for name, value in values.items():
                self.live.log_metric(name, value)

    def replay(self, history: list) -> None:
        """Log a checkpoint's history again (the curves up to its step)."""
        for step, values in history:
            self.log(step, dict(values))
