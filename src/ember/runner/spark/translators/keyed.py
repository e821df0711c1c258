"""Keyed process steps: ``groupBy(state bucket).applyInPandasWithState``.

With event time, the bucket function runs under Spark's event-time timeout, so
Spark calls it for a bucket whose earliest timer the watermark has passed even
when no record arrives; otherwise under the processing-time timeout.
"""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from ember.errors import PipelineError
from ember.graph.nodes import KeyByNode, KeyedProcessNode
from ember.runner.spark.compiler import Compilation, Frame, translates
from ember.runner.spark.keyed.runtime import STATE_BUCKETS, make_bucket_function
from ember.runner.spark.pickling import ship_by_value
from ember.runner.spark.translators.eventtime import TIME, with_event_time
from ember.runner.spark.translators.python_ops import output_struct
from ember.time.watermarks import TimeCharacteristic

BUCKET = "__ember_bucket"


@translates(KeyedProcessNode)
def _process(comp: Compilation, node: KeyedProcessNode) -> Frame:
    parent = node.inputs[0]
    up = comp.frame(parent.inputs[0] if isinstance(parent, KeyByNode) else parent)
    df = up.df
    for key in node.keys:
        if key not in df.columns:
            raise PipelineError(f"key field '{key}' is not in the stream (fields: {', '.join(df.columns)})", node.name)
    out = output_struct(node.output_schema, None, node.name)
    fields = list(df.columns)
    event_time = up.time is not None and up.time.characteristic is TimeCharacteristic.EVENT_TIME
    ship_by_value(node.fn)
    fn = make_bucket_function(node.fn, node.name, list(node.keys), fields, out.names, TIME if event_time else None, event_time)
    if event_time:
        df = with_event_time(comp, df, up.time, node.name)
    bucketed = df.withColumn(BUCKET, F.pmod(F.xxhash64(*[F.col(k) for k in node.keys]), F.lit(STATE_BUCKETS)))
    timeout = GroupStateTimeout.EventTimeTimeout if event_time else GroupStateTimeout.ProcessingTimeTimeout
    result = bucketed.groupBy(BUCKET).applyInPandasWithState(fn, out, "blob binary", "append", timeout)
    return Frame(result, up.time)
