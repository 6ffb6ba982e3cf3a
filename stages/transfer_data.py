"""DVC stage `transfer_data`: build the offline stand-ins of the transfer tasks (Tables 3 and 7) from
real images that install here (transfer/smoke_data.py) → data/transfer/<name>/ (``save_to_disk``).
The smoke and mini profiles point their VTAB tasks and Sun397 at them; full lists none (real copies)."""

from pathlib import Path

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.config.params import load_params
from dpnrepro.config.transfer import TransferDataParams
from dpnrepro.io import atomic_dir
from dpnrepro.transfer.smoke_data import build_source


@stage
def main() -> None:
    stage_arguments(__doc__)
    td: TransferDataParams = load_params().transfer_data
    with atomic_dir(Path(td.out)) as tmp:
        for name, src in td.sources.items():
            ds = build_source(src.kind, src.counts, src.seed, td.fashion_mnist)
            ds.save_to_disk(str(tmp / name))
            print(f"built {name} ({src.kind}): " + ", ".join(f"{k} {len(v)}" for k, v in ds.items()))
        (tmp / "SOURCES.txt").write_text("".join(f"{n}: {s.kind}\n" for n, s in td.sources.items()) or "(none)\n")


if __name__ == "__main__":
    main()
