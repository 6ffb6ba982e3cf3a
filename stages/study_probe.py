"""DVC stage `study_probe` (study/dvc.yaml): what DPN's first LayerNorm removes from the study's images (a
census of patches and linear probes, dpnrepro.study.probe) → metrics/study_probe.json. CPU, about a minute."""

from pathlib import Path

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.io import write_json_atomic
from dpnrepro.study.config import load_study_params
from dpnrepro.study.probe import METRICS_NAME, run_probes

OUT = Path("metrics") / METRICS_NAME


@stage
def main() -> None:
    stage_arguments(__doc__)
    write_json_atomic(OUT, run_probes(load_study_params()))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
