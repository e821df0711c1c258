"""Interval joins of two streams on Spark's native stream-stream join — or, where another
stateful step comes before or after the join, as a co-process step on Ember's keyed runtime
(keyed/intervaljoin.py, same semantics; planner: ``native_join``).

Each side gets its event time as a watermarked column, shifted by ``SHIFT_MS`` with
the watermark delay shifted alike (the watermark's value is unchanged): Spark drops
an input row when ``time <= watermark`` and evicts a left row once no right row that
is not late can match it, so with the shift Spark drops exactly Flink's late records
(``ts < watermark``, Flink's watermark being ``max - bound - 1``) and counts them in
``numRowsDroppedByWatermark``. The key fields are compared for equality and the
interval is a range condition on the two time columns, from which Spark derives when
to forget state. Each side's fields travel flat under a prefix (what Spark keeps in its
join state, as a hand-written join would); after the join each side becomes one struct
column (``left``, ``right``), so a projection reads ``left.<field>`` and ``right.<field>``
whatever the names, and Spark folds that back into the flat columns.
"""

from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa
from pyspark.sql import functions as F

from ember.errors import PipelineError
from ember.graph.nodes import IntervalJoinNode, KeyByNode
from ember.runner.spark.compilation import Compilation, Frame, translates
from ember.runner.spark.keyed.runtime import without_hidden
from ember.runner.spark.pickling import ship_by_value
from ember.runner.spark.translators.coprocess import keyed_interval_join
from ember.runner.spark.translators.eventtime import with_event_time
from ember.runner.spark.translators.python_ops import arrow_schema, build_batch, output_struct, pair_records
from ember.runner.spark.translators.transforms import check_paired_keys, column

__all__ = ["SHIFT_MS"]

SHIFT_MS = 2  # Spark's late rule (time <= its watermark = Flink's + 1) moved onto Flink's (ts < Flink's watermark)


def _side(comp: Compilation, node: IntervalJoinNode, up: Frame, fields: list[str], keys: tuple[str, ...], side: str) -> Any:
    """One input: its record fields as ``__ember_<side>_<field>`` columns (flat: Spark keeps
    exactly these in its join state) and its shifted, watermarked time column."""
    if up.time is None or up.time.timestamp_field is None:
        parent = node.inputs[0 if side == "left" else 1]
        raise PipelineError(
            f"interval_join needs event time on its {side} stream ('{parent.name}'): give its source a "
            "WatermarkStrategy with a timestamp field", node.name,
        )
    time = _time(side)
    df = with_event_time(comp, up.df, up.time, node.name, column=time, shift_ms=SHIFT_MS, keys=keys)
    return df.select(*[F.col(f).alias(_flat(side, f)) for f in fields], time)


def _flat(side: str, field: str) -> str:
    return f"__ember_{side}_{field}"


def _time(side: str) -> str:
    return f"__ember_{side}_time"


def _record(side: str, fields: list[str], always: bool) -> Any:
    """The side's record as one struct column named ``side`` (null where an outer join has no
    record of that side; ``always``: every row has one); Spark folds ``left.<field>`` of a
    plain struct back into the flat column."""
    record = F.struct(*[F.col(_flat(side, f)).alias(f) for f in fields])
    if always:
        return record.alias(side)
    return F.when(F.col(_time(side)).isNull(), F.lit(None)).otherwise(record).alias(side)


@translates(IntervalJoinNode)
def _interval_join(comp: Compilation, node: IntervalJoinNode) -> Frame:
    if not comp.plan.native_join(node):  # another stateful step before or after it: Ember's keyed runtime
        return keyed_interval_join(comp, node)
    ups = [comp.frame(k.inputs[0] if isinstance(k, KeyByNode) else k) for k in node.inputs]  # Spark's join partitions by key
    structs = [without_hidden(up.df.schema) for up in ups]
    check_paired_keys(node.name, ("left", structs[0], node.left_keys), ("right", structs[1], node.right_keys))
    left_fields, right_fields = structs[0].names, structs[1].names
    left = _side(comp, node, ups[0], left_fields, node.left_keys, "left")
    right = _side(comp, node, ups[1], right_fields, node.right_keys, "right")
    condition = [F.col(_flat("left", lk)) == F.col(_flat("right", rk)) for lk, rk in zip(node.left_keys, node.right_keys)]
    l_time, r_time = F.col(_time("left")), F.col(_time("right"))
    condition += [
        r_time >= l_time + F.expr(f"INTERVAL '{node.lower_ms}' MILLISECOND"),
        r_time <= l_time + F.expr(f"INTERVAL '{node.upper_ms}' MILLISECOND"),
    ]
    joined = left.join(right, condition, node.how).select(
        _record("left", left_fields, node.how in ("inner", "left_outer")),
        _record("right", right_fields, node.how in ("inner", "right_outer")),
    )
    if node.fn is not None:
        return Frame(_process(joined, node))
    if node.exprs:
        return Frame(joined.select(*[column(e) for e in node.exprs]))
    renamed = [F.col(f"right.{f}").alias(f"right_{f}" if f in left_fields else f) for f in right_fields]
    return Frame(joined.select(*[F.col(f"left.{f}").alias(f) for f in left_fields], *renamed))


def _process(joined: Any, node: IntervalJoinNode) -> Any:
    """``fn(left, right)`` per joined pair, on Arrow batches (None for an outer join's missing side)."""
    out = output_struct(node.output_schema, None, node.name)
    schema, names, fn, step = arrow_schema(out), out.names, node.fn, node.name
    assert fn is not None
    ship_by_value(fn)

    call = pair_records(fn, names, step)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            lefts, rights = batch.column(0).to_pylist(), batch.column(1).to_pylist()
            rows: list[dict[str, Any]] = []
            for left, right in zip(lefts, rights):
                rows.extend(call(left, right))
            yield build_batch(rows, schema, step)

    return joined.mapInArrow(run, out)
