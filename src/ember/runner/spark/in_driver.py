"""Spark's *simple* stream reader for Ember's sources: a micro-batch read in the driver's
long-lived Python source process instead of in a Python task per partition — ~50-70 ms less
per small batch (docs/design/latency.md, "Small batches read in the driver"). The generators,
scripted sources (datasources.py) and Redis streams (redis_source.py) offer it; their
translators choose it (``in_driver``: translators/sources.py)."""

from __future__ import annotations

from typing import Any, Iterator

from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import DataSourceStreamReader, SimpleDataSourceStreamReader

__all__ = ["InDriver", "use_the_simple_reader"]


def use_the_simple_reader() -> None:
    """Makes pyspark fall back to the source's ``simpleStreamReader`` (read in the driver's
    source process: no Python task per micro-batch — ~50-70 ms less per batch here, but one
    process generating every row, so only for small batches: docs/design/latency.md)."""
    raise PySparkNotImplementedError(errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"})


class InDriver(SimpleDataSourceStreamReader):
    """A stream reader run in the driver's source process (Spark's simple reader): each
    micro-batch's end offset from ``inner.latestOffset`` under its own read limit, and the rows
    of every partition ``inner`` plans for it, one partition after the other, in one Spark
    partition — the same offsets and rows as ``inner``'s tasks read, without a Python task."""

    def __init__(self, inner: DataSourceStreamReader) -> None:
        self.inner = inner

    def initialOffset(self) -> dict:
        return self.inner.initialOffset()

    def read(self, start: dict) -> tuple[Iterator[Any], dict]:
        end = self.inner.latestOffset(start, self.inner.getDefaultReadLimit())
        if _position(end) == _position(start):
            return iter([]), start  # nothing new: the same offset, so Spark runs no batch
        # Spark asks a simple reader for no latest offset (reportLatestOffset): what the inner
        # reader reports of its backlog (a Redis stream's entries added) travels in the end
        # offset instead, where the progress reports read it (progress._lag); reads ignore it.
        report = getattr(self.inner, "reportLatestOffset", None)
        latest = report() if report is not None else None
        if isinstance(latest, dict) and "added" in latest:
            end = {**end, "added": latest["added"]}
        return self.readBetweenOffsets(start, end), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[Any]:
        return iter([x for part in self.inner.partitions(start, end) for x in self.inner.read(part)])

    def commit(self, end: dict) -> None:
        self.inner.commit(end)


def _position(offset: dict) -> dict:
    """An offset without the backlog report :class:`InDriver` adds to it."""
    return {k: v for k, v in offset.items() if k != "added"}
