"""The pipeline graph: what the user declared, validated and explainable without Spark."""

from ember.graph.graph import Graph
from ember.graph.nodes import (
    FilterNode,
    FlatMapNode,
    KeyByNode,
    KeyedProcessNode,
    LookupJoinNode,
    MapBatchesNode,
    MapNode,
    Node,
    SelectNode,
    SinkNode,
    SourceNode,
    UnionNode,
    WindowNode,
)

__all__ = [
    "Graph",
    "Node",
    "SourceNode",
    "MapNode",
    "FilterNode",
    "FlatMapNode",
    "MapBatchesNode",
    "SelectNode",
    "UnionNode",
    "LookupJoinNode",
    "KeyByNode",
    "KeyedProcessNode",
    "WindowNode",
    "SinkNode",
]
