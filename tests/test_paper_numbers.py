"""Faithfulness tests for the transcribed paper tables (reports/paper/tableN.yaml).

The strongest check rebuilds each table's printed text (layout headers written
here, numbers taken from the YAML) and asserts it occurs verbatim, modulo
whitespace, in the paper's PDF extraction (tests/paper_text.py says where it comes from).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpnrepro.errors import UserError
from dpnrepro.reports.paper import as_float, load_paper_table, paper_dir, paper_value
from paper_text import PAPER, source_text

REPO_ROOT = Path(__file__).resolve().parents[1]

TABLES = range(1, 8)
TOP_KEYS = {"table", "title", "source", "metric", "ci", "rows"}
ROW_KEYS = {
    1: {"part", "dataset", "block", "arch", "variant", "value", "ci95"},
    2: {"part", "dataset", "block", "steps", "arch", "variant", "value", "ci95"},
    3: {"arch", "variant", "group", "dataset", "value", "ci95"},
    4: {"arch", "steps", "variant", "value", "ci95"},
    5: {"arch", "variant", "fraction", "value", "ci95"},
    6: {"variant", "arch", "value", "ci95"},
    7: {"part", "arch", "setting", "variant", "value", "ci95"},
}
# Row counts computed from the paper's layout.
ROW_COUNTS = {
    1: 10 * 2 + 10 * 2,  # left: 6 AugReg + 2 DeiT + 2 finetune archs; right: 5 archs x 2 schedules
    2: 6 * 2 + 8 * 2,  # left: 3 archs x 2 schedules; right: 2 archs x 2 res x 2 schedules
    3: 2 * 2 * 19,  # B/32, B/16 x base/dpn x 19 VTAB datasets
    4: 4 * 2,
    5: 5 * 2,
    6: 6 * 5,  # 6 ablations x 5 archs (gains relative to DPN, no base/dpn pair)
    7: 2 * 3 * 2,  # 2 archs x 3 settings x base/dpn
}
CI_TABLES = {1, 2, 4, 5}

VALUE_RE = re.compile(r"^-?\d+\.\d$")  # the paper prints every value with one decimal
CI_RE = re.compile(r"^\d+\.\d{1,2}$")  # and CIs with one or two decimals


# ----------------------------------------------------------------- helpers --
def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def _printed(row: dict) -> str:
    return row["value"] if row["ci95"] is None else f"{row['value']}±{row['ci95']}"


class _Tracker:
    """Looks up cells via paper_value and records which rows were used."""

    def __init__(self, n: int):
        self.n = n
        self.used: set[tuple] = set()

    def __call__(self, **match) -> str:
        row = paper_value(self.n, **match)
        self.used.add(tuple(sorted((k, str(v)) for k, v in row.items())))  # distinct rows by content
        return _printed(row)

    def n_used(self) -> int:
        return len(self.used)


def _reconstruct(n: int) -> tuple[str, int]:
    """Printed text of table n (layout from the paper, numbers from the YAML)."""
    c = _Tracker(n)
    parts: list[str] = []
    if n == 1:
        parts.append("Arch Base DPN")
        for block, header, archs in [
            ("ViT AugReg", "ViT AugReg", ["S/32", "Ti/16", "B/32", "S/16", "S/16+", "B/16"]),
            ("DeiT", "DeiT", ["S/16", "B/16"]),
            ("AugReg + 384x384 finetune", "AugReg + 384×384Finetune", ["B/32", "B/16"]),
        ]:
            parts.append(header)
            for a in archs:
                parts.append(a + " " + "".join(c(part="left", block=block, arch=a, variant=v) for v in ("base", "dpn")))
        parts.append("Arch Base DPN")
        for steps in ("93K", "930K"):
            parts.append(f"{steps} Steps")
            for a in ["Ti/16", "S/32", "B/32", "S/16", "B/16"]:
                parts.append(a + " " + "".join(c(part="right", steps=steps, arch=a, variant=v) for v in ("base", "dpn")))
    elif n == 2:
        parts.append("Arch Base DPN")
        for steps in ("220K", "1.1M"):
            parts.append(f"{steps} steps")
            for a in ["B/32", "B/16", "L/16"]:
                parts.append(a + " " + "".join(c(part="left", steps=steps, arch=a, variant=v) for v in ("base", "dpn")))
        parts.append("Arch Resolution Steps Base DPN")
        for a in ["B/32", "L/16"]:
            for steps, res in [("220K", "224"), ("220K", "384"), ("1.1M", "224"), ("1.1M", "384")]:
                parts.append(f"{a} {res} {steps} " + "".join(
                    c(part="right", arch=a, resolution=res, steps=steps, variant=v) for v in ("base", "dpn")))
    elif n == 3:
        meta = load_paper_table(3)["datasets"]
        for cols in (meta["natural"] + meta["specialized"], meta["structured"]):
            parts.extend(cols)
            for a in ("B/32", "B/16"):
                for v, label in (("base", a), ("dpn", "+ DPN")):
                    parts.append(label + " " + " ".join(c(arch=a, variant=v, dataset=d) for d in cols))
    elif n == 4:
        parts.append("Arch Steps Base DPN")
        for a, steps in [("B/32", "220K"), ("B/32", "1.1M"), ("L/16", "220K"), ("L/16", "1.1M")]:
            parts.append(f"{a} {steps} " + "".join(c(arch=a, steps=steps, variant=v) for v in ("base", "dpn")))
    elif n == 5:
        fr = ["1/16", "1/8", "1/4", "1/2", "1"]
        parts.append("Fraction of Train Data " + " ".join(fr))
        for v, label in (("base", "B/16"), ("dpn", "+DPN")):
            parts.append(label + " " + "".join(c(arch="B/16", variant=v, fraction=f) for f in fr))
    elif n == 6:
        archs = ["B/16", "S/16", "B/32", "S/32", "Ti/16"]
        parts.append(" ".join(archs))
        for abl in ["Pre", "Post", "Post PosEmb", "Only learnable", "RMSNorm", "No learnable"]:
            parts.append(abl + " " + " ".join(c(variant=abl, arch=a) for a in archs))
    elif n == 7:
        for part, a in (("left", "B/32"), ("right", "B/16")):
            parts.append("Base DPN")
            for setting, label in [("from scratch", ""), ("+ Augmentation", "+ Augmentation"),
                                   ("+ Train Longer", "+ Train Longer")]:
                parts.append(label + " " + " ".join(
                    c(part=part, arch=a, setting=setting, variant=v) for v in ("base", "dpn")))
    else:  # pragma: no cover
        raise ValueError(n)
    return "\n".join(parts), c.n_used()


# ------------------------------------------------------------------- tests --
@pytest.mark.parametrize("n", TABLES)
def test_table_structure(n):
    t = load_paper_table(n)
    assert TOP_KEYS <= set(t), f"table {n} lacks {TOP_KEYS - set(t)}"
    assert t["table"] == n
    assert t["source"].startswith("seed 000")
    rows = t["rows"]
    assert len(rows) == ROW_COUNTS[n] == t.get("n_rows", len(rows))
    keys = ROW_KEYS[n]
    seen = set()
    for r in rows:
        assert keys <= set(r), f"table {n} row {r} lacks {keys - set(r)}"
        assert isinstance(r["value"], str) and VALUE_RE.match(r["value"]), r
        if n in CI_TABLES:
            assert isinstance(r["ci95"], str) and CI_RE.match(r["ci95"]), r
        else:
            assert r["ci95"] is None, r
        ident = tuple(sorted((k, str(v)) for k, v in r.items() if k not in ("value", "ci95")))
        assert ident not in seen, f"table {n}: duplicate row key {ident}"
        seen.add(ident)


def test_table_parts_and_metrics():
    assert {r["part"] for r in load_paper_table(1)["rows"]} == {"left", "right"}
    assert sum(r["part"] == "left" for r in load_paper_table(1)["rows"]) == 20
    assert sum(r["part"] == "left" for r in load_paper_table(2)["rows"]) == 12
    assert load_paper_table(6)["metric"] == "accuracy gain over DPN (points)"
    t3 = load_paper_table(3)
    assert [len(t3["datasets"][g]) for g in ("natural", "specialized", "structured")] == [7, 4, 8]
    for r in t3["rows"]:
        assert r["dataset"] in t3["datasets"][r["group"]]
    assert {r["fraction"] for r in load_paper_table(5)["rows"]} == {"1/16", "1/8", "1/4", "1/2", "1"}


@pytest.mark.parametrize("n", TABLES)
def test_printed_values_occur_in_seed(n):
    text = source_text(PAPER)
    for r in load_paper_table(n)["rows"]:
        assert _printed(r) in text, f"table {n}: {_printed(r)!r} not in seed ({r})"


@pytest.mark.parametrize("n", TABLES)
def test_reconstructed_table_matches_seed(n):
    """Rebuild the printed (glued) table from the YAML and find it verbatim in the seed."""
    seed = _squash(source_text(PAPER))
    printed, n_used = _reconstruct(n)
    assert n_used == ROW_COUNTS[n], f"table {n}: reconstruction used {n_used} rows"
    want = _squash(printed)
    if want not in seed:
        # report the longest prefix that does match, to localise the error
        k = max(i for i in range(len(want) + 1) if want[:i] in seed)
        pytest.fail(f"table {n}: reconstruction diverges from seed after {want[max(0, k - 40):k]!r} "
                    f"(expected next: {want[k:k + 40]!r})")


def test_reconstructed_lines_examples():
    """The glued lines quoted in the brief come out exactly."""
    seed = source_text(PAPER)
    t1, _ = _reconstruct(1)
    assert "S/32 72.1±0.0774.0±0.09" in t1.splitlines()
    assert "S/16 72.5±0.172.5±0.1" in t1.splitlines()
    t3, _ = _reconstruct(3)
    assert "+ DPN 87.7 58.1 60.7 86.4 88.0 35.4 80.3 78.5 95.0 81.6 70.3" in t3.splitlines()
    for glued in ("81.670.3", "33.976.7", "78.380.6", "83.573.3", "71.359.8", "61.673.4",
                  "59.839.7", "73.748.3", "41.072.4", "63.080.6", "21.636.2"):
        assert glued in seed


@pytest.mark.parametrize(
    "n, match, value, ci",
    [
        (1, dict(part="left", block="ViT AugReg", arch="B/16", variant="dpn"), "81.1", "0.09"),
        (1, dict(part="left", block="ViT AugReg", arch="S/16", variant="dpn"), "79.7", "0.2"),
        (1, dict(part="right", steps="930K", arch="S/16", variant="base"), "72.5", "0.1"),
        (1, dict(part="left", block="AugReg + 384x384 finetune", arch="B/16", variant="dpn"), "82.8", "0.00"),
        (2, dict(part="left", steps="1.1M", arch="B/16", variant="dpn"), "76.6", "0.03"),
        (2, dict(part="right", arch="B/32", resolution="224", steps="1.1M", variant="base"), "80.8", "0.1"),
        (2, dict(part="right", arch="L/16", resolution="384", steps="1.1M", variant="dpn"), "88.3", "0.06"),
        (3, dict(arch="B/32", variant="dpn", dataset="Resisc45"), "81.6", None),
        (3, dict(arch="B/32", variant="dpn", dataset="Retinopathy"), "70.3", None),
        (3, dict(arch="B/16", variant="base", dataset="SVHN"), "76.7", None),
        (3, dict(arch="B/16", variant="dpn", dataset="sNORB-Elev"), "36.2", None),
        (3, dict(arch="B/32", variant="base", dataset="dSpr-Ori"), "59.8", None),
        (4, dict(arch="L/16", steps="1.1M", variant="dpn"), "78.7", "0.1"),
        (5, dict(arch="B/16", variant="dpn", fraction="1"), "46.1", "0.11"),
        (5, dict(arch="B/16", variant="dpn", fraction="1/16"), "28.0", "0.21"),
        (6, dict(variant="Pre", arch="B/32"), "-2.6", None),
        (6, dict(variant="RMSNorm", arch="Ti/16"), "-1.7", None),
        (7, dict(arch="B/16", setting="+ Train Longer", variant="dpn"), "66.3", None),
        (7, dict(arch="B/32", setting="from scratch", variant="base"), "41.4", None),
    ],
)
def test_spot_values(n, match, value, ci):
    row = paper_value(n, **match)
    assert (row["value"], row["ci95"]) == (value, ci)


def test_api_errors_and_root_override(tmp_path, monkeypatch):
    with pytest.raises(KeyError, match="no row"):
        paper_value(1, arch="H/14")
    with pytest.raises(KeyError, match="rows match"):
        paper_value(1, arch="B/16")
    with pytest.raises(UserError, match="table99.yaml is missing"):
        load_paper_table(99)
    assert paper_dir() == REPO_ROOT / "reports" / "paper"
    assert as_float(paper_value(6, variant="Pre", arch="B/32")["value"]) == -2.6
    monkeypatch.setenv("DPNREPRO_ROOT", str(tmp_path))
    assert paper_dir() == tmp_path.resolve() / "reports" / "paper"
    with pytest.raises(UserError, match="table1.yaml is missing"):
        load_paper_table(1)


def test_recipe_text_names_the_pretraining_data_of_upstream_sweeps():
    from dpnrepro.artifacts import describe_recipe
    from dpnrepro.config.sweeps import SWEEPS, sweep_config
    from dpnrepro.config.params import load_params

    params = load_params(REPO_ROOT / "params.yaml")

    def described(sweep):  # what the train stage writes to config.json, as the evaluate stage reads it
        return describe_recipe({"dataset": SWEEPS[sweep].dataset, **sweep_config(params, sweep, "Mu-7").recipe()})

    jft = described("jft_220k")
    assert jft.endswith("; trained on `data_jft`: fashion_mnist_hierarchy (multi-label, 14 classes)"), jft
    assert "trained on" not in described("table1")
    assert "repeats 3" in described("deit") and "mixup 0.8" in described("deit")


def test_recipe_text_resolves_a_prior_head_bias():
    """``head_bias_init: prior`` (a documented value) is printed as the logit(1/K) it resolves to; the
    recipe line once crashed at evaluation on it (a ``:g`` format of the string)."""
    from dpnrepro.artifacts import describe_recipe
    from dpnrepro.config.params import load_params
    from dpnrepro.config.sweeps import SWEEPS, sweep_config

    config = {"dataset": SWEEPS["ft384"].dataset,
              **sweep_config(load_params(REPO_ROOT / "params.yaml"), "ft384", "Mu-7").recipe()}
    config["model"]["head_bias_init"] = "prior"
    assert "head bias logit(1/10) = -2.2;" in describe_recipe(config)
