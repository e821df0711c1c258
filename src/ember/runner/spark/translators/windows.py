"""Window steps: the planner's choice (Plan.native) between Spark's native
``window`` / ``session_window`` (this module) and Ember's window operator
(keyed.operator_window); the planner decides.

Native results are emitted in append mode: once per window, when Spark's watermark
reaches the window's end (Flink's, one ms behind, reaches its last timestamp; event
time: see :mod:`.eventtime`). Processing time (and ingestion time, which is the same
instant in a micro-batch engine) is the micro-batch's timestamp.

Lateness is Flink's on both paths: a record is dropped when every window it belongs to
ends at or before the watermark of the micro-batch that brings it (Spark's, i.e. the
window's last timestamp is at or behind Flink's). Spark's own filter compares with the
*previous* batch's watermark (so a record could still join a window that closes in its
batch) and counts aggregated rows, not records; so Ember drops late records itself,
before the aggregation, against the current batch's watermark (read in the batch:
``ember_batch_watermark``), and counts them with an observed metric (progress.py sums
it as ``late_dropped``). A sliding-window record late for some of its windows only is
kept for the others; Spark skips the closed ones when the query runs them with the
current watermark (planner: ``Plan.late_rows_against_current_watermark``).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from ember.errors import PipelineError
from ember.graph.nodes import KeyByNode, WindowNode
from ember.runner.spark.compilation import Compilation, Frame, translates
from ember.runner.spark.progress import LATE_METRIC_PREFIX
from ember.runner.spark.translators.eventtime import TIME, with_event_time, with_processing_time
from ember.runner.spark.translators.keyed import operator_window
from ember.runner.spark.translators.transforms import key_columns, key_name
from ember.runner.spark.translators.windowfns import check_aggregates
from ember.time.watermarks import TimeCharacteristic
from ember.windowing.aggregates import Aggregate
from ember.windowing.assigners import SessionWindows, SlidingWindows, TumblingWindows

__all__ = ["spark_window", "late_metric"]

_BATCH_WATERMARK = "__ember_batch_watermark"


def late_metric(step: str) -> str:
    """The observed metric counting a native window step's late records."""
    return LATE_METRIC_PREFIX + step


@translates(WindowNode)
def _window(comp: Compilation, node: WindowNode) -> Frame:
    return spark_window(comp, node) if comp.plan.native(node) else operator_window(comp, node)


def spark_window(comp: Compilation, node: WindowNode) -> Frame:
    """Built-in aggregates per key and window, in the JVM."""
    assert node.assigner is not None
    parent = node.inputs[0]
    # A window groups by key itself: skip key_by's own repartition.
    up = comp.frame(parent.inputs[0] if isinstance(parent, KeyByNode) else parent)
    df, assigner = up.df, node.assigner
    event_time = not assigner.processing_time and up.time is not None and up.time.characteristic is TimeCharacteristic.EVENT_TIME
    if not assigner.processing_time and up.time is None:
        raise PipelineError(
            "an event-time window needs the source's watermark strategy: pass "
            "watermark=WatermarkStrategy.for_bounded_out_of_orderness(...) (or .ingestion_time()) "
            "to from_source, or use a processing-time window",
            node.name,
        )
    for key in node.keys:
        if isinstance(key, str) and key not in df.columns:
            raise PipelineError(f"key field '{key}' is not in the stream (fields: {', '.join(df.columns)})", node.name)
    check_aggregates(node.aggregates, df.schema, node.name)
    df = with_event_time(comp, df, up.time, node.name) if event_time else with_processing_time(df)
    if event_time and not isinstance(assigner, SessionWindows) and comp.plan.drops_late_records(node):
        df = _drop_late_records(comp, df, node.name, assigner)
    win = _window_column(assigner)
    names = [key_name(k) for k in node.keys]
    keys = [c if isinstance(k, str) else c.alias(n) for k, c, n in zip(node.keys, key_columns(node.keys), names)]
    grouped = df.groupBy(*keys, win.alias("__ember_window"))
    aggregated = grouped.agg(*[_aggregate(agg, out) for out, agg in node.aggregates])
    result = aggregated.select(
        *[F.col(f"`{n}`") for n in names],
        F.unix_millis(F.col("__ember_window.start")).alias("window_start"),
        F.unix_millis(F.col("__ember_window.end")).alias("window_end"),
        *[F.col(out) for out, _ in node.aggregates],
    )
    return Frame(result, None)


def _drop_late_records(comp: Compilation, df: Any, step: str, assigner: TumblingWindows | SlidingWindows) -> Any:
    """``df`` without the records whose every window ends at or before the current
    batch's watermark, counted (Flink's rule; see the module's docstring)."""
    millis = F.unix_millis(F.col(TIME))
    slide = assigner.slide_ms if isinstance(assigner, SlidingWindows) else assigner.size_ms
    last_end = millis - F.pmod(millis - F.lit(assigner.offset_ms), F.lit(slide)) + F.lit(assigner.size_ms)
    watermark = (
        comp.spark.read.format("ember_batch_watermark").option("checkpoint", comp.checkpoint or "").load()
        .withColumnRenamed("batch_watermark_ms", _BATCH_WATERMARK)
    )
    late = (F.col(_BATCH_WATERMARK) > 0) & (last_end <= F.col(_BATCH_WATERMARK))
    # An equi-join on a constant (a broadcast hash join, whole-stage generated) costs less per
    # row than the cross join's nested loop (measured: docs/design/event-time.md).
    one = "__ember_one"
    joined = df.withColumn(one, F.lit(1)).join(F.broadcast(watermark.withColumn(one, F.lit(1))), one).drop(one)
    df = joined.observe(late_metric(step), F.count_if(late).alias("records"))
    return df.filter(~late).drop(_BATCH_WATERMARK)


def _window_column(assigner: Any) -> Any:
    if isinstance(assigner, TumblingWindows):
        return F.window(TIME, f"{assigner.size_ms} milliseconds", startTime=f"{assigner.offset_ms} milliseconds")
    if isinstance(assigner, SlidingWindows):
        return F.window(
            TIME, f"{assigner.size_ms} milliseconds", f"{assigner.slide_ms} milliseconds", f"{assigner.offset_ms} milliseconds"
        )
    if isinstance(assigner, SessionWindows):
        return F.session_window(TIME, f"{assigner.gap_ms} milliseconds")
    raise PipelineError(f"the Spark runner has no native translation for {type(assigner).__name__}")


def _aggregate(agg: Aggregate, out: str) -> Any:
    field = F.col(agg.field) if agg.field else None
    if agg.kind == "count":
        expr = F.count(field) if field is not None else F.count(F.lit(1))
    elif agg.kind == "first":
        expr = F.min_by(field, F.col(TIME))
    elif agg.kind == "last":
        expr = F.max_by(field, F.col(TIME))
    else:
        expr = getattr(F, agg.kind)(field)
    return expr.alias(out)
