"""Keyed process steps: ``groupBy(state bucket).applyInPandasWithState``."""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from ember.errors import PipelineError
from ember.graph.nodes import KeyByNode, KeyedProcessNode
from ember.runner.spark.compiler import Compilation, Frame, translates
from ember.runner.spark.pickling import ship_by_value
from ember.runner.spark.keyed.runtime import NOW, STATE_BUCKETS, make_bucket_function
from ember.runner.spark.translators.python_ops import _struct
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
    out = _struct(node.output_schema, None, node.name)
    time_field = None
    if up.time is not None and up.time.characteristic is TimeCharacteristic.EVENT_TIME and up.time.timestamp_field in df.columns:
        time_field = up.time.timestamp_field
    fields = list(df.columns)
    ship_by_value(node.fn)
    fn = make_bucket_function(node.fn, node.name, list(node.keys), fields, out.names, time_field)
    bucketed = df.withColumn(BUCKET, F.pmod(F.xxhash64(*[F.col(k) for k in node.keys]), F.lit(STATE_BUCKETS))).withColumn(
        NOW, F.unix_millis(F.current_timestamp())  # the batch timestamp: logged by Spark, same on replay
    )
    result = bucketed.groupBy(BUCKET).applyInPandasWithState(
        fn, out, "blob binary", "append", GroupStateTimeout.NoTimeout
    )
    return Frame(result, up.time)
