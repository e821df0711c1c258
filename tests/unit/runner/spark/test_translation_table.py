"""The Spark runner's translation table covers every declaration, without starting Spark."""

import pytest

import ember.runner.spark.translators  # noqa: F401 - fills the tables
from ember.connectors import generators, sinks, spark_sources
from ember.connectors.base import Sink, Source
from ember.graph import nodes
from ember.runner.spark.compiler import TRANSLATORS, registry
from ember.runner.spark.translators.sinks import BATCH_WRITERS
from ember.runner.spark.translators.sources import SOURCE_BUILDERS


def _subclasses(base, module):
    return [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, base) and c is not base]


def test_every_graph_node_has_a_translator():
    node_types = [c for c in _subclasses(nodes.Node, nodes) if c is not nodes.SinkNode]
    assert node_types and all(t in TRANSLATORS for t in node_types), [t for t in node_types if t not in TRANSLATORS]


def test_every_source_and_sink_has_a_spark_implementation():
    sources = [c for c in _subclasses(Source, generators) + _subclasses(Source, spark_sources) if c is not generators.GeneratorSource]
    assert sources and all(s in SOURCE_BUILDERS for s in sources)
    sink_types = _subclasses(Sink, sinks)
    assert sink_types and all(s in BATCH_WRITERS for s in sink_types)


def test_registering_twice_is_refused():
    table = {}
    register = registry(table)
    register(int)(lambda: 1)
    with pytest.raises(RuntimeError, match="two functions registered for int"):
        register(int)(lambda: 2)
