"""The timer service a keyed function (process function or window trigger) sees."""

from __future__ import annotations

__all__ = ["TimerService"]


class TimerService:
    """Current time and timers of the current key (and, for a trigger, window); epoch ms.
    A timer fires once; registering the same timestamp twice registers it once."""

    current_processing_time: int
    current_watermark: int | None

    def register_event_time_timer(self, timestamp: int) -> None:
        """Fire once the watermark reaches ``timestamp``."""
        raise NotImplementedError

    def register_processing_time_timer(self, timestamp: int) -> None:
        """Fire at the first micro-batch whose time is >= ``timestamp``."""
        raise NotImplementedError

    def delete_event_time_timer(self, timestamp: int) -> None:
        raise NotImplementedError

    def delete_processing_time_timer(self, timestamp: int) -> None:
        raise NotImplementedError
