"""The ``figures`` section: Figures 2-4 from the runs of one sweep."""

from __future__ import annotations

from pydantic import Field

from dpnrepro.config.core import _Section


class FiguresParams(_Section):
    """Figures 2-4 (gradient norms from the trainer's dvclive logs) and Figure 3 (the first LN's scale),
    all from the runs of one sweep (the paper: its ImageNet-1k AugReg models)."""

    sweep: str = "table1"
    figure2_arch: str = Field("B-16", description="Fig. 2 (depth profile + embedding norm over steps): B/16 in the paper")
    figure4_archs: list[str] = Field(default_factory=lambda: ["B-32", "S-32", "S-16"],
                                     description="Fig. 4 (appendix H): the depth profile of the other archs")
    figure3_arch: str = Field("Ti-16", description="Fig. 3: the first LN's scale of this arch's dpn run (seed 0 or the first)")
    last_steps: int = Field(1000, gt=0, description="Fig. 2/4 left: mean over the logged steps in the last N steps")

    def check(self, params) -> None:
        """Against the rest of params.yaml (:func:`dpnrepro.config.params.parse_params`)."""
        src = params.sweeps().get(self.sweep)
        if src is None:
            raise ValueError(f"figures.sweep: {self.sweep!r} is not a sweep of this profile")
        missing = [a for a in dict.fromkeys([self.figure2_arch, *self.figure4_archs, self.figure3_arch])
                   if a not in src.archs]
        if missing:
            raise ValueError(f"figures: archs {missing} are not in sweep {self.sweep} ({', '.join(src.archs)})")
        if not {"conv", "dpn"} <= set(src.stems):
            raise ValueError(f"figures: sweep {self.sweep} needs the conv and dpn stems (base vs DPN)")

