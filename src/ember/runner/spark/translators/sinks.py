"""Sink translators.

Every sink type can write one micro-batch's DataFrame (``BATCH_WRITERS``); in a
job with one sink, types Spark writes natively (files, noop, and the counting
sink: a no-op write with observed metrics, read from the progress reports) use
``writeStream`` directly (``SINK_WRITERS``) and the others run their batch
writer from ``foreachBatch``. Jobs with several sinks write every sink from one
``foreachBatch``. Sinks to external systems (Redis, PostgreSQL) write from
the executors, each Spark partition in one fenced transaction
(``ember.runner.spark.fenced_writes``); ``SINK_PREPARERS`` check or create what
they write to before the job starts.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from pyspark.sql import Observation
from pyspark.sql import functions as F

from ember.connectors.base import Sink
from ember.connectors.external import PostgresSink, RedisSink, RedisStreamSink, postgres_url, redis_url
from ember.connectors.sinks import CollectSink, ConsoleSink, CountSink, FileSink, NoopSink
from ember.errors import PipelineError
from ember.graph.nodes import SinkNode
from ember.runner.spark import fenced_writes
from ember.runner.spark.compilation import registry
from ember.runner.spark.fenced_writes import SinkTarget
from ember.runner.spark.pickling import ship_by_value

__all__ = ["SINK_WRITERS", "BATCH_WRITERS", "SINK_PREPARERS", "METRIC_READERS", "sink_writer", "metric_readers", "write_batch",
           "check_sink", "prepare_sink"]

SinkWriter = Callable[[Any, Any], Any]
SINK_WRITERS: dict[type[Sink], SinkWriter] = {}
writes = registry(SINK_WRITERS)  # @writes(SinkType): (sink, df) -> df.writeStream configured for it

# A natively written sink that hears of its batches from the progress reports: per observed
# metric's name, (sink, batch id, the metric's row as JSON) -> None.
MetricReader = Callable[[Any, int, dict[str, Any]], None]
METRIC_READERS: dict[type[Sink], tuple[str, MetricReader]] = {}

BatchWriter = Callable[[Any, Any, int, SinkTarget], None]
BATCH_WRITERS: dict[type[Sink], BatchWriter] = {}
writes_batch = registry(BATCH_WRITERS)  # @writes_batch(SinkType): write one micro-batch's DataFrame

SinkPreparer = Callable[[Any, Any, str], None]
SINK_PREPARERS: dict[type[Sink], SinkPreparer] = {}
prepares = registry(SINK_PREPARERS)  # @prepares(SinkType): check/create the target before the job starts


def sink_writer(node: SinkNode, df: Any, target: SinkTarget) -> Any:
    """``df.writeStream`` configured for ``node``'s sink."""
    writer = SINK_WRITERS.get(type(node.sink))
    if writer is None:
        check_sink(node)
        batch = BATCH_WRITERS[type(node.sink)]
        return df.writeStream.foreachBatch(lambda b, batch_id: batch(node.sink, b, batch_id, target))
    return writer(node.sink, df)


def metric_readers(node: SinkNode) -> dict[str, Callable[[int, dict[str, Any]], None]]:
    """For a sink written by :func:`sink_writer` that learns its batches from Spark's progress
    reports: observed metric name -> what hands a batch's metric row to the sink."""
    reader = METRIC_READERS.get(type(node.sink))
    if reader is None or type(node.sink) not in SINK_WRITERS:
        return {}
    name, read = reader
    return {name: functools.partial(read, node.sink)}


def prepare_sink(node: SinkNode, schema: Any) -> None:
    """Check (or create) what ``node`` writes to, for rows of ``schema``; before the job starts."""
    prepare = SINK_PREPARERS.get(type(node.sink))
    if prepare is not None:
        prepare(node.sink, schema, node.name)


def check_sink(node: SinkNode) -> None:
    if type(node.sink) not in BATCH_WRITERS:
        raise PipelineError(f"the Spark runner cannot write to {type(node.sink).__name__}", node.name)


def write_batch(node: SinkNode, df: Any, batch_id: int, target: SinkTarget) -> None:
    """Write one micro-batch's rows of a branch to ``node``'s sink (jobs with several sinks)."""
    BATCH_WRITERS[type(node.sink)](node.sink, df, batch_id, target)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@writes_batch(ConsoleSink)
def _console(sink: ConsoleSink, batch: Any, batch_id: int, target: SinkTarget) -> None:
    # Printed from Python (not Spark's JVM console sink) so output goes where
    # the user's Python output goes, notebooks and captured stdout included.
    rows = batch.count()
    print(f"-------------------------------------------\nBatch: {batch_id} ({rows} rows)\n-------------------------------------------", flush=True)
    if rows:
        batch.show(sink.num_rows, truncate=sink.truncate)


@writes(NoopSink)
def _noop(sink: NoopSink, df: Any) -> Any:
    return df.writeStream.format("noop")


@writes_batch(NoopSink)
def _noop_batch(sink: NoopSink, batch: Any, batch_id: int, target: SinkTarget) -> None:
    batch.write.format("noop").mode("append").save()


@writes(FileSink)
def _files(sink: FileSink, df: Any) -> Any:
    return df.writeStream.format(sink.format).option("path", sink.path)


@writes_batch(FileSink)
def _files_batch(sink: FileSink, batch: Any, batch_id: int, target: SinkTarget) -> None:
    # A replayed batch overwrites its own directory: exactly once per batch id.
    batch.write.mode("overwrite").format(sink.format).save(f"{sink.path.rstrip('/')}/batch_id={batch_id}")


@writes_batch(CollectSink)
def _collect(sink: CollectSink, batch: Any, batch_id: int, target: SinkTarget) -> None:
    if arrow_collectable(batch.schema):  # ~4x faster than Rows for 200 k rows (benchmarks/collect_sink.py)
        rows = batch.toArrow().to_pylist()
    else:
        rows = [r.asDict(recursive=True) for r in batch.collect()]
    sink.accept_batch(batch_id, _now_ms(), rows)


def arrow_collectable(schema: Any) -> bool:
    """Whether Arrow's Python values for ``schema`` are what ``Row.asDict(recursive=True)``
    gives: numbers, strings, booleans, dates, decimals, and arrays and structs of them, with
    distinct field names. Not timestamps (Arrow's carry UTC, Rows the session's local time),
    maps (Arrow gives pairs), binary (bytes, not bytearray) or anything else."""
    from pyspark.sql import types as T

    simple = (T.NumericType, T.StringType, T.BooleanType, T.DateType, T.NullType)

    def ok(dt: Any) -> bool:
        if isinstance(dt, T.ArrayType):
            return ok(dt.elementType)
        if isinstance(dt, T.StructType):
            names = [f.name for f in dt.fields]
            return len(set(names)) == len(names) and all(ok(f.dataType) for f in dt.fields)
        return isinstance(dt, simple)

    return ok(schema)


COUNT_METRIC = "ember_count"  # the observed metric of a job's one counting sink, written natively


@writes(CountSink)
def _count_stream(sink: CountSink, df: Any) -> Any:
    # The job's only sink: a no-op write Spark runs itself, the count riding on it as an
    # observed metric that the progress report carries (_read_count). No Python call per
    # micro-batch on the driver, and the batch's plan is not planned a second time as
    # foreachBatch's DataFrame would be (docs/design/latency.md, "The counting sink").
    return _counted(sink, df, COUNT_METRIC).writeStream.format("noop")


def _read_count(sink: CountSink, batch_id: int, row: dict[str, Any]) -> None:
    samples = [int(t) for t in row.get("samples") or ()] if sink.latency_field is not None else []
    sink.accept_batch(batch_id, int(row["n"]), samples, int(row["total"]) if sink.sum_field is not None else 0)


METRIC_READERS[CountSink] = (COUNT_METRIC, _read_count)


@writes_batch(CountSink)
def _count(sink: CountSink, batch: Any, batch_id: int, target: SinkTarget) -> None:
    # One sink of several: observed metrics on a no-op write. The partial aggregates ride back
    # on the batch's own tasks (accumulators, merged once per task of the result stage), so
    # the count costs no final single-partition stage as ``agg(...).collect()`` would.
    seen = Observation()
    _counted(sink, batch, seen).write.format("noop").mode("overwrite").save()
    _read_count(sink, batch_id, seen.get)


def _counted(sink: CountSink, df: Any, observation: Any) -> Any:
    """``df`` observed by the counting sink's aggregates. A latency sample is the sink task's
    clock when the row reaches the sink (an extra column, written nowhere) minus the row's
    ``latency_field``."""
    if sink.latency_field is not None:
        df = df.withColumn(_ARRIVAL, _arrival_column(sink.latency_field))
    return df.observe(observation, *_count_columns(sink.latency_field, sink.sum_field))


_ARRIVAL = "__ember_arrival_ms"


@functools.lru_cache(maxsize=64)
def _arrival_column(field: str) -> Any:
    return F.when(F.col(field) > 0, F.expr("CAST(java_method('java.lang.System', 'currentTimeMillis') AS BIGINT)"))


@functools.lru_cache(maxsize=64)
def _count_columns(field: str | None, summed: str | None) -> tuple[Any, ...]:
    """The counting sink's aggregate columns, built once: each ``F`` call is a round trip to
    the JVM (~4 ms per batch for these, against a ~100 ms batch at 5 k events)."""
    columns = [F.count(F.lit(1)).alias("n")]
    if field is not None:
        columns.append(F.collect_list(F.col(_ARRIVAL) - F.col(field)).alias("samples"))
    if summed is not None:
        columns.append(F.coalesce(F.sum(F.col(summed).cast("decimal(38,0)")), F.lit(0)).alias("total"))
    return tuple(columns)


# --------------------------------------------------------------------------- external systems
def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("a sink's partition writer ran outside a Spark task")
    return context.partitionId()


@prepares(RedisSink)
@prepares(RedisStreamSink)
def _check_redis(sink: RedisSink | RedisStreamSink, schema: Any, step: str) -> None:
    fenced_writes.check_redis(redis_url(sink.url), step)


@writes_batch(RedisSink)
def _redis(sink: RedisSink, batch: Any, batch_id: int, target: SinkTarget) -> None:
    url, write = redis_url(sink.url), sink.write
    ship_by_value(write)

    def partition(rows: Any) -> None:
        fenced_writes.redis_fenced_write(url, target, batch_id, _partition_id(), (r.asDict(recursive=True) for r in rows), write)

    batch.foreachPartition(partition)


@writes_batch(RedisStreamSink)
def _redis_stream(sink: RedisStreamSink, batch: Any, batch_id: int, target: SinkTarget) -> None:
    url, write = redis_url(sink.url), fenced_writes.redis_stream_writer(sink.stream, sink.maxlen)

    def partition(rows: Any) -> None:
        fenced_writes.redis_fenced_write(url, target, batch_id, _partition_id(), (r.asDict(recursive=True) for r in rows), write)

    batch.foreachPartition(partition)


@prepares(PostgresSink)
def _prepare_postgres(sink: PostgresSink, schema: Any, step: str) -> None:
    fenced_writes.prepare_postgres(postgres_url(sink.url), sink.table, schema, sink.mode, sink.key, sink.create, step)


@writes_batch(PostgresSink)
def _postgres(sink: PostgresSink, batch: Any, batch_id: int, target: SinkTarget) -> None:
    url, table, mode, key, columns = postgres_url(sink.url), sink.table, sink.mode, sink.key, batch.columns

    def partition(rows: Any) -> None:
        fenced_writes.postgres_fenced_write(url, target, batch_id, _partition_id(), table, columns, mode, key, (tuple(r) for r in rows))

    batch.foreachPartition(partition)
