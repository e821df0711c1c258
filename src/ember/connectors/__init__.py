"""Connectors: source and sink declarations (the Spark runner implements them)."""

from ember.connectors.base import Sink, Source
from ember.connectors.external import PostgresSink, RedisSink, RedisStreamSink, RedisStreamSource
from ember.connectors.generators import (
    GeneratorSource,
    GrepSource,
    GroupingSource,
    StateMachineSource,
    YahooSource,
)
from ember.connectors.sinks import CollectSink, ConsoleSink, CountSink, FileSink, NoopSink
from ember.connectors.spark_sources import FileSource, RateSource, ScriptedSource

__all__ = [
    "Source",
    "Sink",
    "GeneratorSource",
    "YahooSource",
    "GrepSource",
    "GroupingSource",
    "StateMachineSource",
    "FileSource",
    "RateSource",
    "ScriptedSource",
    "ConsoleSink",
    "CollectSink",
    "CountSink",
    "FileSink",
    "NoopSink",
    "RedisStreamSource",
    "RedisSink",
    "RedisStreamSink",
    "PostgresSink",
]
