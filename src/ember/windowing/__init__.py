"""Window declarations: assigners and built-in aggregates."""

from ember.windowing.assigners import (
    EventTimeSessionWindows,
    ProcessingTimeSessionWindows,
    SessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    SlidingWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    TumblingWindows,
    WindowAssigner,
)
from ember.windowing.aggregates import Agg, Aggregate

__all__ = [
    "WindowAssigner",
    "TumblingWindows",
    "SlidingWindows",
    "SessionWindows",
    "TumblingEventTimeWindows",
    "SlidingEventTimeWindows",
    "EventTimeSessionWindows",
    "TumblingProcessingTimeWindows",
    "SlidingProcessingTimeWindows",
    "ProcessingTimeSessionWindows",
    "Agg",
    "Aggregate",
]
