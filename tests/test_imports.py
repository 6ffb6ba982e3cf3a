"""No import circle among the modules of src/dpnrepro, imports inside functions included: a circle ties two
layers together and makes the import order matter (as pipeline <-> reports.index once did)."""

from __future__ import annotations

import graphlib

from dpnrepro.codedeps import import_graph
from helpers import REPO


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
