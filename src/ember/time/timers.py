"""The timer service a keyed function (process function or window trigger) sees."""

from __future__ import annotations

__all__ = ["TimerService"]


class TimerService:
    """Current time and timers of the current key (and, for a trigger, window); epoch ms.
    A timer fires once; registering the same timestamp twice registers it once."""

    @property
    def current_processing_time(self) -> int:
        """The micro-batch's processing time."""
        raise NotImplementedError

    @property
    def current_watermark(self) -> int | None:
        """The micro-batch's watermark (None without event time)."""
        raise NotImplementedError

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
