"""Ember: exactly-once, event-time stream processing for Python, executed on Apache Spark.

The names most pipelines need are importable from here::

    from ember import StreamEnvironment, WatermarkStrategy, TumblingEventTimeWindows, Agg, CollectSink
"""

from ember.api import DataStream, JobResult, KeyedStream, StreamEnvironment, WindowedStream
from ember.connectors import (
    CollectSink,
    ConsoleSink,
    CountSink,
    FileSink,
    FileSource,
    GrepSource,
    GroupingSource,
    NoopSink,
    PostgresSink,
    RateSource,
    RedisSink,
    RedisStreamSink,
    RedisStreamSource,
    ScriptedSource,
    StateMachineSource,
    YahooSource,
)
from ember.errors import ConfigError, EmberError, JobFailedError, LatencyTargetError, PipelineError, UserFunctionError
from ember.functions import (
    AggregateFunction,
    BroadcastProcessFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    OutputTag,
    ProcessWindowFunction,
)
from ember.time import TimeCharacteristic, WatermarkStrategy
from ember.version import __version__
from ember.windowing import (
    Agg,
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    CountEvictor,
    CountTrigger,
    DeltaEvictor,
    EventTimeSessionWindows,
    EventTimeTrigger,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    ProcessingTimeTrigger,
    PurgingTrigger,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeEvictor,
    Trigger,
    TriggerResult,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)

__all__ = [
    "StreamEnvironment", "JobResult", "DataStream", "KeyedStream", "WindowedStream",
    "WatermarkStrategy", "TimeCharacteristic",
    "TumblingEventTimeWindows", "SlidingEventTimeWindows", "EventTimeSessionWindows",
    "TumblingProcessingTimeWindows", "SlidingProcessingTimeWindows", "ProcessingTimeSessionWindows",
    "GlobalWindows",
    "Trigger", "TriggerResult", "EventTimeTrigger", "ProcessingTimeTrigger", "CountTrigger",
    "ContinuousEventTimeTrigger", "ContinuousProcessingTimeTrigger", "PurgingTrigger",
    "CountEvictor", "TimeEvictor", "DeltaEvictor",
    "KeyedProcessFunction", "KeyedCoProcessFunction", "KeyedBroadcastProcessFunction", "BroadcastProcessFunction",
    "AggregateFunction", "ProcessWindowFunction", "OutputTag",
    "Agg",
    "YahooSource", "GrepSource", "GroupingSource", "StateMachineSource",
    "FileSource", "RateSource", "ScriptedSource", "RedisStreamSource",
    "CollectSink", "ConsoleSink", "CountSink", "FileSink", "NoopSink", "RedisSink", "RedisStreamSink", "PostgresSink",
    "EmberError", "ConfigError", "PipelineError", "UserFunctionError", "JobFailedError", "LatencyTargetError",
    "__version__",
]
