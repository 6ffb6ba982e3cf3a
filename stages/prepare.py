"""DVC stage `prepare`: raw dataset → data/prepared/{train,minival,val} + manifest.json."""

from dpnrepro.cli import stage
from dpnrepro.config import load_params
from dpnrepro.data.prepare import prepare_dataset


@stage
def main() -> None:
    params = load_params()
    manifest = prepare_dataset(params.data.model_dump(), "data/prepared")
    counts = ", ".join(f"{k} {v['examples']}" for k, v in manifest["splits"].items())
    print(f"prepared {params.data.name}: {counts}")


if __name__ == "__main__":
    main()
