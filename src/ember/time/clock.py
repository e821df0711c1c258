"""Injectable clocks: no Ember logic reads the wall clock directly."""

from __future__ import annotations

import time

__all__ = ["Clock", "SystemClock", "ManualClock"]


class Clock:
    """Source of 'now' in epoch milliseconds and of monotonic seconds."""

    def now_ms(self) -> int:
        raise NotImplementedError

    def monotonic(self) -> float:
        raise NotImplementedError

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a manual clock moves itself instead)."""
        raise NotImplementedError


class SystemClock(Clock):
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class ManualClock(Clock):
    """A clock tests move by hand."""

    def __init__(self, now_ms: int = 0) -> None:
        self._now_ms = now_ms

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return self._now_ms / 1000.0

    def advance(self, ms: int) -> None:
        self._now_ms += ms

    def sleep(self, seconds: float) -> None:
        self.advance(max(1, round(seconds * 1000)))
