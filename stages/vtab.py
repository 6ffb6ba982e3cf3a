"""DVC stage `vtab`: Table 3's fine-tunes, every task × arch × stem × lr × seed in one process
(transfer/vtab.py) → metrics/vtab.json. Resumable (checkpoints/vtab/, persistent)."""

from pathlib import Path

from dpnrepro.cli import stage
from dpnrepro.config import load_params
from dpnrepro.io import write_json_atomic
from dpnrepro.transfer.vtab import run_vtab


@stage
def main() -> None:
    metrics = run_vtab(load_params())
    out = Path("metrics") / "vtab.json"
    write_json_atomic(out, metrics)
    print(f"wrote {out} ({len(metrics['tasks'])} tasks)")


if __name__ == "__main__":
    main()
