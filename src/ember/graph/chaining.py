"""Operator chaining: keyed process steps on one key become one step.

``a.key_by("k").process(f).reinterpret_as_keyed("k").process(g)`` declares that ``f``'s
output is still partitioned by ``k`` (Flink's ``reinterpretAsKeyedStream``). Where ``g``
reads nothing else and ``f``'s records go nowhere else, :func:`chained` rewrites the
pair into one :class:`~ember.graph.nodes.ChainedProcessNode` running both on each
record in turn (ember.chaining): no shuffle, no hand-over through Spark between them —
about half the cost of the two steps run apart (docs/design/dataflow.md). Chains grow:
a third step reinterpreting the second's output joins the same node.

What may chain (else the ``reinterpret_as_keyed`` is an ordinary ``key_by``, and
:func:`why_not_chained` says why): keyed ``process`` functions run per record and CEP
steps (not a co-process, broadcast, rolling or vectorised step), the last of a chain possibly a keyed
window (then on Ember's window operator), keyed by the same field names;
the first step's main output read by the reinterpretation only, the reinterpretation by
the second step only; the first step with an output schema; no two chained steps with a
side output of one name (a chained step's side outputs and dead letters are read from the
chain, told apart by name).
"""

from __future__ import annotations

from dataclasses import replace

from ember.chaining import ChainedFunction, ChainLink
from ember.graph.graph import Graph
from ember.graph.nodes import ChainedProcessNode, KeyByNode, KeyedProcessNode, Node, SideOutputNode, WindowNode

__all__ = ["chained", "why_not_chained"]


def _plain(node: Node) -> bool:
    """A keyed ``process`` step run per record (a chain counts: it is one)."""
    if type(node) not in (KeyedProcessNode, ChainedProcessNode):
        return False
    if isinstance(node, ChainedProcessNode) and isinstance(node.steps[-1], WindowNode):
        return False  # a chain's window ends it
    fn = node.fn  # type: ignore[attr-defined]
    return not callable(getattr(fn, "process_batch", None)) or getattr(fn, "batch_path_optional", False)


def _keyed_window(node: Node) -> bool:
    """A keyed window step: it may end a chain (on Ember's window operator)."""
    return isinstance(node, WindowNode) and bool(node.keys)


def _side_tags(node: Node, readers: dict[int, list[Node]]) -> set[str]:
    """The side outputs of ``node`` the pipeline reads, and its dead-letter output, by name."""
    tags = {r.tag.name for r in readers.get(id(node), []) if isinstance(r, SideOutputNode)}
    dead = getattr(node, "dead_letter", None)
    return tags | ({dead.name} if dead is not None else set())


def _chain_ending_at(node: Node, graph: Graph, readers: dict[int, list[Node]]) -> list[Node]:
    """The steps chained up to ``node`` (itself included), first step first."""
    steps = [node]
    while steps[0].inputs and isinstance(steps[0].inputs[0], KeyByNode) and steps[0].inputs[0].reinterpret \
            and _refusal(steps[0].inputs[0], graph, readers) is None:
        steps.insert(0, steps[0].inputs[0].inputs[0])
    return steps


def why_not_chained(reinterpret: KeyByNode, graph: Graph) -> str | None:
    """Why the step reading ``reinterpret`` (a ``reinterpret_as_keyed`` step) does not chain
    to the step before it; None when it does."""
    return _refusal(reinterpret, graph, graph.readers())


def _refusal(reinterpret: KeyByNode, graph: Graph, readers: dict[int, list[Node]]) -> str | None:
    after = readers.get(id(reinterpret), [])
    before = reinterpret.inputs[0]
    if not _plain(before):
        return f"'{before.name}' is not a keyed process step run per record"
    if len(after) != 1 or not (_plain(after[0]) or _keyed_window(after[0])) or len(after[0].inputs) != 1:
        return "it is not read by exactly one keyed process step (run per record) or keyed window"
    second = after[0]
    assert isinstance(before, KeyedProcessNode) and isinstance(second, KeyedProcessNode | WindowNode)
    if tuple(before.keys) != tuple(reinterpret.keys) or tuple(second.keys) != tuple(reinterpret.keys):
        return f"'{before.name}' is keyed by {', '.join(before.keys)}, not by {', '.join(map(str, reinterpret.keys))}"
    others = [n.name for n in readers.get(id(before), []) if n is not reinterpret and not isinstance(n, SideOutputNode)]
    if others:
        return f"'{before.name}' is also read by {', '.join(others)}"
    if before.output_schema is None:
        return f"'{before.name}' has no output schema"
    mine = _side_tags(second, readers)
    for step in _chain_ending_at(before, graph, readers):
        clash = sorted(mine & _side_tags(step, readers))
        if clash:  # one operator's side outputs are told apart by name
            return f"'{step.name}' and '{second.name}' both have a side output named '{clash[0]}'"
    return None


def chained(graph: Graph) -> Graph:
    """``graph`` with every chainable run of keyed steps (see the module doc) made one step;
    side outputs of any of them read from it."""
    if not any(isinstance(n, KeyByNode) and n.reinterpret for n in graph.nodes):
        return graph
    readers = graph.readers()
    chains: dict[int, list[Node]] = {}  # id(step) -> its chain (one list shared by its steps)
    for node in graph.nodes:  # inputs first
        key_by = node.inputs[0] if node.inputs else None
        if isinstance(key_by, KeyByNode) and key_by.reinterpret and _refusal(key_by, graph, readers) is None:
            first = key_by.inputs[0]
            chain = chains.get(id(first)) or [first]
            chain.append(node)
            for step in chain:
                chains[id(step)] = chain
    if not chains:
        return graph
    memo: dict[int, Node] = {}

    def rebuild(node: Node) -> Node:
        done = memo.get(id(node))
        if done is not None:
            return done
        chain = chains.get(id(node))
        if chain is not None:
            result = memo.get(id(chain[0]))
            if result is None:
                result = _fused(chain, tuple(rebuild(p) for p in chain[0].inputs), readers)
        else:
            inputs = tuple(rebuild(p) for p in node.inputs)
            result = node if all(a is b for a, b in zip(inputs, node.inputs)) else replace(node, inputs=inputs)
        memo[id(node)] = result
        return result

    return Graph([rebuild(s) for s in graph.sinks]).validate()  # type: ignore[misc]


def _fused(chain: list[Node], inputs: tuple[Node, ...], readers: dict[int, list[Node]]) -> ChainedProcessNode:
    steps = tuple(chain)
    # A window's function (Ember's window operator) is the runner's to make: the runner binds it.
    links = [ChainLink(s.name, getattr(s, "fn", None) if isinstance(s, KeyedProcessNode) else None,
                       tuple(getattr(s, "keys", ())), side_tags=frozenset(_side_tags(s, readers))) for s in steps]
    last = steps[-1]
    assert isinstance(last, KeyedProcessNode | WindowNode)
    return ChainedProcessNode(
        name=" -> ".join(s.name for s in steps), inputs=inputs, keys=tuple(links[0].keys), fn=ChainedFunction(links),
        output_schema=last.output_schema, dead_letter=last.dead_letter, steps=steps,
    )
