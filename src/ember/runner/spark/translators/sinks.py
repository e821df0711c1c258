"""Sink translators: each turns the final frame into a started-ready DataStreamWriter."""

from __future__ import annotations

import time
from typing import Any, Callable

from pyspark.sql import functions as F

from ember.connectors.base import Sink
from ember.connectors.sinks import CollectSink, ConsoleSink, CountSink, FileSink, NoopSink
from ember.errors import PipelineError
from ember.graph.nodes import SinkNode
from ember.runner.spark.compiler import registry

__all__ = ["SINK_WRITERS", "sink_writer"]

SinkWriter = Callable[[Any, Any], Any]
SINK_WRITERS: dict[type[Sink], SinkWriter] = {}
writes = registry(SINK_WRITERS)  # @writes(SinkType): how one sink type configures writeStream


def sink_writer(node: SinkNode, df: Any) -> Any:
    """``df.writeStream`` configured for ``node``'s sink."""
    writer = SINK_WRITERS.get(type(node.sink))
    if writer is None:
        raise PipelineError(f"the Spark runner cannot write to {type(node.sink).__name__}", node.name)
    return writer(node.sink, df.writeStream)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@writes(ConsoleSink)
def _console(sink: ConsoleSink, w: Any) -> Any:
    # Printed from Python (not Spark's JVM console sink) so output goes where
    # the user's Python output goes, notebooks and captured stdout included.
    def show(batch: Any, batch_id: int) -> None:
        rows = batch.count()
        print(f"-------------------------------------------\nBatch: {batch_id} ({rows} rows)\n-------------------------------------------", flush=True)
        if rows:
            batch.show(sink.num_rows, truncate=sink.truncate)

    return w.foreachBatch(show)


@writes(NoopSink)
def _noop(sink: NoopSink, w: Any) -> Any:
    return w.format("noop")


@writes(FileSink)
def _files(sink: FileSink, w: Any) -> Any:
    return w.format(sink.format).option("path", sink.path)


@writes(CollectSink)
def _collect(sink: CollectSink, w: Any) -> Any:
    def collect(batch: Any, batch_id: int) -> None:
        rows = [r.asDict(recursive=True) for r in batch.collect()]
        sink._accept(batch_id, _now_ms(), rows)

    return w.foreachBatch(collect)


@writes(CountSink)
def _count(sink: CountSink, w: Any) -> Any:
    field = sink.latency_field

    def count(batch: Any, batch_id: int) -> None:
        if field is None:
            sink._accept(batch_id, batch.count(), [])
            return
        row = batch.agg(
            F.count(F.lit(1)).alias("n"),
            F.collect_list(F.when(F.col(field) > 0, F.col(field))).alias("samples"),
        ).collect()[0]
        now = _now_ms()
        sink._accept(batch_id, int(row["n"]), [now - int(t) for t in row["samples"]])

    return w.foreachBatch(count)
