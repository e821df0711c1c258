"""Window assigners: small immutable declarations, validated when defined.

Event-time assigners window by the stream's timestamp (whatever its
:class:`~ember.time.WatermarkStrategy` assigned); processing-time assigners
window by the time Spark processes the record (the micro-batch time).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

from ember.errors import ConfigError
from ember.time.durations import to_ms

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
    "GlobalWindows",
    "TimeWindow",
    "GLOBAL_WINDOW",
]


class TimeWindow(NamedTuple):
    """A window ``[start, end)`` in epoch ms; the global window spans all time."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        """The last timestamp inside the window (``end - 1``)."""
        return self.end - 1

    @property
    def is_global(self) -> bool:
        return self == GLOBAL_WINDOW

    def intersects(self, other: "TimeWindow") -> bool:
        """Overlapping or touching (session windows that touch merge)."""
        return self.start <= other.end and self.end >= other.start

    def cover(self, other: "TimeWindow") -> "TimeWindow":
        return TimeWindow(min(self.start, other.start), max(self.end, other.end))


GLOBAL_WINDOW = TimeWindow(-(2**63), 2**63)


@dataclass(frozen=True)
class WindowAssigner:
    """Base of all assigners. ``processing_time`` picks the clock windows use."""

    processing_time: bool

    @property
    def time_domain(self) -> str:
        return "processing time" if self.processing_time else "event time"

    @property
    def merging(self) -> bool:
        return False

    @property
    def is_global(self) -> bool:
        """One window per key that never ends (fires only by its trigger)."""
        return False

    def describe(self) -> str:
        raise NotImplementedError

    def assign(self, timestamp: int) -> list[TimeWindow]:
        """The windows a record with ``timestamp`` (ms) belongs to."""
        raise NotImplementedError


def _window_start(timestamp: int, offset: int, size: int) -> int:
    return timestamp - (timestamp - offset) % size


@dataclass(frozen=True)
class TumblingWindows(WindowAssigner):
    size_ms: int
    offset_ms: int = 0

    def assign(self, timestamp: int) -> list[TimeWindow]:
        start = _window_start(timestamp, self.offset_ms, self.size_ms)
        return [TimeWindow(start, start + self.size_ms)]

    def describe(self) -> str:
        off = f", offset {self.offset_ms} ms" if self.offset_ms else ""
        return f"tumbling {self.size_ms} ms{off} ({self.time_domain})"


@dataclass(frozen=True)
class SlidingWindows(WindowAssigner):
    size_ms: int
    slide_ms: int
    offset_ms: int = 0

    def describe(self) -> str:
        return f"sliding {self.size_ms} ms every {self.slide_ms} ms ({self.time_domain})"

    def assign(self, timestamp: int) -> list[TimeWindow]:
        last = _window_start(timestamp, self.offset_ms, self.slide_ms)
        starts = range(last, timestamp - self.size_ms, -self.slide_ms)
        return [TimeWindow(s, s + self.size_ms) for s in starts]


@dataclass(frozen=True)
class SessionWindows(WindowAssigner):
    gap_ms: int

    @property
    def merging(self) -> bool:
        return True

    def describe(self) -> str:
        return f"session gap {self.gap_ms} ms ({self.time_domain})"

    def assign(self, timestamp: int) -> list[TimeWindow]:
        return [TimeWindow(timestamp, timestamp + self.gap_ms)]


@dataclass(frozen=True)
class _Global(WindowAssigner):
    @property
    def is_global(self) -> bool:
        return True

    def describe(self) -> str:
        return "global (one window per key; fires only by its trigger)"

    def assign(self, timestamp: int) -> list[TimeWindow]:
        return [GLOBAL_WINDOW]


class GlobalWindows:
    """All of a key's records in one window that never ends: give it a trigger
    (``.trigger(CountTrigger.of(100))``), or it never fires."""

    @staticmethod
    def create() -> _Global:
        return _Global(processing_time=False)


def _tumbling(size: timedelta | int, offset: timedelta | int, processing: bool) -> TumblingWindows:
    size_ms = to_ms(size, "window size")
    offset_ms = to_ms(offset, "window offset", allow_zero=True)
    if offset_ms >= size_ms:
        raise ConfigError(
            f"window offset ({offset_ms} ms) must be smaller than the window size ({size_ms} ms)"
        )
    return TumblingWindows(processing, size_ms, offset_ms)


def _sliding(
    size: timedelta | int, slide: timedelta | int, offset: timedelta | int, processing: bool
) -> SlidingWindows:
    size_ms = to_ms(size, "window size")
    slide_ms = to_ms(slide, "window slide")
    offset_ms = to_ms(offset, "window offset", allow_zero=True)
    if slide_ms > size_ms:
        raise ConfigError(
            f"window slide ({slide_ms} ms) must not exceed the window size ({size_ms} ms); "
            "use tumbling windows for slide == size"
        )
    if offset_ms >= slide_ms:
        raise ConfigError(
            f"window offset ({offset_ms} ms) must be smaller than the slide ({slide_ms} ms)"
        )
    return SlidingWindows(processing, size_ms, slide_ms, offset_ms)


class TumblingEventTimeWindows:
    """Fixed-size, non-overlapping event-time windows: ``TumblingEventTimeWindows.of(timedelta(seconds=10))``."""

    @staticmethod
    def of(size: timedelta | int, offset: timedelta | int = 0) -> TumblingWindows:
        return _tumbling(size, offset, processing=False)


class SlidingEventTimeWindows:
    """Overlapping event-time windows of ``size`` starting every ``slide``."""

    @staticmethod
    def of(
        size: timedelta | int, slide: timedelta | int, offset: timedelta | int = 0
    ) -> SlidingWindows:
        return _sliding(size, slide, offset, processing=False)


class EventTimeSessionWindows:
    """Event-time sessions closed by a gap of inactivity per key."""

    @staticmethod
    def with_gap(gap: timedelta | int) -> SessionWindows:
        return SessionWindows(False, to_ms(gap, "session gap"))


class TumblingProcessingTimeWindows:
    @staticmethod
    def of(size: timedelta | int, offset: timedelta | int = 0) -> TumblingWindows:
        return _tumbling(size, offset, processing=True)


class SlidingProcessingTimeWindows:
    @staticmethod
    def of(
        size: timedelta | int, slide: timedelta | int, offset: timedelta | int = 0
    ) -> SlidingWindows:
        return _sliding(size, slide, offset, processing=True)


class ProcessingTimeSessionWindows:
    @staticmethod
    def with_gap(gap: timedelta | int) -> SessionWindows:
        return SessionWindows(True, to_ms(gap, "session gap"))
