"""DVC stage `export_imagefolder`: the bundled idx dataset written out as an ImageNet-style class-folder
tree (``export_imagefolder`` params), which `prepare` then reads with ``data.format: imagefolder``.

Profiles whose data already is an image folder (mini's own data, full's ImageNet) set the section to
null; the stage then writes an empty directory.
"""

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.config.params import load_params
from dpnrepro.data.sources import export_idx_as_imagefolder
from dpnrepro.io import atomic_dir

OUT = "data/raw/imagefolder"


@stage
def main() -> None:
    stage_arguments(__doc__)
    spec = load_params().export_imagefolder
    with atomic_dir(OUT) as tmp:
        if spec is None:
            (tmp / "NONE.txt").write_text("this profile exports no image folder (export_imagefolder: null)\n")
            return
        counts = export_idx_as_imagefolder(spec.source, tmp, per_class={"train": spec.train_per_class,
                                                                         "test": spec.test_per_class})
    print(f"exported {spec.source} to {OUT}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
