"""The interface every sweep evaluator shares (big_vision's: one module per evaluator, each an ``Evaluator``
built from its config and run on the model, giving named metrics).

An evaluator module (named in :data:`dpnrepro.config.sweeps.EVALUATORS`) exposes ``Evaluator``, a
:class:`RunEvaluator`: built from the sweep's settings for it (its params section, or None), the eval
input settings and where and how to run, then ``run(run_dir)`` scores one trained run and returns its
metrics (a JSON-ready dict). Inside a ``torchrun`` session every rank runs it on its shard and gets the
whole result (tests/test_eval_distributed.py).
"""

from __future__ import annotations

from pathlib import Path


class RunEvaluator:
    """Scores trained runs (directories with spec + safetensors) on the prepared data."""

    def __init__(self, config, input_cfg: dict, *, prepared_dir: Path | str, batch_size: int = 256,
                 device="auto", progress: bool = True):
        self.config = config  # the evaluator's params section (None for one without settings)
        self.input_cfg = input_cfg
        self.prepared_dir = prepared_dir
        self.batch_size = batch_size
        self.device = device  # train.device (auto/cpu/cuda) or a torch.device
        self.progress = progress

    def run(self, run_dir: Path) -> dict:
        """The metrics of the run in ``run_dir``."""
        raise NotImplementedError

    def run_all(self, run_dirs: list[Path]) -> list[dict]:
        """The metrics of each run in ``run_dirs``, in order (an evaluator may score them together: each is
        what :meth:`run` gives it alone)."""
        return [self.run(run_dir) for run_dir in run_dirs]
