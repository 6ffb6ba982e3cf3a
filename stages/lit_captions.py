"""DVC stage `lit_captions`: the smoke profile's image-caption corpus (Fashion-MNIST images, captions
from their real labels; ``lit_captions`` params) as a `datasets` directory with ``image`` and ``text``.
Profiles that point ``lit.data.source`` at a corpus of their own set the section to null; the stage
then writes an empty directory."""

from dpnrepro.cli import stage, stage_arguments
from dpnrepro.config.lit import LitCaptionsParams
from dpnrepro.config.params import load_params
from dpnrepro.io import atomic_dir

OUT = "data/raw/lit_captions"


@stage
def main() -> None:
    stage_arguments(__doc__)
    spec: LitCaptionsParams | None = load_params().lit_captions
    with atomic_dir(OUT) as tmp:
        if spec is None:
            (tmp / "NONE.txt").write_text("this profile builds no caption corpus (lit_captions: null)\n")
            return
        from dpnrepro.lit.captions import fashion_mnist_captions

        ds = fashion_mnist_captions(spec.source, spec.split, per_class=spec.per_class, parents=spec.parents,
                                    group_names=spec.group_names, wordnet=spec.wordnet, seed=spec.seed)
        ds.save_to_disk(str(tmp))
    print(f"wrote {OUT}: {len(ds)} image-caption pairs, e.g. {ds[0]['text']!r}")


if __name__ == "__main__":
    main()
