"""Operator chaining: keyed process steps on one key become one step.

``a.key_by("k").process(f).reinterpret_as_keyed("k").process(g)`` declares that ``f``'s
output is still partitioned by ``k`` (Flink's ``reinterpretAsKeyedStream``). Where ``g``
reads nothing else and ``f``'s records go nowhere else, :func:`chained` rewrites the
pair into one :class:`~ember.graph.nodes.ChainedProcessNode` running both on each
record in turn (ember.chaining): no shuffle, no hand-over through Spark between them —
about half the cost of the two steps run apart (docs/design/dataflow.md). Chains grow:
a third step reinterpreting the second's output joins the same node.

What may chain (else the ``reinterpret_as_keyed`` is an ordinary ``key_by``, and
:func:`why_not_chained` says why): both steps keyed ``process`` functions (per record,
not a co-process, broadcast, rolling or vectorised step), keyed by the same field names;
the first step's only reader the reinterpretation, the reinterpretation's only reader
the second step (a side output or another reader of the first step needs its records
apart); the first step without a dead-letter output, with an output schema.
"""

from __future__ import annotations

from dataclasses import replace

from ember.chaining import ChainedFunction, ChainLink
from ember.graph.graph import Graph
from ember.graph.nodes import ChainedProcessNode, KeyByNode, KeyedProcessNode, Node

__all__ = ["chained", "why_not_chained"]


def _plain(node: Node) -> bool:
    """A keyed ``process`` step run per record (a chain counts: it is one)."""
    if type(node) not in (KeyedProcessNode, ChainedProcessNode):
        return False
    fn = node.fn  # type: ignore[attr-defined]
    return not callable(getattr(fn, "process_batch", None))


def why_not_chained(reinterpret: KeyByNode, graph: Graph) -> str | None:
    """Why the step reading ``reinterpret`` (a ``reinterpret_as_keyed`` step) does not chain
    to the step before it; None when it does."""
    readers: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for parent in node.inputs:
            readers.setdefault(id(parent), []).append(node)
    after = readers.get(id(reinterpret), [])
    before = reinterpret.inputs[0]
    if not _plain(before):
        return f"'{before.name}' is not a keyed process step run per record"
    if len(after) != 1 or not _plain(after[0]) or len(after[0].inputs) != 1:
        return "it is not read by exactly one keyed process step (run per record)"
    second = after[0]
    assert isinstance(before, KeyedProcessNode) and isinstance(second, KeyedProcessNode)
    if tuple(before.keys) != tuple(reinterpret.keys) or tuple(second.keys) != tuple(reinterpret.keys):
        return f"'{before.name}' is keyed by {', '.join(before.keys)}, not by {', '.join(map(str, reinterpret.keys))}"
    others = [n.name for n in readers.get(id(before), []) if n is not reinterpret]
    if others:
        return f"'{before.name}' is also read by {', '.join(others)}"
    if before.dead_letter is not None and not isinstance(before, ChainedProcessNode):
        return f"'{before.name}' has a dead-letter output"
    if before.output_schema is None:
        return f"'{before.name}' has no output schema"
    return None


def chained(graph: Graph) -> Graph:
    """``graph`` with every chainable pair of keyed steps (see the module doc) made one."""
    if not any(isinstance(n, KeyByNode) and n.reinterpret for n in graph.nodes):
        return graph
    rebuilt: dict[int, Node] = {}
    changed = False
    for node in graph.nodes:  # inputs first
        inputs = tuple(rebuilt[id(p)] for p in node.inputs)
        key_by = node.inputs[0] if node.inputs else None
        if (isinstance(key_by, KeyByNode) and key_by.reinterpret and isinstance(node, KeyedProcessNode)
                and why_not_chained(key_by, graph) is None):
            first = rebuilt[id(key_by.inputs[0])]
            assert isinstance(first, KeyedProcessNode)
            steps = (*first.steps, node) if isinstance(first, ChainedProcessNode) else (first, node)
            links = [ChainLink(s.name, s.fn, tuple(s.keys)) for s in steps]
            rebuilt[id(node)] = ChainedProcessNode(
                name=" -> ".join(s.name for s in steps), inputs=first.inputs, keys=tuple(first.keys),
                fn=ChainedFunction(links), output_schema=node.output_schema, dead_letter=node.dead_letter, steps=steps,
            )
            changed = True
        elif any(a is not b for a, b in zip(inputs, node.inputs)):
            rebuilt[id(node)] = replace(node, inputs=inputs)
        else:
            rebuilt[id(node)] = node
    if not changed:
        return graph
    return Graph([rebuilt[id(s)] for s in graph.sinks]).validate()  # type: ignore[misc]
