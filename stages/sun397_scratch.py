"""DVC stage `sun397_scratch`: Table 7's from-scratch search (appendix F) per arch × stem in one process
(transfer/scratch.py) → metrics/sun397_scratch.json. Resumable (checkpoints/sun397_scratch/, persistent)."""

from pathlib import Path

from dpnrepro.cli import stage
from dpnrepro.config import load_params
from dpnrepro.io import write_json_atomic
from dpnrepro.transfer.scratch import run_scratch


@stage
def main() -> None:
    metrics = run_scratch(load_params())
    out = Path("metrics") / "sun397_scratch.json"
    write_json_atomic(out, metrics)
    print(f"wrote {out} ({len(metrics['runs'])} variants)")


if __name__ == "__main__":
    main()
