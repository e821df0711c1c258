"""Window assigners: small immutable declarations, validated when defined.

Event-time assigners window by the stream's timestamp (whatever its
:class:`~ember.time.WatermarkStrategy` assigned); processing-time assigners
window by the time Spark processes the record (the micro-batch time).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

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
]


@dataclass(frozen=True)
class WindowAssigner:
    """Base of all assigners. ``processing_time`` picks the clock windows use."""

    processing_time: bool

    @property
    def time_domain(self) -> str:
        return "processing time" if self.processing_time else "event time"

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class TumblingWindows(WindowAssigner):
    size_ms: int
    offset_ms: int = 0

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


@dataclass(frozen=True)
class SessionWindows(WindowAssigner):
    gap_ms: int

    def describe(self) -> str:
        return f"session gap {self.gap_ms} ms ({self.time_domain})"


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
