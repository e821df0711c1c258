"""Two connected keyed streams into one KeyedCoProcessFunction, on Ember's keyed runtime.

Both streams are unioned into rows of one shape (ember.coprocess: which stream, the
keys under shared names, each stream's fields under its own prefix) and run as one
keyed step, so state and timers of a key are shared by both inputs. With event time,
each stream gets its own watermark (its own strategy, set on its own column before the
union): Spark's watermark is then the least of the two, as Flink's two-input operators
take the least of their inputs'. The rows reach the keyed runtime with their event time
in ms, and the runtime decides about late rows, as for one input.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from ember.coprocess import INPUT, CoProcessAdapter, field_column, key_column
from ember.errors import PipelineError
from ember.graph.nodes import CoProcessNode, KeyByNode
from ember.runner.spark.compilation import Compilation, Frame, translates
from ember.runner.spark.keyed.runtime import without_hidden
from ember.runner.spark.translators.eventtime import TIME, with_event_time
from ember.runner.spark.translators.keyed import keyed_operator
from ember.runner.spark.translators.python_ops import output_struct
from ember.runner.spark.translators.transforms import check_paired_keys
from ember.time.watermarks import TimeCharacteristic

__all__: list[str] = []


@translates(CoProcessNode)
def _co_process(comp: Compilation, node: CoProcessNode) -> Frame:
    ups = [comp.frame(k.inputs[0] if isinstance(k, KeyByNode) else k) for k in node.inputs]
    structs = [without_hidden(up.df.schema) for up in ups]
    check_paired_keys(node.name, ("first", structs[0], node.keys), ("second", structs[1], node.other_keys))
    timed = [up.time is not None and up.time.characteristic is TimeCharacteristic.EVENT_TIME for up in ups]
    if timed[0] != timed[1]:
        raise PipelineError(
            "connect: one stream has event time and the other has not; give both sources a WatermarkStrategy "
            "with a timestamp field (or neither, for processing time)", node.name,
        )
    event_time = timed[0]
    rows: list[Any] = []
    for stream, (up, keys) in enumerate(zip(ups, (node.keys, node.other_keys)), start=1):
        df = up.df
        mark = f"__ember_watermark_of_{stream}"
        if event_time:
            assert up.time is not None
            df = with_event_time(comp, df, up.time, node.name, column=mark, keys=keys)
        columns = [F.lit(stream).alias(INPUT)] + [F.col(k).alias(key_column(i)) for i, k in enumerate(keys)]
        for other, struct in enumerate(structs, start=1):
            for f in struct.fields:
                value = F.col(f.name) if other == stream else F.lit(None).cast(f.dataType)
                columns.append(value.alias(field_column(other, f.name)))
        if event_time:
            columns.append(F.unix_millis(F.col(mark)).alias(TIME))  # no watermark marker: the runtime decides lateness
        rows.append(df.select(*columns))
    union = rows[0].unionByName(rows[1])
    adapter = CoProcessAdapter(node.fn, structs[0].names, structs[1].names)
    out = output_struct(node.output_schema, None, node.name)
    keys = tuple(key_column(i) for i in range(len(node.keys)))
    return keyed_operator(comp, node, Frame(union, ups[0].time), keys, adapter, out, event_time, timed=event_time)
