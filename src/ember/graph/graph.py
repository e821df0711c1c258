"""The pipeline graph: the nodes reachable from a job's sinks, checked and explained."""

from __future__ import annotations

from typing import Iterator

from ember.errors import PipelineError
from ember.graph.nodes import KeyByNode, Node, SinkNode, SourceNode, UnionNode, WindowAggregateNode

__all__ = ["Graph"]


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
        """Structural checks that need no Spark. Raises :class:`PipelineError`."""
        if not self.sinks:
            raise PipelineError(
                "the pipeline has no sink; end it with .sink_to(...) (e.g. CollectSink() or ConsoleSink())"
            )
        if len(self.sinks) > 1:
            names = ", ".join(s.name for s in self.sinks)
            raise PipelineError(
                f"Ember runs one Spark query per job and this job has {len(self.sinks)} sinks ({names}); "
                "execute each sink's pipeline as its own job"
            )
        names: dict[str, Node] = {}
        for node in self.nodes:
            if node.name in names and names[node.name] is not node:
                raise PipelineError(f"two steps are named '{node.name}'; step names must be unique")
            names[node.name] = node
            if isinstance(node, UnionNode) and len(node.inputs) < 2:
                raise PipelineError("a union needs at least two streams", node.name)
        _check_single_stateful_chain(self)
        return self

    def explain(self) -> str:
        """A readable rendering: one line per step, inputs indented under it."""
        lines: list[str] = []

        def walk(node: Node, depth: int) -> None:
            lines.append(f"{'  ' * depth}{node.name}: {node.describe()}")
            for parent in node.inputs:
                walk(parent, depth + 1)

        for sink in self.sinks:
            walk(sink, 0)
        return "\n".join(lines)


def _topological(sinks: list[SinkNode]) -> list[Node]:
    order: list[Node] = []
    seen: set[int] = set()

    def visit(node: Node) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        for parent in node.inputs:
            visit(parent)
        order.append(node)

    for sink in sinks:
        visit(sink)
    return order


def _check_single_stateful_chain(graph: Graph) -> None:
    """Spark runs at most one stateful aggregation per query in append mode
    before the watermark semantics get subtle; Ember refuses chains it cannot
    honour exactly instead of silently changing their meaning."""
    for node in graph.nodes:
        if not isinstance(node, WindowAggregateNode):
            continue
        upstream = [n for n in _ancestors(node) if isinstance(n, WindowAggregateNode)]
        if upstream:
            raise PipelineError(
                f"window after window ('{upstream[0].name}' feeds '{node.name}') is not supported yet; "
                "write the first window's results to a sink and read them as a new job",
                node.name,
            )
    for node in graph.nodes:
        if isinstance(node, KeyByNode) and not node.keys:
            raise PipelineError("key_by needs at least one key", node.name)


def _ancestors(node: Node) -> Iterator[Node]:
    stack = list(node.inputs)
    seen: set[int] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        stack.extend(n.inputs)
