"""Sinks: console, in-memory collect (tests, notebooks), counting, files, no-op.

Collect and count sinks keep results on the driver, keyed by Spark's batch
id: a micro-batch that Spark re-runs after a failure replaces its earlier
output instead of adding to it, and when a job stops, output of a batch Spark
did not commit is dropped (``forget_after``, called by the runner), so what they hold is exactly-once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ember.connectors.base import Sink
from ember.errors import ConfigError

__all__ = ["ConsoleSink", "CollectSink", "CountSink", "FileSink", "NoopSink", "BatchOutput"]


@dataclass(frozen=True)
class BatchOutput:
    batch_id: int
    arrival_ms: int  # driver wall clock when the batch's rows reached the sink
    rows: list[dict[str, Any]]


class ConsoleSink(Sink):
    """Prints each micro-batch's output (Spark's console sink)."""

    def __init__(self, num_rows: int = 20, truncate: bool = False) -> None:
        if not isinstance(num_rows, int) or num_rows <= 0:
            raise ConfigError(f"ConsoleSink: num_rows must be a positive int, got {num_rows!r}")
        self.num_rows = num_rows
        self.truncate = truncate

    def describe(self) -> str:
        return "console"


class CollectSink(Sink):
    """Collects every output row on the driver. For tests and notebooks, not for big outputs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: dict[int, BatchOutput] = {}

    def describe(self) -> str:
        return "collect (driver memory)"

    def accept_batch(self, batch_id: int, arrival_ms: int, rows: list[dict[str, Any]]) -> None:
        """The runner hands over batch ``batch_id``'s rows (a replayed batch replaces its earlier rows)."""
        with self._lock:
            self._batches[batch_id] = BatchOutput(batch_id, arrival_ms, rows)

    @property
    def batches(self) -> list[BatchOutput]:
        with self._lock:
            return [self._batches[k] for k in sorted(self._batches)]

    def rows(self) -> list[dict[str, Any]]:
        """All rows, in batch order."""
        return [r for b in self.batches for r in b.rows]

    def to_pandas(self):  # noqa: ANN201 - pandas is optional at import time
        import pandas as pd

        return pd.DataFrame(self.rows())

    def clear(self) -> None:
        with self._lock:
            self._batches.clear()

    def forget_after(self, batch_id: int) -> None:
        with self._lock:
            for k in [k for k in self._batches if k > batch_id]:
                del self._batches[k]


class CountSink(Sink):
    """Counts records; optionally measures latency as arrival time minus ``latency_field`` (ms)
    on the records where that field is > 0 (a sample)."""

    def __init__(self, latency_field: str | None = None, *, sum_field: str | None = None) -> None:
        self.latency_field = latency_field
        self.sum_field = sum_field  # also sums this numeric field (``total``): a checksum of what arrived
        self._lock = threading.Lock()
        self._counts: dict[int, int] = {}
        self._sums: dict[int, int] = {}
        self._latencies: dict[int, list[int]] = {}

    def describe(self) -> str:
        lat = f", latency of '{self.latency_field}'" if self.latency_field else ""
        total = f", sum of '{self.sum_field}'" if self.sum_field else ""
        return f"count{lat}{total}"

    def accept_batch(self, batch_id: int, count: int, latencies_ms: list[int], total: int = 0) -> None:
        """The runner hands over batch ``batch_id``'s count, latency samples and sum."""
        with self._lock:
            self._counts[batch_id] = count
            self._latencies[batch_id] = latencies_ms
            self._sums[batch_id] = total

    def forget_after(self, batch_id: int) -> None:
        with self._lock:
            for table in (self._counts, self._latencies, self._sums):
                for k in [k for k in table if k > batch_id]:
                    del table[k]

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    @property
    def total(self) -> int:
        """The sum of ``sum_field`` over every record counted (0 without a ``sum_field``)."""
        with self._lock:
            return sum(self._sums.values())

    @property
    def latencies_ms(self) -> list[int]:
        return self.latencies_after(-1)

    def latencies_after(self, batch_id: int) -> list[int]:
        """The latency samples of the batches after ``batch_id`` (e.g. past a warm-up)."""
        with self._lock:
            return [x for k in sorted(self._latencies) if k > batch_id for x in self._latencies[k]]


_FILE_FORMATS = ("parquet", "json", "csv", "orc")


class FileSink(Sink):
    """Files under ``path`` through Spark's exactly-once file sink (a manifest per batch)."""

    def __init__(self, path: str, format: str = "parquet") -> None:  # noqa: A002 - Spark's word
        if format not in _FILE_FORMATS:
            raise ConfigError(f"FileSink: format must be one of {', '.join(_FILE_FORMATS)}, got {format!r}")
        if not path:
            raise ConfigError("FileSink: path is required")
        self.path = path
        self.format = format

    def describe(self) -> str:
        return f"files {self.format} at {self.path}"


class NoopSink(Sink):
    """Discards results (Spark's ``noop`` sink); for throughput measurements."""

    def describe(self) -> str:
        return "noop"
