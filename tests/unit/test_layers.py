"""Ember's layers depend one way (docs/design/core.md, "Layers"): a module may import
from its own layer and the layers below it, never from one above, and no modules
import each other in a circle. Read from the source with ``ast``: every import
counts, at module level or inside a function, under ``TYPE_CHECKING`` or not."""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"

# From the bottom up. A module belongs to the longest prefix listed.
LAYERS: list[tuple[str, ...]] = [
    ("ember.errors", "ember.version"),
    ("ember.time",),
    # declarations: what a user writes, engine-neutral
    ("ember.state", "ember.functions", "ember.rolling", "ember.coprocess", "ember.chaining", "ember.windowing", "ember.connectors",
     "ember.job"),
    ("ember.graph",),
    ("ember.runner",),
    ("ember.savepoints",),
    ("ember.ui",),  # the dashboard: listens to the runner, read by the user API's execute
    ("ember.api",),
    ("ember.cep",),  # complex event processing: patterns, their matcher, a keyed step through the API
    ("ember",),  # the package root re-exports the user-facing names
    ("ember.cli", "ember.tools", "ember.bench"),
]


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    if rank < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return rank


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path) -> set[str]:
    """The ember modules ``path`` imports (``from ember.x import y`` counts as ember.x.y
    when ember.x.y is a module, else ember.x)."""
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ember"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "ember":
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
    return found


FILES = sorted(SRC.joinpath("ember").rglob("*.py"))
MODULES = {module_name(f) for f in FILES}
GRAPH = {module_name(f): imports(f) for f in FILES}


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer_of(module)


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [
        f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
        for m, targets in sorted(GRAPH.items()) for t in sorted(targets)
        if t in MODULES and layer_of(t) > layer_of(m)
    ]
    assert not upward, "imports against the layering:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _without_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """A package's ``__init__`` re-exporting its modules is not a cycle of those modules:
    drop the edges from a package to the modules inside it."""
    return {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}


def test_no_import_cycles():
    cycles = _cycles(_without_packages(GRAPH))
    assert not cycles, "modules that import each other in a circle:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_the_cycle_finder_finds_cycles(edges, expected):
    assert _cycles(edges) == expected


def test_an_upward_import_would_be_reported():
    assert layer_of("ember.runner.spark.execution") < layer_of("ember.api.environment")
    assert layer_of("ember.graph.graph") < layer_of("ember.runner.spark.planner")
