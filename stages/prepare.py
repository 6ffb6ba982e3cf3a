"""DVC stage `prepare`: raw datasets → data/prepared/{train,minival,val} + manifest.json, and the
pretraining datasets of the 21k / JFT-style sweeps (if the profile has them) → data/upstream/<section>/."""

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.config.params import load_params
from dpnrepro.data.prepare import PREPARED, UPSTREAM, prepare_dataset
from dpnrepro.io import atomic_dir

UPSTREAM_SECTIONS = ("data_i21k", "data_jft")


def _report(section: str, manifest: dict) -> None:
    counts = ", ".join(f"{k} {v['examples']}" for k, v in manifest["splits"].items())
    print(f"prepared {section} ({manifest['dataset']}): {counts}")


@stage
def main() -> None:
    stage_arguments(__doc__)
    params = load_params()
    workers = params.runtime.prepare_workers  # execution setting: the outputs do not depend on it
    _report("data", prepare_dataset(params.data.model_dump(), PREPARED, workers))
    with atomic_dir(UPSTREAM) as tmp:
        present = [s for s in UPSTREAM_SECTIONS if getattr(params, s) is not None]
        for section in present:
            _report(section, prepare_dataset(getattr(params, section).model_dump(), tmp / section, workers))
        note = "\n".join(present) if present else "(none: this profile's pretraining sweeps train on `data`)"
        (tmp / "SECTIONS.txt").write_text(f"Prepared pretraining datasets:\n{note}\n")


if __name__ == "__main__":
    main()
