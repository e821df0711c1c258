"""Event time for stateful steps: the timestamp column, the watermark, the end of input.

The stream's timestamp field becomes ``__ember_time`` and ``withWatermark`` is
set on it right before the stateful step (a Python step upstream would drop
Spark's watermark metadata). When every source is bounded, an
``ember_end_of_input`` row is unioned in: once the sources have ended it moves
the watermark to the end of time, so every window closes and every event-time
timer fires (Flink's final watermark); a filter on the event-time column, which
Spark cannot push below the watermark, drops the row right after it.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F
from pyspark.sql import types as T

from ember.errors import PipelineError
from ember.runner.spark.checkpoint import END_OF_INPUT_SOURCE
from ember.runner.spark.compilation import Compilation
from ember.runner.spark.datasources import END_OF_TIME_MS
from ember.runner.spark.keyed.runtime import ANCHOR, HIDDEN, TIME_OUT
from ember.time.watermarks import WatermarkStrategy

__all__ = ["TIME", "ANCHOR", "HIDDEN", "with_event_time", "own_watermark", "with_processing_time", "keep_late_rows",
           "restore_anchor", "DELAY_KEY"]

TIME = TIME_OUT
DELAY_KEY = "spark.watermarkDelayMs"  # Spark's marker of a query's event-time column


def with_event_time(comp: Compilation, df: Any, time: WatermarkStrategy, step: str, *,
                    column: str = TIME, shift_ms: int = 0, keys: tuple[str, ...] = (), barrier: str | None = None) -> Any:
    """``df`` with ``column`` (default ``__ember_time``) from the strategy's field and the
    watermark set on it. ``shift_ms`` moves the column and the delay alike (the watermark's
    value stays), which moves Spark's late-row rule: Spark drops ``column <= watermark``, so
    a shift of 2 ms drops exactly Flink's late records (``ts < max - bound - 1``). ``keys``:
    fields the end-of-input row fills (a join's keys: Spark filters rows with a null join
    key before the watermark sees them). ``barrier``: the name of an observed metric set
    right after the watermark, which Spark's optimizer pushes no filter through — for rows
    a user's query filters later (a SQL step's ``WHERE``): Spark would otherwise push a filter
    that does not read the event-time column below the watermark, so the rows it drops would
    not move the watermark, and a filter rejecting nulls would drop the end-of-input row
    (the job's last windows and timers would never fire)."""
    assert time.timestamp_field is not None  # an event-time strategy names its field
    stamp = _timestamp(df, time.timestamp_field, step)
    if shift_ms:
        stamp = F.timestamp_millis(F.unix_millis(stamp) + F.lit(shift_ms))
    df = df.withColumn(column, stamp)
    flush = comp.bounded and comp.end_of_input_marker
    if flush:
        df = _with_end_of_input(comp, df, column, keys)
        comp.uses_end_of_input = True
    df = df.withWatermark(column, f"{time.max_out_of_orderness_ms + shift_ms} milliseconds")
    if flush:
        df = df.filter(F.col(column) < F.timestamp_millis(F.lit(END_OF_TIME_MS)))
    if barrier is not None:
        df = df.observe(barrier, F.count(F.lit(1)).alias("rows"))
    return df


def own_watermark(comp: Compilation, df: Any, time: WatermarkStrategy, step: str, mark: str,
                  keys: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """``df`` (an input read beside keyed steps' rows, which carry their event time as plain
    milliseconds) with its own watermark set on the column ``mark``, and the expression of its
    rows' event time in ms to select as ``TIME`` — without the watermark marker, so the keyed
    runtime, not Spark, decides lateness. Spark's watermark is the least of all inputs'."""
    return with_event_time(comp, df, time, step, column=mark, keys=keys), F.unix_millis(F.col(mark)).alias(TIME)


def with_processing_time(df: Any) -> Any:
    """``df`` with ``__ember_time`` = the micro-batch time and a zero-delay watermark on it."""
    return df.withColumn(TIME, F.current_timestamp()).withWatermark(TIME, "0 milliseconds")


def _timestamp(df: Any, field: str, step: str) -> Any:
    if field not in df.columns:
        raise PipelineError(
            f"the event-time field '{field}' is not in the stream at this step (fields: {', '.join(df.columns)}); "
            "keep it through select/map steps",
            step,
        )
    dtype = df.schema[field].dataType
    if isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        return F.col(field).cast("timestamp")
    if isinstance(dtype, T.LongType | T.IntegerType | T.StringType):
        return F.timestamp_millis(F.col(field).cast("bigint"))
    raise PipelineError(
        f"the event-time field '{field}' has type {dtype.simpleString()}; it must be epoch milliseconds "
        "(bigint/int, or digits in a string) or a timestamp",
        step,
    )


def _with_end_of_input(comp: Compilation, df: Any, column: str = TIME, keys: tuple[str, ...] = ()) -> Any:
    from ember.runner.spark.translators.sources import positioned

    # the bounded sources that mark themselves done (Ember's own readers: given a done_file when
    # translated, Compilation.marking); with any other, only the driver's marker ends the input
    for source in comp.graph.sources:
        comp.frame(source)  # (translated once: every source's reader is known before the row is built)
    marking = all(n.name in comp.marking for n in comp.graph.sources)
    comp.end_of_input_reads += 1  # (a source id of its own: a converted checkpoint positions each apart)
    eos = (positioned(comp, comp.spark.readStream.format("ember_end_of_input"), f"{END_OF_INPUT_SOURCE}{comp.end_of_input_reads}")
           .option("marker", comp.end_of_input_marker)
           .option("sources", len(comp.graph.sources) if marking else 0).load())

    def value(f: Any) -> Any:
        if f.name == column:
            return F.timestamp_millis(F.col("end_ms"))
        return F.lit(0 if f.name in keys else None).cast(f.dataType)

    fields = [value(f).alias(f.name) for f in df.schema.fields]
    return df.unionByName(eos.select(*fields))


def keep_late_rows(df: Any) -> Any:
    """``df`` for an Ember stateful operator that must see rows behind the watermark.

    Spark drops input rows older than the watermark before an ``EventTimeTimeout``
    state function, silently. Ember's operators decide about late rows themselves
    (allowed lateness, late-data side output, a process function reading
    ``ctx.timestamp``), so the event-time column loses Spark's watermark marker
    and an all-null column carries it instead: the query keeps its watermark
    (computed upstream on the real timestamps), and Spark's "older than the
    watermark" test is never true for a null, so no row is dropped.
    """
    return restore_anchor(df.withColumn(TIME, F.unix_millis(F.col(TIME))))


def restore_anchor(df: Any) -> Any:
    """(Re)mark the query's event time on the null anchor column (a Python step
    between :func:`keep_late_rows` and the stateful operator drops the marker)."""
    return df.withColumn(ANCHOR, F.lit(None).cast("timestamp").alias(ANCHOR, metadata={DELAY_KEY: 0}))
