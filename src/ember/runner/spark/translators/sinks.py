"""Sink translators.

Every sink type can write one micro-batch's DataFrame (``BATCH_WRITERS``); in a
job with one sink, types Spark writes natively (files, noop) use
``writeStream`` directly (``SINK_WRITERS``) and the others run their batch
writer from ``foreachBatch``. Jobs with several sinks write every sink from one
``foreachBatch``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from pyspark.sql import functions as F

from ember.connectors.base import Sink
from ember.connectors.sinks import CollectSink, ConsoleSink, CountSink, FileSink, NoopSink
from ember.errors import PipelineError
from ember.graph.nodes import SinkNode
from ember.runner.spark.compiler import registry

__all__ = ["SINK_WRITERS", "BATCH_WRITERS", "sink_writer", "write_batch", "check_sink"]

SinkWriter = Callable[[Any, Any], Any]
SINK_WRITERS: dict[type[Sink], SinkWriter] = {}
writes = registry(SINK_WRITERS)  # @writes(SinkType): how one sink type configures writeStream

BatchWriter = Callable[[Any, Any, int], None]
BATCH_WRITERS: dict[type[Sink], BatchWriter] = {}
writes_batch = registry(BATCH_WRITERS)  # @writes_batch(SinkType): write one micro-batch's DataFrame


def sink_writer(node: SinkNode, df: Any) -> Any:
    """``df.writeStream`` configured for ``node``'s sink."""
    writer = SINK_WRITERS.get(type(node.sink))
    if writer is None:
        check_sink(node)
        batch = BATCH_WRITERS[type(node.sink)]
        return df.writeStream.foreachBatch(lambda b, batch_id: batch(node.sink, b, batch_id))
    return writer(node.sink, df.writeStream)


def check_sink(node: SinkNode) -> None:
    if type(node.sink) not in BATCH_WRITERS:
        raise PipelineError(f"the Spark runner cannot write to {type(node.sink).__name__}", node.name)


def write_batch(node: SinkNode, df: Any, batch_id: int) -> None:
    """Write one micro-batch's rows of a branch to ``node``'s sink (jobs with several sinks)."""
    BATCH_WRITERS[type(node.sink)](node.sink, df, batch_id)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@writes_batch(ConsoleSink)
def _console(sink: ConsoleSink, batch: Any, batch_id: int) -> None:
    # Printed from Python (not Spark's JVM console sink) so output goes where
    # the user's Python output goes, notebooks and captured stdout included.
    rows = batch.count()
    print(f"-------------------------------------------\nBatch: {batch_id} ({rows} rows)\n-------------------------------------------", flush=True)
    if rows:
        batch.show(sink.num_rows, truncate=sink.truncate)


@writes(NoopSink)
def _noop(sink: NoopSink, w: Any) -> Any:
    return w.format("noop")


@writes_batch(NoopSink)
def _noop_batch(sink: NoopSink, batch: Any, batch_id: int) -> None:
    batch.write.format("noop").mode("append").save()


@writes(FileSink)
def _files(sink: FileSink, w: Any) -> Any:
    return w.format(sink.format).option("path", sink.path)


@writes_batch(FileSink)
def _files_batch(sink: FileSink, batch: Any, batch_id: int) -> None:
    # A replayed batch overwrites its own directory: exactly once per batch id.
    batch.write.mode("overwrite").format(sink.format).save(f"{sink.path.rstrip('/')}/batch_id={batch_id}")


@writes_batch(CollectSink)
def _collect(sink: CollectSink, batch: Any, batch_id: int) -> None:
    rows = [r.asDict(recursive=True) for r in batch.collect()]
    sink._accept(batch_id, _now_ms(), rows)


@writes_batch(CountSink)
def _count(sink: CountSink, batch: Any, batch_id: int) -> None:
    field = sink.latency_field
    if field is None:
        sink._accept(batch_id, batch.count(), [])
        return
    row = batch.agg(
        F.count(F.lit(1)).alias("n"),
        F.collect_list(F.when(F.col(field) > 0, F.col(field))).alias("samples"),
    ).collect()[0]
    now = _now_ms()
    sink._accept(batch_id, int(row["n"]), [now - int(t) for t in row["samples"]])
