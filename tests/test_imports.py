"""No import circle among the modules of src/dpnrepro, imports inside functions included: a circle ties two
layers together and makes the import order matter (as pipeline <-> reports.index once did). ``import dpnrepro``
is light (no torch, timm or numpy), and ``import dpnrepro.models`` registers the family with timm in any order."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys

import pytest

from dpnrepro.codedeps import import_graph
from helpers import REPO, clean_env


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return err.args[1]
    return None


def test_dpnrepro_modules_import_each_other_without_a_circle():
    graph = import_graph(REPO)
    assert {"dpnrepro.pipeline", "dpnrepro.reports.index", "dpnrepro.models.vision_transformer_dpn"} <= graph.keys()
    assert "dpnrepro.cost.gpu_hours" in graph["dpnrepro.reports.index"]
    circle = _circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_graph_follows_imports_in_functions_and_relative_ones_but_not_parent_packages(tmp_path):
    pkg = tmp_path / "src" / "dpnrepro"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from dpnrepro import sub\n")
    (pkg / "sub" / "__init__.py").write_text("from .low import f\n")
    (pkg / "sub" / "low.py").write_text("import json\n\ndef f():\n    return json\n")
    (pkg / "top.py").write_text("from dpnrepro.sub import low\n")
    graph = import_graph(tmp_path)
    # sub.low is imported only through parent packages on the way; it names none of them
    assert graph == {"dpnrepro": {"dpnrepro.sub"}, "dpnrepro.sub": {"dpnrepro.sub.low"}, "dpnrepro.sub.low": set(),
                     "dpnrepro.top": {"dpnrepro.sub.low"}}
    assert _circle(graph) is None
    # a circle closed by an import inside a function
    (pkg / "sub" / "low.py").write_text("def f():\n    from dpnrepro.top import g\n    return g\n")
    (pkg / "top.py").write_text("from dpnrepro.sub.low import f\n\ndef g():\n    return f\n")
    circle = _circle(import_graph(tmp_path))
    assert circle is not None and set(circle) == {"dpnrepro.top", "dpnrepro.sub.low"}
    # an import under `if TYPE_CHECKING:` names a type for annotations and never runs: no edge, no circle
    (pkg / "sub" / "low.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                        "    from dpnrepro.top import g\n")
    assert _circle(import_graph(tmp_path)) is None
    assert import_graph(tmp_path)["dpnrepro.sub.low"] == set()


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300)


def test_import_dpnrepro_loads_neither_torch_nor_timm_nor_numpy():
    """The package applies the CPU pins and nothing else: a stage that only turns JSON into Markdown does not
    pay seconds for torch (tests/test_stage_startup.py checks the stages themselves)."""
    proc = _fresh("import sys, dpnrepro, dpnrepro.cli, dpnrepro.model_spec\n"
                  "print(sorted(m for m in ('torch', 'timm', 'numpy', 'mmengine', 'dvc') if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


FAMILY = [f"{base}_{stem}" for base in ("vit_tiny_patch16", "vit_small_patch16", "vit_small_patch32", "vit_base_patch16",
                                        "vit_base_patch32", "vit_large_patch16", "vit_huge_patch14", "vit_mu_patch4")
          for stem in ("dpn", "linear", "conv")]


@pytest.mark.parametrize("imports", ["import dpnrepro.models, timm", "import dpnrepro, timm, torch, dpnrepro.models",
                                     "from dpnrepro.models.vision_transformer_dpn import build_vit"])
def test_import_dpnrepro_models_registers_the_family_with_timm_in_any_order(imports):
    """As timm's own families: importing the models package (before or after timm) registers every
    ``vit_<size>_patch<p>_{dpn,linear,conv}``, and timm builds them by name."""
    proc = _fresh(f"{imports}\nimport timm\nprint(sorted(timm.list_models('vit_*_dpn') + timm.list_models('vit_*_linear')"
                  " + timm.list_models('vit_*_conv')))\n"
                  "m = timm.create_model('vit_mu_patch4_linear', img_size=8, num_classes=3)\n"
                  "print(type(m).__module__)")
    assert proc.returncode == 0, proc.stderr
    names, module = proc.stdout.strip().splitlines()
    assert set(FAMILY) <= set(ast.literal_eval(names)), names
    assert module == "dpnrepro.models.vision_transformer_dpn"

