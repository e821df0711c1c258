"""The pipeline graph: the nodes reachable from a job's sinks, checked and explained."""

from __future__ import annotations

from typing import Iterator

from ember.errors import PipelineError
from ember.graph.nodes import (
    KeyByNode,
    KeyedProcessNode,
    Node,
    ParseJsonNode,
    SideOutputNode,
    SinkNode,
    SourceNode,
    UnionNode,
    VectorizedProcessNode,
    WindowAggregateNode,
    WindowNode,
)

_STATEFUL = (WindowAggregateNode, WindowNode, KeyedProcessNode, VectorizedProcessNode)
_WINDOWS = (WindowAggregateNode, WindowNode)

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
        names: dict[str, Node] = {}
        for node in self.nodes:
            if node.name in names and names[node.name] is not node:
                raise PipelineError(f"two steps are named '{node.name}'; step names must be unique")
            names[node.name] = node
            if isinstance(node, UnionNode) and len(node.inputs) < 2:
                raise PipelineError("a union needs at least two streams", node.name)
        _check_single_stateful_chain(self)
        self.split()
        return self

    def fork(self) -> Node | None:
        """Where the job's streamed sinks split (see :meth:`split`)."""
        return self.split()[0]

    def split(self) -> tuple[Node | None, list[SideOutputNode]]:
        """Where a job with several sinks splits, and which outputs leave the query beside it.

        The split (``fork``) is the last step every sink reads from whose followers all
        read from it or from each other. Ember runs the graph up to it as one streaming
        query and the steps after it on every micro-batch, so those must be stateless
        (None for a job with one sink).

        When that would put a stateful step after the split only because the job also
        reads the dead letters of a ``parse_json`` step (decoded JSON feeding a window,
        say), those dead letters *detour*: the decoding step spools them beside the
        query per micro-batch, and their (stateless) branch is written from the spool
        after the micro-batch's other sinks. The detoured side outputs are returned."""
        try:
            return self._fork(self.sinks), []
        except PipelineError as problem:
            detours = [
                n for n in self.nodes
                if isinstance(n, SideOutputNode) and isinstance(n.inputs[0], ParseJsonNode)
                and n.tag == n.inputs[0].dead_letter
            ]
            detoured = {id(s) for d in detours for s in self.sinks_after(d)}
            rest = [s for s in self.sinks if id(s) not in detoured]
            if not detours or not rest:
                raise
            for d in detours:  # a detour is a stateless branch of its own, from the side output to its sinks
                branch = [n for n in self.nodes if id(d) in {id(a) for a in _ancestors(n)} and not isinstance(n, SinkNode)]
                if _branch_problem(branch, {id(a) for a in _ancestors(d)} | {id(d)}, d, d.name) is not None:
                    raise problem from None
            return self._fork(rest), detours

    def sinks_after(self, node: Node) -> list[SinkNode]:
        """The sinks that read ``node``'s records, directly or through other steps."""
        return [s for s in self.sinks if any(a is node for a in _ancestors(s))]

    def _fork(self, sinks: list[SinkNode]) -> Node | None:
        if len(sinks) < 2:
            return None
        shared = None
        for sink in sinks:
            upstream = {id(n) for n in _ancestors(sink)}
            shared = upstream if shared is None else shared & upstream
        names = ", ".join(s.name for s in sinks)
        feeding = {id(n) for s in sinks for n in _ancestors(s)}
        common = [n for n in self.nodes if id(n) in (shared or set())]
        if not common:
            raise PipelineError(
                f"the sinks {names} read from unrelated pipelines; execute each as its own job"
            )
        # The latest shared step after which every step is stateless and reads only
        # from it or from steps after it (a branch may also read a side output of a
        # step between the split and its sink, e.g. dead letters of several steps).
        problem: PipelineError | None = None
        for fork in reversed(common):
            before = {id(n) for n in _ancestors(fork)} | {id(fork)}
            branch = [n for n in self.nodes if id(n) not in before and id(n) in feeding and not isinstance(n, SinkNode)]
            problem = _branch_problem(branch, before, fork, names)
            if problem is None:
                return fork
            if any(isinstance(n, (*_STATEFUL, SourceNode)) for n in branch):
                break  # an earlier split would only put more state after it
        assert problem is not None
        raise problem

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


def _branch_problem(branch: list[Node], before: set[int], fork: Node, names: str) -> PipelineError | None:
    """Why the steps ``branch`` cannot run per micro-batch after a split at ``fork`` (None: they can)."""
    for node in branch:
        if isinstance(node, (*_STATEFUL, SourceNode)):
            return PipelineError(
                f"'{node.name}' ({node.kind}) comes after the point where the job's sinks ({names}) split at "
                f"'{fork.name}'; steps after the split run per micro-batch and must be stateless: move it before "
                "the split, or run that branch as its own job",
                node.name,
            )
        for parent in node.inputs:
            if id(parent) in before and parent is not fork:
                return PipelineError(
                    f"'{node.name}' reads '{parent.name}', before the split at '{fork.name}'; after the split "
                    "every branch must start from that one step",
                    node.name,
                )
    return None


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
        if not isinstance(node, _WINDOWS):
            continue
        upstream = [n for n in _ancestors(node) if isinstance(n, _WINDOWS)]
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
