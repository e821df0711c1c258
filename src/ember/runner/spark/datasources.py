"""Ember's Python streaming sources for Spark (``pyspark.sql.datasource``).

- ``ember_sequence``: the replayable generator driver. Its offset is the number
  of events admitted so far, ``{"n": N, "done": bool}``; a micro-batch
  ``[n0, n1)`` gives partition ``p`` the sequence numbers ``seq % P == p``.
  Open loop: under a target rate, event ``seq`` is due at
  ``start_ms + seq * 1000 / rate``; ``latestOffset`` admits what is due, at
  most ``max_events_per_batch`` (admission control). With the ``pack`` option
  it emits its records already packed per state bucket for the keyed step
  right after it (``keyed/packing.py``: source fusion); with ``decode``, its
  JSON texts already decoded by the ``parse_json`` step right after it.
- ``ember_scripted``: one scripted batch per micro-batch (tests).
- ``ember_end_of_input``: emits one row once the input has ended — every bounded
  source marked itself done (``done_file``: in the micro-batch that reads its last
  input) or the driver marked the end —, which moves the watermark to the end of
  time and flushes windows.
- ``ember_batch_watermark`` (a batch source, read inside every micro-batch): one
  row, the watermark Spark runs the current micro-batch with, from the batch's
  offset-log entry; native windows apply Flink's lateness rule with it (see
  translators/windows.py).

Every reader is a pure function of its offsets, so Spark's replays are identical. The
sequence and scripted sources also read in the driver's source process (Spark's simple reader,
the same offsets and rows, no Python task per micro-batch) where the translator asks
(``in_driver``: small batches, translators/sources.py).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from ember.errors import EmberError
from ember.runner.spark.checkpoint import (
    admission_bound,
    admission_stopped,
    fixed_origin,
    mark_source_done,
    offset_log_entry,
    sources_done,
    start_offset,
)
from ember.runner.spark.in_driver import InDriver, use_the_simple_reader
from ember.runner.spark.keyed.reach import BATCH_ID_PROPERTY

__all__ = ["register_sources", "END_OF_TIME_MS"]

END_OF_TIME_MS = 253_370_764_800_000  # 9999-01-01T00:00:00Z
_CHUNK = 1 << 16


class _Range(InputPartition):
    def __init__(self, partition: int, start: int, end: int, origin_ms: int = 0) -> None:
        self.partition, self.start, self.end, self.origin_ms = partition, start, end, origin_ms


# --------------------------------------------------------------------------- sequence
class SequenceReader(DataSourceStreamReader):
    """Offsets: ``{"n", "origin_ms", "done"}``. ``origin_ms`` (event time of
    sequence number 0) is fixed when the query first starts (see
    :func:`fixed_origin`) and travels in every offset to the readers."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.spec = json.loads(options["spec"])

    def initialOffset(self) -> dict:
        # Spark may call this more than once (batch 0's start is not in its
        # offset log), so the origin is fixed once, in the checkpoint.
        fixed = self.spec.get("start_ms")
        origin = int(fixed) if fixed is not None else fixed_origin(self.options["origin_file"])
        return start_offset(self.options, {"n": 0, "origin_ms": origin, "done": False})

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(int(self.spec["max_events_per_batch"]))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        n0, origin = int(start["n"]), int(start["origin_ms"])
        if admission_stopped(self.options):
            return start
        rate, max_events = self.spec.get("rate"), self.spec.get("max_events")
        due = max_events if max_events is not None else (1 << 62)
        if rate is not None:
            elapsed_ms = time.time_ns() // 1_000_000 - origin
            due = min(due, max(0, int(elapsed_ms * float(rate) // 1000)))
        due_now = due
        if not isinstance(limit, ReadAllAvailable):
            due = min(due, n0 + admission_bound(self.options, int(limit.max_rows)))
        n1 = max(n0, due)
        done = max_events is not None and n1 >= max_events
        if done:
            mark_source_done(self.options)
        end = {"n": n1, "origin_ms": origin, "done": done}
        if rate is not None:
            end["due"] = max(n1, due_now)  # events due by now: due - n is the backlog (lag)
        if self.options.get("pack") or self.options.get("decode"):
            # rows are not records one for one (buckets of records; decoded records without the
            # spooled dead letters): the runner counts events by offsets
            end["packed"] = True
        return end

    def partitions(self, start: dict, end: dict) -> list[_Range]:
        n0, n1 = int(start["n"]), int(end["n"])
        if n1 <= n0:
            return []
        return [_Range(p, n0, n1, int(start["origin_ms"])) for p in range(int(self.spec["partitions"]))]

    def read(self, part: _Range) -> Iterator[Any]:
        from ember.runner.spark.generator_batches import sequence_batches

        batches = sequence_batches(self.spec, part.partition, part.start, part.end, part.origin_ms, _CHUNK)
        if self.options.get("pack"):  # fused with the keyed step after it (keyed/packing.py)
            from ember.runner.spark.keyed.packing import PackSpec, pack_at_source

            batches = pack_at_source(batches, PackSpec.from_json(self.options["pack"]))
        if self.options.get("decode"):  # fused with the parse_json step after it
            from ember.runner.spark.translators.decoding import DecodePlan, decode_batches

            batches = decode_batches(batches, DecodePlan.from_json(self.options["decode"]))
        yield from batches

    def commit(self, end: dict) -> None:
        pass


class SequenceSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "ember_sequence"

    def schema(self) -> str:
        return self.options["schema"]

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if self.options.get("in_driver") == "1":  # chosen by the translator (translators/sources.py)
            use_the_simple_reader()
        return SequenceReader(self.options)

    def simpleStreamReader(self, schema: Any) -> SimpleDataSourceStreamReader:
        return InDriver(SequenceReader(self.options))


# --------------------------------------------------------------------------- scripted
class ScriptedReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.batches = json.loads(options["batches"])

    def initialOffset(self) -> dict:
        return start_offset(self.options, {"batch": 0, "done": len(self.batches) == 0, "n": 0})

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if admission_stopped(self.options):
            return start
        b = min(int(start["batch"]) + 1, len(self.batches))
        if b >= len(self.batches):
            mark_source_done(self.options)
        # "n": the records read so far, so a batch's events can be counted from the offset log
        # alone (progress.offsets_events: a batch committed as the query stopped, unreported)
        return {"batch": b, "done": b >= len(self.batches), "n": sum(len(x) for x in self.batches[:b])}

    def partitions(self, start: dict, end: dict) -> list[_Range]:
        s, e = int(start["batch"]), int(end["batch"])
        return [_Range(p, s, e) for p in range(int(self.options.get("partitions") or 1))] if e > s else []

    def read(self, part: _Range) -> Iterator[tuple]:
        n = int(self.options.get("partitions") or 1)  # row i of a batch goes to partition i % n
        for b in range(part.start, part.end):
            for row in self.batches[b][part.partition::n]:
                yield tuple(row)


class ScriptedSourceDS(DataSource):
    @classmethod
    def name(cls) -> str:
        return "ember_scripted"

    def schema(self) -> str:
        return self.options["schema"]

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if self.options.get("in_driver") == "1":  # chosen by the translator (translators/sources.py)
            use_the_simple_reader()
        return ScriptedReader(self.options)

    def simpleStreamReader(self, schema: Any) -> SimpleDataSourceStreamReader:
        return InDriver(ScriptedReader(self.options))


# --------------------------------------------------------------------------- end of input
class EndOfInputReader(DataSourceStreamReader):
    """Its row comes once the driver marks the end (``marker``) — or, sooner, once each of the
    job's ``sources`` bounded sources marked itself done beside it: Spark asks the sources for
    their offsets in plan order, so a source unioned before this one that reads its last input
    in a micro-batch has marked itself by then, and the row comes in that same micro-batch
    (the watermark it moves takes effect after the batch, so that input is not late)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.marker = options["marker"]
        self.sources = int(options.get("sources") or 0)

    def initialOffset(self) -> dict:
        return start_offset(self.options, {"ended": 0})

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        ended = os.path.exists(self.marker) or sources_done(self.marker, self.sources)
        return {"ended": 1 if ended else int(start["ended"])}

    def partitions(self, start: dict, end: dict) -> list[_Range]:
        return [_Range(0, 0, 1)] if int(end["ended"]) > int(start["ended"]) else []

    def read(self, part: _Range) -> Iterator[tuple]:
        yield (END_OF_TIME_MS,)


class EndOfInputSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "ember_end_of_input"

    def schema(self) -> str:
        return "end_ms bigint"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return EndOfInputReader(self.options)


# --------------------------------------------------------------------------- the batch's watermark


class BatchWatermarkReader(DataSourceReader):
    """One row: the watermark of the micro-batch being executed (Spark's, 0 before it has one).

    Spark writes each micro-batch's watermark into the batch's offset-log entry before
    running it, and tags the batch's jobs with its id; a stream joined with this (static)
    source reads it afresh in every micro-batch, replays included (the entry is the
    write-ahead log: a replayed batch reads the same value)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.checkpoint = options["checkpoint"]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        yield (batch_watermark(self.checkpoint, current_batch_id("ember_batch_watermark")),)


def current_batch_id(reader: str) -> int:
    """The id of the micro-batch this task belongs to (Spark tags a batch's jobs with it)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    if batch is None:
        raise EmberError(f"{reader} runs inside a streaming micro-batch only")
    return int(batch)


def batch_watermark(checkpoint: str, batch: int) -> int:
    """Spark's watermark for micro-batch ``batch`` (0 before it has one, and for batch -1),
    from the batch's offset-log entry: the write-ahead log, so a replay reads the same."""
    if batch < 0:
        return 0
    try:
        meta, _ = offset_log_entry(checkpoint, batch)
    except OSError as exc:
        raise EmberError(
            f"cannot read the offset log of micro-batch {batch} under {checkpoint} ({exc}): Ember reads batch "
            "watermarks there (native event-time windows, chained keyed steps), so the checkpoint directory "
            "must be on storage every executor sees (local, or mounted at the same path)"
        ) from None
    return int(meta.get("batchWatermarkMs", 0))


class PreviousWatermark:
    """Spark's watermark of the micro-batch before the current one, read once per batch
    and Python worker (picklable: only the checkpoint path travels)."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self._cache: tuple[int, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "_cache": None}

    def __call__(self) -> int:
        batch = current_batch_id("a chained keyed step")
        if self._cache is None or self._cache[0] != batch:
            self._cache = (batch, batch_watermark(self.checkpoint, batch - 1))
        return self._cache[1]


class BatchWatermarkSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "ember_batch_watermark"

    def schema(self) -> str:
        return "batch_watermark_ms bigint"

    def reader(self, schema: Any) -> DataSourceReader:
        return BatchWatermarkReader(self.options)


_registered: set[int] = set()


def register_sources(spark: Any) -> None:
    """Register Ember's data sources with ``spark`` (once per session)."""
    from ember.runner.spark.redis_source import RedisStreamsDataSource

    if id(spark) in _registered:
        return
    for ds in (SequenceSource, ScriptedSourceDS, EndOfInputSource, BatchWatermarkSource, RedisStreamsDataSource):
        spark.dataSource.register(ds)
    _registered.add(id(spark))
