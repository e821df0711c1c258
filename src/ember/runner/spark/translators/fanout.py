"""A fan-out: the keyed steps reading one keyed step's output, as lanes of one operator.

The planner (planner.FanOut) finds the step (``source``) and its readers. Here
``source``'s rows go to every lane that reads them (``explode``), each lane's
filters apply to its own rows only, each row gets its lane's state bucket offset by
the lane (``lane * STATE_BUCKETS + pmod(xxhash64(keys), STATE_BUCKETS)``: the bucket
the step would have alone), and the rows are packed per group and run by one
``transformWithStateInPandas`` operator (keyed/lanes.py). Each lane is translated by
its own translator (translators/keyed.py), which hands over its parts instead of an
operator (``Lane``). The job splits after the operator: :class:`FannedOut` gives each
branch its lane's rows back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.state import GroupStateTimeout

from ember.errors import PipelineError
from ember.graph.nodes import FilterNode, Node, SideOutputNode
from ember.runner.spark.compilation import Compilation, Frame
from ember.runner.spark.keyed.lanes import LANE, LanesProcessor, lane_column
from ember.runner.spark.keyed.packing import PACKED_ROWS, packer, unpacking
from ember.runner.spark.keyed.runtime import STATE_BUCKETS, TAG, side_column, without_hidden
from ember.runner.spark.keyed.tws import BucketProcessor
from ember.runner.spark.planner import FanOut
from ember.runner.spark.translators.eventtime import ANCHOR, HIDDEN, restore_anchor
from ember.runner.spark.translators.keyed import BUCKET, bucket_of
from ember.runner.spark.translators.python_ops import python_filter
from ember.runner.spark.translators.transforms import column

__all__ = ["FannedOut", "fan_out"]


@dataclass(frozen=True)
class FannedOut:
    """The shared operator's rows (``frame``) and, per seed of the split (the lanes, then
    ``source`` with a pass-through lane), its output columns and notion of time."""

    frame: Frame
    seeds: tuple[Node, ...]
    columns: tuple[tuple[str, ...], ...]
    times: tuple[Any, ...]
    through: Any  # the pass-through lane's record type (its rows stay packed until the split), or None
    lanes: tuple[Node, ...]  # the seeds that are lanes (counted per batch in their branches: nowhere else)

    def branches(self, rows: Any) -> list[tuple[Node, Frame]]:
        """Each seed's rows (one micro-batch of the operator's, or its streaming rows) under
        their own names."""
        out = []
        for i, (node, cols, time) in enumerate(zip(self.seeds, self.columns, self.times)):
            df = rows.filter(F.col(LANE) == F.lit(i)).select(*[F.col(lane_column(i, c)).alias(c) for c in cols])
            if self.through is not None and i == len(self.seeds) - 1:
                df = df.mapInArrow(_unpacker(self.through.names), self.through)
            out.append((node, Frame(df, time)))
        return out


def _unpacker(names: list[str]) -> Any:
    """The ``mapInArrow`` function unpacking the pass-through lane's packed rows (``names``: its columns)."""

    def unpack(batches: Any) -> Any:
        import pyarrow as pa

        for batch in batches:
            for blob in batch.column(0).to_pylist():
                if blob:
                    for records in pa.ipc.open_stream(blob):
                        yield records.select(names)

    return unpack


def fan_out(comp: Compilation, fan: FanOut) -> FannedOut:
    comp.frame(fan.stem)
    main = comp.frames[id(fan.stem)]
    base = comp.tagged.get(id(fan.stem)) or main
    for lane in fan.lanes:
        comp.frame(lane)  # translates it: keyed.py keeps its parts in comp.lanes
    lanes = [comp.lanes[id(lane)] for lane in fan.lanes]
    event_time = lanes[0].event_time
    for lane in lanes:
        if lane.event_time != event_time or (event_time and lane.timeout == GroupStateTimeout.ProcessingTimeTimeout):
            raise PipelineError(
                f"'{lane.node.name}' runs on {'event' if lane.event_time else 'processing'} time and '{lanes[0].node.name}' "
                f"on {'event' if event_time else 'processing'} time; the steps reading '{fan.source.name}' share one "
                "operator, which runs on one notion of time", lane.node.name,
            )
    if comp.config.state_backend != "rocksdb":
        raise PipelineError("a job with several keyed steps runs them on Spark's transformWithStateInPandas, which needs "
                            "state_backend='rocksdb'", fan.lanes[0].name)
    n = len(lanes)
    fields = without_hidden(main.df.schema).names  # the records the lanes read
    through_columns = [c for c in base.df.columns if c not in HIDDEN]
    # Which output of the stem each lane reads: its main output (None) or a side output's tag.
    reads = [path[0].tag.name if isinstance(path[0], SideOutputNode) else None for path in fan.paths]
    passing = [F.lit(n)] if fan.through else []

    def copies(tag: str | None) -> Any:
        return F.array(*[F.lit(i) for i in range(n) if reads[i] == tag], *passing).cast("array<int>")

    lanes_of_row = copies(None)
    if TAG in base.df.columns:  # a side output's rows: the lanes reading it, and the pass-through lane
        lanes_of_row = F.when(F.col(TAG).isNull(), lanes_of_row)
        for tag in sorted({t for t in reads if t is not None}):
            lanes_of_row = lanes_of_row.when(F.col(TAG) == F.lit(tag), copies(tag))
        lanes_of_row = lanes_of_row.otherwise(F.array(*passing).cast("array<int>"))
    df = base.df.withColumn(LANE, F.explode(lanes_of_row))
    df = _filters(comp, fan, fields, df)
    # The pass-through lane keeps no state: its rows go in one group per input partition.
    bucket = F.lit(n * STATE_BUCKETS) + F.pmod(F.spark_partition_id(), F.lit(STATE_BUCKETS))
    for i in reversed(range(n)):
        tag = reads[i]
        keys = lanes[i].keys if tag is None else tuple(side_column(tag, k) for k in lanes[i].keys)
        bucket = F.when(F.col(LANE) == F.lit(i), F.lit(i * STATE_BUCKETS) + bucket_of(keys)).otherwise(bucket)
    df = df.withColumn(BUCKET, bucket.cast("int"))
    if event_time:
        df = restore_anchor(df)
    packed = T.StructType([T.StructField(BUCKET, T.IntegerType()), T.StructField(PACKED_ROWS, T.BinaryType())])
    rows = df.mapInArrow(packer(BUCKET, (ANCHOR,)), packed)
    if event_time:
        rows = restore_anchor(rows)
    processors: list[Any] = []
    for lane, tag in zip(lanes, reads):
        fn = lane.fn
        if tag is not None:  # its records' fields under their own names
            fn = _renamed(fn, {side_column(tag, f): f for f in comp.side_types[id(fan.stem)][tag].names})
        proc = lane.processor or BucketProcessor(unpacking(fn), [], None)
        proc.call, proc.anchor = unpacking(fn), None
        processors.append(proc)
    outputs = [[f.name for f in lane.schema.fields if f.name != ANCHOR] for lane in lanes]
    out_fields = [T.StructField(LANE, T.IntegerType())]
    for i, lane in enumerate(lanes):
        out_fields += [T.StructField(lane_column(i, f.name), f.dataType) for f in lane.schema.fields if f.name != ANCHOR]
    through = None
    if fan.through:
        processors.append(None)
        outputs.append([PACKED_ROWS])
        out_fields.append(T.StructField(lane_column(n, PACKED_ROWS), T.BinaryType()))
        through = T.StructType([f for f in base.df.schema.fields if f.name in through_columns])
    schema = T.StructType(out_fields)
    processor = LanesProcessor(processors, outputs, ANCHOR if event_time else None)
    processor.read(list(rows.columns))
    if event_time:
        schema = schema.add(ANCHOR, T.TimestampType())
        mode = "EventTime"
    else:
        timed = any(lane.timeout == GroupStateTimeout.ProcessingTimeTimeout for lane in lanes)
        mode = "ProcessingTime" if timed else "None"
    result = rows.groupBy(BUCKET).transformWithStateInPandas(
        processor, schema, "Append", mode, eventTimeColumnName=ANCHOR if event_time else ""
    )
    times = [comp.frames[id(lane)].time for lane in fan.lanes] + ([base.time] if fan.through else [])
    return FannedOut(Frame(result, main.time), fan.seeds, tuple(tuple(c) for c in outputs), tuple(times), through, fan.lanes)


def _renamed(run: Any, names: dict[str, str]) -> Any:
    """Bucket function ``run`` reading a side output's rows: their columns renamed by ``names``
    (side column -> field), the main output's columns of the same names dropped first."""

    def call(key: Any, frames: Any, state: Any) -> Any:
        def named() -> Any:
            for pdf in frames:
                yield pdf.drop(columns=[c for c in names.values() if c in pdf.columns]).rename(columns=names)

        return run(key, named(), state)

    return call


def _filters(comp: Compilation, fan: FanOut, fields: list[str], df: Any) -> Any:
    """``df`` with each filter on the lanes' paths applied to the rows of the lanes it is on."""
    done: list[Node] = []
    for step in (s for path in fan.paths for s in path):
        if not isinstance(step, FilterNode) or any(step is d for d in done):
            continue
        done.append(step)
        users = [i for i, path in enumerate(fan.paths) if any(step is s for s in path)]
        if step.is_python:
            df = python_filter(comp, df, step, (LANE, users, fields))
        else:
            df = df.filter(~F.col(LANE).isin(users) | column(step.predicate))
    return df
