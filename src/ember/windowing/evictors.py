"""Evictors: remove elements from a window before and/or after its function runs.

A window with an evictor keeps its elements (not just an accumulator) until it
fires; the evictor gets them as :class:`TimestampedValue` s and returns those
to keep.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NamedTuple

from ember.errors import ConfigError
from ember.time.durations import to_ms
from ember.windowing.assigners import TimeWindow

__all__ = ["TimestampedValue", "Evictor", "CountEvictor", "TimeEvictor", "DeltaEvictor"]


class TimestampedValue(NamedTuple):
    value: Any
    timestamp: int


class Evictor:
    """Base class: keeps everything."""

    def evict_before(self, elements: list[TimestampedValue], window: TimeWindow) -> list[TimestampedValue]:
        """Elements to keep before the window function runs."""
        return elements

    def evict_after(self, elements: list[TimestampedValue], window: TimeWindow) -> list[TimestampedValue]:
        """Elements to keep after it ran (what stays in the window if it is not purged)."""
        return elements

    def describe(self) -> str:
        return type(self).__name__


class _KeepingEvictor(Evictor):
    """An evictor defined by which elements it keeps, applied before or (``after``) after."""

    after = False

    def _keep(self, elements: list[TimestampedValue]) -> list[TimestampedValue]:
        raise NotImplementedError

    def evict_before(self, elements: list[TimestampedValue], window: TimeWindow) -> list[TimestampedValue]:
        return elements if self.after else self._keep(elements)

    def evict_after(self, elements: list[TimestampedValue], window: TimeWindow) -> list[TimestampedValue]:
        return self._keep(elements) if self.after else elements


class CountEvictor(_KeepingEvictor):
    """Keeps the last ``max_count`` elements (in arrival order)."""

    def __init__(self, max_count: int, do_evict_after: bool = False) -> None:
        if not isinstance(max_count, int) or isinstance(max_count, bool) or max_count <= 0:
            raise ConfigError(f"CountEvictor: max_count must be a positive int, got {max_count!r}")
        self.max_count, self.after = max_count, do_evict_after

    @staticmethod
    def of(max_count: int, do_evict_after: bool = False) -> "CountEvictor":
        return CountEvictor(max_count, do_evict_after)

    def _keep(self, elements: list[TimestampedValue]) -> list[TimestampedValue]:
        return elements[-self.max_count:]


    def describe(self) -> str:
        return f"CountEvictor({self.max_count})"


class TimeEvictor(_KeepingEvictor):
    """Keeps the elements whose timestamp is within ``window_size`` of the newest element's."""

    def __init__(self, window_size: timedelta | int, do_evict_after: bool = False) -> None:
        self.size_ms, self.after = to_ms(window_size, "evictor window"), do_evict_after

    @staticmethod
    def of(window_size: timedelta | int, do_evict_after: bool = False) -> "TimeEvictor":
        return TimeEvictor(window_size, do_evict_after)

    def _keep(self, elements: list[TimestampedValue]) -> list[TimestampedValue]:
        if not elements:
            return elements
        cutoff = max(e.timestamp for e in elements) - self.size_ms
        return [e for e in elements if e.timestamp > cutoff]


    def describe(self) -> str:
        return f"TimeEvictor({self.size_ms} ms)"


class DeltaEvictor(_KeepingEvictor):
    """Keeps the elements whose ``delta(element, newest)`` is below ``threshold``."""

    def __init__(self, threshold: float, delta: Any, do_evict_after: bool = False) -> None:
        if not callable(delta):
            raise ConfigError(f"DeltaEvictor: delta must be a function of two elements, got {delta!r}")
        self.threshold, self.delta, self.after = threshold, delta, do_evict_after

    @staticmethod
    def of(threshold: float, delta: Any, do_evict_after: bool = False) -> "DeltaEvictor":
        return DeltaEvictor(threshold, delta, do_evict_after)

    def _keep(self, elements: list[TimestampedValue]) -> list[TimestampedValue]:
        if not elements:
            return elements
        newest = elements[-1].value
        return [e for e in elements if self.delta(e.value, newest) < self.threshold]

