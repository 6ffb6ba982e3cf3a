"""DVC stage `export_seg_canvases`: the smoke segmentation data (Table 5) in the ADE20K layout,
``data/raw/seg_canvases/{images,annotations}/{training,validation}`` (data/segmentation.py).

Profiles that train on ADE20K itself set ``export_seg_canvases: null``; the stage then writes an
empty directory."""

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.config.params import load_params
from dpnrepro.config.segmentation import SegCanvasParams
from dpnrepro.data.segmentation import export_canvases
from dpnrepro.io import atomic_dir

OUT = "data/raw/seg_canvases"


@stage
def main() -> None:
    stage_arguments(__doc__)
    spec: SegCanvasParams | None = load_params().export_seg_canvases
    with atomic_dir(OUT) as tmp:
        if spec is None:
            (tmp / "NONE.txt").write_text("this profile exports no canvases (export_seg_canvases: null)\n")
            return
        counts = export_canvases(spec.source, tmp, train_images=spec.train_images, val_images=spec.val_images,
                                 size=spec.size, items=tuple(spec.items), seed=spec.seed)
    print(f"wrote {OUT}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
