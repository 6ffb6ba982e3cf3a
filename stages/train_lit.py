"""DVC stage `lit_train`: a text tower from scratch against every locked image tower of ``lit.towers``,
``lit.seeds`` runs each (Table 4) → runs/lit/."""

from dpnrepro.cli import stage
from dpnrepro.config import load_params
from dpnrepro.errors import ParamsError
from dpnrepro.lit.run import train_lit


@stage
def main() -> None:
    params = load_params()
    if params.lit is None:
        raise ParamsError("params.yaml has no `lit` section (Table 4); copy it from profiles/")
    written = train_lit(params)
    print(f"trained {len(written)} LiT runs")


if __name__ == "__main__":
    main()
