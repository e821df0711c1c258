"""The pipeline graph: the nodes reachable from a job's sinks, checked and explained."""

from __future__ import annotations

from typing import Callable, Iterator

from ember.errors import PipelineError
from ember.graph.nodes import (
    IntervalJoinNode,
    KeyedProcessNode,
    Node,
    SinkNode,
    SourceNode,
    SqlNode,
    UnionNode,
    VectorizedProcessNode,
    WindowNode,
)

__all__ = ["Graph", "ancestors", "from_the_sinks", "components", "STATEFUL"]

# The node types that keep state across records (keyed state, windows, joins of two streams).
# A SQL step counts as stateful: Spark may plan aggregations, windows or joins in it.
STATEFUL = (WindowNode, KeyedProcessNode, VectorizedProcessNode, IntervalJoinNode, SqlNode)


class Graph:
    """An immutable view over the nodes a set of sinks depends on, in topological order."""

    def __init__(self, sinks: list[SinkNode]) -> None:
        self.sinks = list(sinks)
        self.nodes = _topological(self.sinks)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    @property
    def sources(self) -> list[SourceNode]:
        return [n for n in self.nodes if isinstance(n, SourceNode)]

    def validate(self) -> "Graph":
        """Structural checks that hold for any engine. Raises :class:`PipelineError`.
        What one engine cannot run (a runner's plan) is checked by that runner."""
        if not self.sinks:
            raise PipelineError(
                "the pipeline has no sink; end it with .sink_to(...) (e.g. CollectSink() or ConsoleSink())"
            )
        names: dict[str, Node] = {}
        for node in self.nodes:
            if node.name in names and names[node.name] is not node:
                raise PipelineError(f"two steps are named '{node.name}'; step names must be unique")
            names[node.name] = node
            if isinstance(node, UnionNode) and len(node.inputs) < 2:
                raise PipelineError("a union needs at least two streams", node.name)
        return self

    def readers(self) -> dict[int, list[Node]]:
        """``id(step)`` -> the steps reading it directly (sinks included)."""
        out: dict[int, list[Node]] = {}
        for node in self.nodes:
            for parent in node.inputs:
                out.setdefault(id(parent), []).append(node)
        return out

    def sinks_after(self, node: Node) -> list[SinkNode]:
        """The sinks that read ``node``'s records, directly or through other steps."""
        return [s for s in self.sinks if any(a is node for a in ancestors(s))]

    def explain(self, note: Callable[[Node], str] | None = None) -> str:
        """A readable rendering: one line per step, inputs indented under it; ``note``
        (a runner's) adds how a step runs, in parentheses."""
        lines: list[str] = []

        def walk(node: Node, depth: int) -> None:
            how = note(node) if note is not None else ""
            lines.append(f"{'  ' * depth}{node.name}: {node.describe()}" + (f" ({how})" if how else ""))
            for parent in node.inputs:
                walk(parent, depth + 1)

        for sink in self.sinks:
            walk(sink, 0)
        return "\n".join(lines)


def _topological(sinks: list[SinkNode]) -> list[Node]:
    return _depth_first(sinks, pre=False)


def from_the_sinks(sinks: list[SinkNode]) -> list[Node]:
    """Every step, depth first from the sinks: a step before its inputs, inputs in order
    (the order Spark numbers a query's stateful operators in)."""
    return _depth_first(sinks, pre=True)


def _depth_first(sinks: list[SinkNode], pre: bool) -> list[Node]:
    order: list[Node] = []
    seen: set[int] = set()

    def visit(node: Node) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if pre:
            order.append(node)
        for parent in node.inputs:
            visit(parent)
        if not pre:
            order.append(node)

    for sink in sinks:
        visit(sink)
    return order


def ancestors(node: Node) -> Iterator[Node]:
    """Every step ``node`` reads from, directly or through other steps."""
    stack = list(node.inputs)
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        stack.extend(n.inputs)


def components(graph: Graph) -> list[list[SinkNode]]:
    """The graph's unrelated pipelines: its sinks grouped by the steps they share, directly or
    through other sinks (two sinks reading one source are in one group), each group in the
    order of ``graph.sinks`` and the groups in the order of their first sink."""
    order = {id(s): i for i, s in enumerate(graph.sinks)}
    groups: list[tuple[list[SinkNode], set[int]]] = []
    for sink in graph.sinks:
        steps = {id(sink)} | {id(n) for n in ancestors(sink)}
        joined = [g for g in groups if g[1] & steps]
        sinks = [s for g in joined for s in g[0]] + [sink]
        for g in joined:
            steps |= g[1]
        groups = [g for g in groups if not any(g is j for j in joined)]
        groups.append((sorted(sinks, key=lambda s: order[id(s)]), steps))
    groups.sort(key=lambda g: order[id(g[0][0])])
    return [g[0] for g in groups]

