"""Watermark strategies: how a stream gets its timestamps and watermarks.

The strategy chosen at the source decides the stream's notion of time. Window
code does not change when the strategy does: an event-time window assigner
windows by whatever timestamp the strategy assigned (the event's own field,
the ingestion time, or the processing time).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta

from ember.errors import ConfigError
from ember.time.durations import to_ms

__all__ = ["TimeCharacteristic", "WatermarkStrategy"]


class TimeCharacteristic(enum.Enum):
    EVENT_TIME = "event_time"
    INGESTION_TIME = "ingestion_time"
    PROCESSING_TIME = "processing_time"


@dataclass(frozen=True)
class WatermarkStrategy:
    """Declaration of a stream's timestamps and watermark.

    Use the factory methods, e.g.
    ``WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "event_time")``.
    """

    characteristic: TimeCharacteristic
    timestamp_field: str | None = None
    max_out_of_orderness_ms: int = 0

    @staticmethod
    def for_bounded_out_of_orderness(
        max_out_of_orderness: timedelta | int, timestamp_field: str
    ) -> "WatermarkStrategy":
        """Event time from ``timestamp_field`` (epoch ms as an integer, or a timestamp);
        the watermark trails the largest timestamp seen by ``max_out_of_orderness``."""
        _check_field(timestamp_field)
        return WatermarkStrategy(
            TimeCharacteristic.EVENT_TIME,
            timestamp_field,
            to_ms(max_out_of_orderness, "max_out_of_orderness", allow_zero=True),
        )

    @staticmethod
    def for_monotonous_timestamps(timestamp_field: str) -> "WatermarkStrategy":
        """Event time for streams whose timestamps never decrease."""
        return WatermarkStrategy.for_bounded_out_of_orderness(0, timestamp_field)

    @staticmethod
    def ingestion_time() -> "WatermarkStrategy":
        """Timestamp = the time the source admitted the record (the micro-batch start)."""
        return WatermarkStrategy(TimeCharacteristic.INGESTION_TIME, None, 0)

    @staticmethod
    def processing_time() -> "WatermarkStrategy":
        """Timestamp = the time the record is processed; no event-time semantics."""
        return WatermarkStrategy(TimeCharacteristic.PROCESSING_TIME, None, 0)

    def describe(self) -> str:
        if self.characteristic is TimeCharacteristic.EVENT_TIME:
            return (
                f"event time from '{self.timestamp_field}', "
                f"out-of-orderness {self.max_out_of_orderness_ms} ms"
            )
        return self.characteristic.value.replace("_", " ")


def _check_field(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"timestamp_field must be a non-empty column name, got {name!r}")
