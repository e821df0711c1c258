"""Keyed steps on managed state: ``groupBy(state bucket).applyInPandasWithState``.

Process functions and Ember's window operator both compile here. With event
time, the bucket function runs under Spark's event-time timeout, so Spark
calls it for a bucket whose earliest timer the watermark has passed even when
no record arrives; otherwise under the processing-time timeout. Rows behind
the watermark are kept (Spark would drop them): the operator decides.

A step whose side outputs are read downstream outputs one combined frame: its
main fields, ``__ember_tag`` and each side output's fields; the compiler
splits it into the main stream and one stream per side output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.state import GroupStateTimeout

from ember.connectors.hashing import INT_KINDS
from ember.errors import PipelineError
from ember.graph.graph import ancestors
from ember.graph.nodes import ChainedProcessNode, KeyByNode, KeyedProcessNode, Node, SideOutputNode, SourceNode, VectorizedProcessNode, WindowNode
from ember.rolling import RollingField
from ember.runner.spark.checkpoint import CheckpointLayout, checkpoint_keyed_operator, group_timeouts_everywhere
from ember.runner.spark.compilation import Compilation, Frame, translates
from ember.runner.spark.datasources import PreviousWatermark
from ember.runner.spark.deadletters import DEAD_LETTER_STRUCT, combined_struct, dead_letter_tags, read_dead_letters
from ember.runner.spark.keyed.bucket import BucketFunction
from ember.runner.spark.keyed.delta import DELTA_COUNTERS, delta_layout_problem, numpy_types, step_directory, uses_delta
from ember.runner.spark.keyed.packing import LATEST, PACKED_ROWS, PackSpec, packer, unpacking
from ember.runner.spark.keyed.reach import Reach
from ember.runner.spark.keyed.runtime import PRE, TAG, side_column, without_hidden
from ember.runner.spark.keyed.tws import BucketProcessor, DeltaBucketProcessor, DeltaSlotProcessor
from ember.runner.spark.keyed.vectorized import make_vectorized_bucket_function
from ember.runner.spark.keyed.windows import (
    LATE_COUNTER,
    MARKER,
    PARTIAL_ACC,
    PARTIAL_COUNT,
    PARTIAL_START,
    WindowOperator,
    WindowSpec,
    make_combiner,
)
from ember.runner.spark.pickling import ship_by_value
from ember.runner.spark.placement import TWS, runtime_steps, spark_keyed_operator
from ember.runner.spark.translators.eventtime import ANCHOR, HIDDEN, TIME, keep_late_rows, restore_anchor, with_event_time
from ember.runner.spark.translators.python_ops import output_struct
from ember.runner.spark.translators.windowfns import NUMERIC, builtin_aggregate, default_trigger, window_output
from ember.time.watermarks import TimeCharacteristic

BUCKET = "__ember_bucket"


@dataclass(frozen=True)
class Lane:
    """A keyed step run as a lane of a fan-out's shared operator (translators/fanout.py): its
    key fields, bucket function (reading packed rows), output schema, whether it runs on event
    time, its Spark timeout kind, and its state processor on design B (None: the blob layout)."""

    node: Node
    keys: tuple[str, ...]
    fn: Any  # its bucket function (reading unpacked rows)
    schema: T.StructType
    event_time: bool
    timeout: Any
    processor: Any
    inputs: "LaneInputs | None" = None  # a two-input step's: its rows' shape and its other input


@dataclass(frozen=True)
class LaneInputs:
    """A two-input step run as a lane (translators/coprocess.py): ``shape``, the columns of
    its rows — (name, expression) pairs computing them from a record of the input that reads
    the fan-out (its fields under their names, its event time as ``TIME`` beside them);
    ``other``, its other input's rows in that shape, their watermark set (None when both
    inputs read the fan-out: ``second``); ``bucket``, a column
    of ``other`` that gives each of its rows a state bucket (a broadcast stream's copies), or
    None: the keys do."""

    shape: tuple[tuple[str, Any], ...]
    other: Any
    bucket: str | None = None
    # With the fanned-out rows on both inputs: the shape of the second input's (``shape`` is
    # the first's), and no ``other``.
    second: tuple[tuple[str, Any], ...] | None = None


def keyed_input(comp: Compilation, node: Node, keys: tuple[str, ...]) -> Frame:
    """The frame a keyed step's first input (its key_by) reads, with ``keys`` checked in it."""
    parent = node.inputs[0]
    up = comp.frame(parent.inputs[0] if isinstance(parent, KeyByNode) else parent)  # grouping partitions by key itself
    fields = _fields(up)
    for key in keys:
        if not isinstance(key, str):  # key_by(Column) is for windows on Spark's native windowing
            raise PipelineError(
                f"this step runs on Ember's keyed runtime (it holds keyed state, or reads or feeds another stateful "
                f"step), whose keys are field names; key_by got the Column {key!r}: add it as a field with select "
                "first, then key_by that field", node.name,
            )
        if key not in fields:
            raise PipelineError(f"key field '{key}' is not in the stream (fields: {', '.join(fields)})", node.name)
    return up


def _fields(up: Frame) -> list[str]:
    """The stream's record fields (without the columns Ember carries between keyed steps,
    nor a state bucket chosen upstream: a broadcast step's)."""
    return [f for f in without_hidden(up.df.schema).names if f != BUCKET]


def chained(comp: Compilation, node: Node, event_time: bool) -> bool:
    """Whether ``node`` reads another keyed step's rows — or a SQL step's — with their event
    time (TIME, PRE)."""
    return event_time and (comp.plan.upstream_step(node) is not None or comp.plan.upstream_sql(node) is not None)


def _side_outputs(comp: Compilation, node: Node, late: tuple[Any, T.StructType] | None) -> dict[str, T.StructType]:
    """The side outputs of ``node`` read downstream, with their record types."""
    out: dict[str, T.StructType] = {}
    for consumer in comp.graph.nodes:
        if not isinstance(consumer, SideOutputNode) or consumer.inputs[0] is not node:
            continue
        tag = consumer.tag
        if late is not None and tag == late[0]:
            out[tag.name] = late[1]
        elif tag.name in dead_letter_tags(node):
            out[tag.name] = DEAD_LETTER_STRUCT
        elif tag.schema is None:
            raise PipelineError(f"side output '{tag.name}' needs a schema: OutputTag('{tag.name}', 'field type, ...')", node.name)
        else:
            out[tag.name] = output_struct(tag.schema, None, node.name)
    return out


def keyed_operator(
    comp: Compilation,
    node: Node,
    up: Frame,
    keys: tuple[str, ...],
    fn: Any,
    out: T.StructType,
    event_time: bool,
    late: tuple[Any, T.StructType] | None = None,
    combiner: Any = None,
    timed: bool = False,
    tie_break: str | None = None,
    dead_letter: str | None = None,
    lane_inputs: LaneInputs | None = None,
) -> Frame:
    """``fn`` (a KeyedProcessFunction) on ``up`` grouped into state buckets by ``keys``.

    ``combiner(fields)``, when given, returns a ``mapInArrow`` function and its output
    schema: it pre-aggregates each partition before the shuffle, and ``fn`` receives
    its output instead of the records. ``timed``: ``up`` already carries each row's event
    time in ms as ``TIME`` and the query its watermark (two connected streams, each with
    its own watermark: translators/coprocess.py); then a ``BUCKET`` column in ``up`` chooses
    each row's state bucket. ``tie_break``: a column ordering a key's rows of equal event
    time (or, without event time, all of a bucket's rows). ``lane_inputs``: a two-input
    step's, when it runs as a lane of a fan-out (``up`` then holds its other input's rows)."""
    fields = _fields(up)
    emit_time = event_time and comp.plan.read_by_step(node)
    advance_ms = _advance_ms(comp, node, up, event_time)
    quiet_marks = _quiet_marks(comp, node, advance_ms)
    partials = None
    if combiner is not None and not comp.plan.lane(node):
        combine, partial_type = combiner(fields, Reach(comp.buckets, quiet_marks) if advance_ms is not None else None)
        partials = _timed(comp, node, up, event_time, timed).mapInArrow(combine, partial_type)
        partials = restore_anchor(partials) if event_time else partials
        fields = [f.name for f in partial_type.fields if f.name not in (TIME, MARKER)]
    sides = _side_outputs(comp, node, late)
    schema = T.StructType(list(out.fields))
    if sides:
        schema = schema.add(TAG, T.StringType())
        for tag, struct in sides.items():
            for f in struct.fields:
                schema = schema.add(side_column(tag, f.name), f.dataType)
    comp.side_types[id(node)] = sides
    counters = {LATE_COUNTER: comp.counter(LATE_COUNTER)}
    if emit_time:
        schema = schema.add(TIME, T.LongType()).add(PRE, T.BooleanType())
    ship_by_value(fn)
    bucket_fn = BucketFunction(
        fn, node.name, list(keys), fields, out.names, TIME if event_time else None, event_time,
        side_outputs={t: s.names for t, s in sides.items()}, counters=counters,
        emit_time=emit_time, previous_watermark=_previous_watermark(comp, node, event_time), tie_break=tie_break,
        advance_ms=advance_ms, dead_letter=dead_letter, quiet_marks=quiet_marks,
    )
    timeout = GroupStateTimeout.EventTimeTimeout if event_time else GroupStateTimeout.ProcessingTimeTimeout
    processor = None
    if uses_delta(node, comp.config.state_layout, comp.graph):  # keyed/delta.py, any key type
        processor = DeltaSlotProcessor(bucket_fn, [], ANCHOR if event_time else None,
                                       step_directory(comp.checkpoint, node.name), _delta_counters(comp))
    elif without_group_timeout(comp, advance_ms):
        timeout = GroupStateTimeout.NoTimeout
        bucket_fn.group_timeout = False
    result = _run_keyed(comp, node, up, keys, event_time, bucket_fn, schema, "blob binary", timeout, processor,
                        partials, timed, lane_inputs)
    return Frame(result if emit_time else _visible(result), up.time)


def _run_keyed(comp: Compilation, node: Node, up: Frame, keys: tuple[str, ...], event_time: bool, bucket_fn: Any,
               schema: T.StructType, state_type: str, timeout: Any, processor: Any, partials: Any = None,
               timed: bool = False, lane_inputs: LaneInputs | None = None) -> Any:
    """The keyed step's output rows: its input grouped by state bucket into its Spark operator —
    or, for a lane of a fan-out (fan_out_plan.FanOut), its parts kept for the one operator all
    lanes share (translators/fanout.py), and an empty frame of its output's shape."""
    comp.key_types[node.name] = [up.df.schema[k].dataType.simpleString() for k in keys]  # savepoints place new keys
    if comp.plan.lane(node):
        if partials is not None or (timed and lane_inputs is None):
            raise PipelineError("a pre-aggregating step cannot be a lane of a fan-out yet", node.name)
        comp.lanes[id(node)] = Lane(node, keys, bucket_fn, schema, event_time, timeout, processor, lane_inputs)
        return comp.spark.createDataFrame([], schema)
    grouped, bucket_fn = _buckets(comp, node, up, keys, event_time, bucket_fn, partials, timed)
    return _apply(comp, grouped, bucket_fn, schema, state_type, event_time, timeout, processor, initial_state(comp, [node]))


def initial_state(comp: Compilation, nodes: list[Node]) -> Any | None:
    """In the first micro-batch of a checkpoint converted from a savepoint of another state
    layout (savepoints/convert.py), the state of the steps ``nodes`` (one, or a fan-out's lanes
    sharing an operator) as the savepoint held it, grouped by state bucket as their rows are;
    None otherwise."""
    if comp.checkpoint is None:
        return None
    layout = CheckpointLayout(comp.checkpoint)
    if not layout.converting():
        return None
    paths = [p for p in (layout.initial_state(node.name) for node in nodes) if os.path.exists(p)]
    if not paths:
        return None
    comp.initial_states.extend(paths)  # (the runner checks every step's state was taken: execution.py)
    return comp.spark.read.parquet(*paths).groupBy(BUCKET)


def _visible(df: Any) -> Any:
    """``df`` without the columns only a next keyed step reads."""
    hidden = [c for c in df.columns if c in HIDDEN]
    return df.drop(*hidden) if hidden else df


def _advance_ms(comp: Compilation, node: Node, up: Frame, event_time: bool) -> int | None:
    """The bound with which the step advances its watermark within a batch (bucket.py:
    windows and timers fire in the batch whose records close them), or None.

    Only where the step's input watermark is the query's only one: a step with one input
    and the job's only Spark stateful operator. Spark's global watermark is the least of
    its watermark operators', which one step's records cannot tell; that also leaves out
    steps linked to other keyed steps (docs/design/dataflow.md) and two-input steps (each
    input its own watermark)."""
    if not event_time or len(node.inputs) != 1 or not comp.plan.late_rows_against_current_watermark \
            or comp.plan.lane(node):  # (a lane of a fan-out: its operator's rows are packed per lane)
        return None
    return up.time.max_out_of_orderness_ms


def _quiet_marks(comp: Compilation, node: Node, advance_ms: int | None) -> str | None:
    """Where a step advancing its watermark within the batch marks its buckets without timers,
    which the packing then leaves out unless they have records (keyed/reach.py): on
    ``applyInPandasWithState`` with a checkpoint; None (every bucket called) elsewhere."""
    if advance_ms is None or comp.checkpoint is None or on_tws(comp) \
            or uses_delta(node, comp.config.state_layout, comp.graph):
        return None
    return CheckpointLayout(comp.checkpoint).quiet(node.name)


def without_group_timeout(comp: Compilation, advance_ms: int | None) -> bool:
    """Whether a keyed step on ``applyInPandasWithState`` runs without Spark's group timeout.

    Spark runs an operator's timeout pass on every task of every batch, a second call of the
    Python worker even when no bucket times out (~40-55 ms per task and batch; without it the
    E4 job's batch of 5 k events takes ~15 % less: docs/design/latency.md). A step
    that advances its watermark within the batch (``advance_ms``) needs none: every bucket
    hears of each batch's records and fires there what a timeout would fire first thing in
    the next batch, and Spark's watermark moves only with records the step sees — except for
    the end-of-input row of a job whose sources all end, which moves it alone (the flush
    goes through the timeout), and a checkpoint older than this rule, whose state rows keep
    the timeout's column (checkpoint.group_timeouts_everywhere)."""
    return (advance_ms is not None and not comp.bounded and not on_tws(comp)
            and not group_timeouts_everywhere(comp.checkpoint))


def on_tws(comp: Compilation) -> bool:
    """Whether the job's keyed-runtime steps run on ``transformWithStateInPandas``
    (placement.spark_keyed_operator; a checkpoint being continued keeps its operator)."""
    chosen = spark_keyed_operator(comp.graph, comp.config.keyed_operator, comp.plan.fan_out is not None,
                                  checkpoint_keyed_operator(comp.checkpoint), comp.config.state_backend == "rocksdb")
    return chosen == TWS


def _previous_watermark(comp: Compilation, node: Node, event_time: bool) -> PreviousWatermark | None:
    """The previous batch's watermark, for a step chained after another (bucket.py)."""
    if not chained(comp, node, event_time):
        return None
    return PreviousWatermark(comp.checkpoint or "")


def _apply(comp: Compilation, grouped: Any, bucket_fn: Any, schema: T.StructType, state_type: str, event_time: bool,
           timeout: Any, processor: Any = None, initial: Any = None) -> Any:
    """The bucket function on Spark: ``applyInPandasWithState`` or ``transformWithStateInPandas``
    as placement.spark_keyed_operator chooses (keyed/tws.py) — the latter also for a step on
    design B, whose ``processor`` (keyed/tws.py) is given. ``initial``: the state Spark hands
    the latter in the first micro-batch (a converted checkpoint's, grouped by bucket)."""
    if processor is None and not on_tws(comp):
        if initial is not None:  # (convert.py makes every converted step's checkpoint keep it on TWS)
            raise PipelineError("a converted checkpoint's state can only be handed to transformWithStateInPandas")
        return grouped.applyInPandasWithState(bucket_fn, schema, state_type, "append", timeout)
    if comp.config.state_backend != "rocksdb":
        raise PipelineError(
            "a job with several keyed steps runs them on Spark's transformWithStateInPandas, which needs "
            "state_backend='rocksdb'"
        )
    mode = "EventTime" if event_time else ("ProcessingTime" if timeout == GroupStateTimeout.ProcessingTimeTimeout else "None")
    if event_time:  # a null event-time column: Spark passes its watermark on, and never finds a row behind it
        schema = T.StructType(list(schema.fields)).add(ANCHOR, T.TimestampType())
    if processor is None:
        processor = BucketProcessor(bucket_fn, list(grouped._df.columns), ANCHOR if event_time else None)
    processor.call, processor.columns = bucket_fn, list(grouped._df.columns)
    return grouped.transformWithStateInPandas(processor, schema, "Append", mode, initialState=initial,
                                              eventTimeColumnName=ANCHOR if event_time else "")


def _timed(comp: Compilation, node: Node, up: Frame, event_time: bool, timed: bool = False) -> Any:
    """``up``'s rows with the event-time column and watermark a keyed step needs (after
    another keyed step, its rows carry their event time and Spark its watermark)."""
    if not event_time:
        return up.df
    if timed or chained(comp, node, event_time):
        return restore_anchor(up.df)
    return keep_late_rows(with_event_time(comp, up.df, up.time, node.name))


def _buckets(
    comp: Compilation, node: Node, up: Frame, keys: tuple[str, ...], event_time: bool, bucket_fn: Any, partials: Any = None,
    timed: bool = False,
) -> tuple[Any, Any]:
    """``up``'s rows grouped by state bucket and packed per bucket (keyed/packing.py) —
    by the source itself where it can, else by a ``mapInArrow`` step — or, when a
    window pre-aggregated them, its ``partials`` (few already), grouped unpacked."""
    if partials is not None:
        if MARKER in partials.columns:  # the combiner's rows telling each bucket the batch's latest time
            return partials.withColumn(BUCKET, F.coalesce(F.col(MARKER), bucket_of(keys, comp.buckets))).drop(MARKER).groupBy(BUCKET), bucket_fn
        return partials.withColumn(BUCKET, bucket_of(keys, comp.buckets)).groupBy(BUCKET), bucket_fn
    # A step advancing its watermark within the batch hears the batch's latest event time
    # in every bucket: every partition's packing tells every bucket (keyed/packing.py).
    advancing = getattr(bucket_fn, "advance_ms", None) is not None
    quiet_marks = getattr(bucket_fn, "quiet_marks", None)
    fused = None if timed else _fused_source(comp, node, up, keys, event_time, advancing, quiet_marks)
    if fused is not None:
        return fused.groupBy(BUCKET), unpacking(bucket_fn, up.time.timestamp_field if advancing else None)
    bucketed = _timed(comp, node, up, event_time, timed)
    if BUCKET not in bucketed.columns:  # else chosen upstream
        bucketed = bucketed.withColumn(BUCKET, bucket_of(keys, comp.buckets))
    schema = T.StructType([T.StructField(BUCKET, T.IntegerType()), T.StructField(PACKED_ROWS, T.BinaryType())])
    if advancing:
        schema = schema.add(LATEST, T.LongType())
    pack = packer(BUCKET, (ANCHOR,), TIME if advancing else None, Reach(comp.buckets, quiet_marks) if advancing else None)
    rows = bucketed.mapInArrow(pack, schema)
    if event_time:
        rows = restore_anchor(rows)
    return rows.groupBy(BUCKET), unpacking(bucket_fn, LATEST if advancing else None)


def bucket_of(keys: tuple[str, ...], buckets: int) -> Any:
    """A row's state bucket: ``pmod(xxhash64(keys), buckets)`` (savepoints place new keys with it too);
    bucket 0 for a non-keyed step (``window_all``: one key, as Flink runs it with parallelism 1)."""
    if not keys:
        return F.lit(0)
    return F.pmod(F.xxhash64(*[F.col(k) for k in keys]), F.lit(buckets)).cast("int")


def _fused_source(comp: Compilation, node: Node, up: Frame, keys: tuple[str, ...], event_time: bool,
                  every_bucket: bool = False, quiet_marks: str | None = None) -> Any | None:
    """The keyed step's input packed per state bucket by its source itself, when
    the step reads a Python source directly (``source.key_by(...).process(...)``)
    whose key fields (and event-time field) are integers, nothing else reads that
    source, and ``fuse_sources`` is on: every record then crosses into the JVM once,
    packed, instead of twice (docs/design/keyed-state.md). None otherwise."""
    from ember.runner.spark.translators.sources import packed_source

    key_by = node.inputs[0]
    source = key_by.inputs[0] if isinstance(key_by, KeyByNode) else None
    if not comp.config.fuse_sources or not isinstance(source, SourceNode) or len(node.inputs) != 1:
        return None  # (a two-input step's rows are the union of both inputs, never one source's)
    if sum(1 for n in comp.graph.nodes for i in n.inputs if i is source or i is key_by) != 2:
        return None  # another step reads the source or the keyed stream
    schema = up.df.schema
    kinds = tuple(schema[k].dataType.simpleString() for k in keys)
    time_field = up.time.timestamp_field if event_time else None
    if any(k not in INT_KINDS for k in kinds) or (time_field and schema[time_field].dataType.simpleString() not in ("int", "bigint")):
        return None
    spec = PackSpec(tuple(keys), kinds, comp.buckets, BUCKET, time_field, TIME if event_time else None, every_bucket,
                    quiet_marks)
    df = packed_source(comp, source, spec)
    return None if df is None else _timed(comp, node, Frame(df, up.time), event_time)


def _has_event_time(up: Frame) -> bool:
    return up.time is not None and up.time.characteristic is TimeCharacteristic.EVENT_TIME


@translates(ChainedProcessNode)
@translates(KeyedProcessNode)
def _process(comp: Compilation, node: KeyedProcessNode) -> Frame:
    up = keyed_input(comp, node, node.keys)
    if isinstance(node, ChainedProcessNode) and isinstance(node.steps[-1], WindowNode):
        return _chained_window(comp, node, up)
    visible = without_hidden(up.df.schema)
    field = node.fn.field if isinstance(node.fn, RollingField) else None
    if field is not None and field not in visible.names:
        raise PipelineError(f"no field '{field}' in the stream (fields: {', '.join(visible.names)})", node.name)
    if field is not None and node.fn.kind == "sum" and not isinstance(visible[field].dataType, NUMERIC):
        raise PipelineError(f"a rolling sum takes a number; '{field}' is {visible[field].dataType.simpleString()}: "
                            "cast it first with select", node.name)
    out = output_struct(node.output_schema, visible, node.name)  # no schema: a rolling step's, the input's
    event_time = _has_event_time(up)
    dead_letter = read_dead_letters(comp, node)  # (a chain's: its last step's)
    fn = node.fn
    if isinstance(node, ChainedProcessNode):  # the chain hands each step's rows to the next as records
        fn = fn.bound([output_struct(s.output_schema, None, s.name).names for s in node.steps[:-1]],
                      [read_dead_letters(comp, node, s) for s in node.steps[:-1]] + [dead_letter])
    return keyed_operator(comp, node, up, node.keys, fn, out, event_time,
                          combiner=_rolling_combiner(comp, node, up, event_time), dead_letter=dead_letter)


def _rolling_combiner(comp: Compilation, node: KeyedProcessNode, up: Frame, event_time: bool) -> Any:
    """For a rolling sum/min/max emitting once per key and batch: its combiner before the
    shuffle (keyed/rolling.py) — unless another keyed step reads it or it reads one (their
    rows carry per-row event time through), it is a lane of a fan-out, or ``combine_windows`` is off."""
    fn = node.fn
    if not isinstance(fn, RollingField) or fn.emit != "batch" or fn.by or not comp.config.combine_windows:
        return None
    if chained(comp, node, event_time) or (event_time and comp.plan.read_by_step(node)) or comp.plan.lane(node):
        return None
    from pyspark.sql.pandas.types import to_arrow_schema

    from ember.runner.spark.keyed.rolling import partial_schema, rolling_combiner

    def combiner(fields: list[str], reach: Reach | None) -> tuple[Any, T.StructType]:
        time_column = TIME if event_time else None  # epoch ms (bigint) before a keyed step: eventtime.keep_late_rows
        struct = partial_schema(fields, up.df.schema, time_column)
        arrow = to_arrow_schema(struct)
        return rolling_combiner(fn.kind, fn.field, node.keys, fields, arrow, time_column), struct

    return combiner


@translates(VectorizedProcessNode)
def _process_batches(comp: Compilation, node: VectorizedProcessNode) -> Frame:
    up = keyed_input(comp, node, node.keys)
    out = output_struct(node.output_schema, None, node.name)
    state_type = output_struct(node.fn.state_schema, None, node.name)
    event_time = _has_event_time(up)
    emit_time = event_time and comp.plan.read_by_step(node)  # (its rows stamped: vectorized._stamped)
    fields = _fields(up)
    ship_by_value(node.fn)
    dead = read_dead_letters(comp, node)
    bucket_fn = make_vectorized_bucket_function(
        node.fn, node.name, list(node.keys), fields, state_type.names, out.names, TIME if event_time else None, event_time,
        dead_letter=dead, emit_time=emit_time,
    )
    timeout = GroupStateTimeout.EventTimeTimeout if event_time else GroupStateTimeout.NoTimeout
    processor = None
    if uses_delta(node, comp.config.state_layout, comp.graph):
        state_kinds = [f.dataType.simpleString() for f in state_type.fields]
        _check_delta(node, up, state_kinds)
        processor = DeltaBucketProcessor(lambda *a: iter(()), [], ANCHOR if event_time else None,
                                         step_directory(comp.checkpoint, node.name), node.keys[0], state_type.names,
                                         numpy_types(state_kinds), node.name, _delta_counters(comp))
    schema = combined_struct(out, dead) if dead is not None else out
    if emit_time:
        schema = T.StructType(list(schema.fields)).add(TIME, T.LongType()).add(PRE, T.BooleanType())
    result = _run_keyed(comp, node, up, node.keys, event_time, bucket_fn, schema, "table binary", timeout, processor)
    return Frame(result if emit_time else _visible(result), up.time)


def _check_delta(node: Node, up: Frame, state_kinds: list[str]) -> None:
    """A PipelineError saying why the step's key or state cannot be kept on design B (keyed/delta.py)."""
    key_kinds = [up.df.schema[k].dataType.simpleString() for k in node.keys]  # type: ignore[attr-defined]
    problem = delta_layout_problem(key_kinds, state_kinds)
    if problem is not None:
        raise PipelineError(f"state_layout='delta' cannot keep this step's state: {problem}; use state_layout='blob'", node.name)


def _delta_counters(comp: Compilation) -> dict[str, Any]:
    return {name: comp.counter(name) for name in DELTA_COUNTERS}


def operator_window(comp: Compilation, node: WindowNode) -> Frame:
    """Any window on Ember's window operator (keyed/windows), over keyed state."""
    up = keyed_input(comp, node, node.keys)
    event_time = _window_time(up, node)
    input_type = without_hidden(up.df.schema)
    spec, out = _window_spec(node, input_type, read_dead_letters(comp, node))
    late = (node.late_tag, input_type) if node.late_tag is not None else None
    combiner = None
    if spec.combinable and event_time and comp.config.combine_windows and not chained(comp, node, event_time) \
            and not comp.plan.lane(node):  # (a fan-out's lanes read the shared operator's rows, uncombined)
        ship_by_value(spec)  # the aggregate function travels with the combiner
        partial_type = T.StructType(
            [T.StructField(k, input_type[k].dataType) for k in node.keys]  # nullable: the combiner's markers have no key
            + [T.StructField(PARTIAL_START, T.LongType()), T.StructField(PARTIAL_ACC, T.BinaryType()),
               T.StructField(PARTIAL_COUNT, T.LongType()), T.StructField(TIME, T.TimestampType())]
        )

        def combiner(fields: list[str], reach: Reach | None) -> tuple[Any, T.StructType]:
            struct = partial_type.add(MARKER, T.IntegerType()) if reach is not None else partial_type
            return make_combiner(spec, fields, node.keys, TIME, reach), struct

        spec = replace(spec, combined=True)
    return keyed_operator(comp, node, up, node.keys, WindowOperator(spec), out, event_time, late, combiner)


def _window_time(up: Frame, node: WindowNode) -> bool:
    """Whether the window ``node`` on ``up`` runs in event time; refuses an event-time window
    on a stream without a watermark."""
    assigner = node.assigner
    assert assigner is not None
    event_time = _has_event_time(up) and not assigner.processing_time
    if not assigner.processing_time and not assigner.is_global and not event_time:
        raise PipelineError(
            "an event-time window needs the source's watermark strategy: pass "
            "watermark=WatermarkStrategy.for_bounded_out_of_orderness(...) to from_source, "
            "or use a processing-time window",
            node.name,
        )
    return event_time


def _window_spec(node: WindowNode, input_type: T.StructType, dead_letter: str | None) -> tuple[WindowSpec, T.StructType]:
    """The window operator's spec of ``node`` on records of ``input_type`` (its failures to the
    dead-letter output ``dead_letter``), and its output type."""
    assigner = node.assigner
    aggregate = node.aggregate_fn
    if node.aggregates:
        aggregate = builtin_aggregate(node.aggregates, input_type, node.name)
    out, result_fields = window_output(node, input_type, aggregate)
    spec = WindowSpec(
        assigner=assigner,
        trigger=node.trigger if node.trigger is not None else default_trigger(assigner),
        evictor=node.evictor,
        allowed_lateness_ms=node.allowed_lateness_ms,
        late_tag=node.late_tag,
        aggregate=aggregate,
        reduce=node.reduce_fn,
        window_function=node.window_fn,
        key_names=node.keys,
        result_fields=result_fields,
        step=node.name,
        dead_letter=dead_letter,
    )
    return spec, out


def _chained_window(comp: Compilation, node: ChainedProcessNode, up: Frame) -> Frame:
    """A chain of process steps ending in a keyed window (ember.graph.chaining): the window on
    Ember's operator, reading the last process step's records in the chain's call."""
    window = node.steps[-1]
    assert isinstance(window, WindowNode) and window.assigner is not None
    event_time = _window_time(up, window)
    if _has_event_time(up) and not event_time:
        raise PipelineError(
            f"a processing-time window cannot be chained to '{node.steps[-2].name}' on a stream with event time "
            "(the steps before it would lose it): read it through key_by instead of reinterpret_as_keyed", window.name,
        )
    structs = [output_struct(s.output_schema, None, s.name) for s in node.steps[:-1]]
    spec, out = _window_spec(window, structs[-1], read_dead_letters(comp, node, window))
    fn = node.fn.bound([s.names for s in structs], [read_dead_letters(comp, node, s) for s in node.steps[:-1]]
                       + [spec.dead_letter], WindowOperator(spec))
    late = (window.late_tag, structs[-1]) if window.late_tag is not None else None
    return keyed_operator(comp, node, up, node.keys, fn, out, event_time, late)


@translates(SideOutputNode)
def _side_output(comp: Compilation, node: SideOutputNode) -> Frame:
    producer, tag = node.inputs[0], node.tag.name
    comp.frame(producer)  # translates it, recording its combined frame and side types
    struct = comp.side_types[id(producer)][tag]
    df = comp.tagged[id(producer)].df.filter(F.col(TAG) == F.lit(tag))
    columns = [F.col(side_column(tag, f.name)).alias(f.name) for f in struct.fields]
    if any(any(u is producer for u in comp.plan.upstream_steps(n)) and any(a is node for a in ancestors(n))
           for n in runtime_steps(comp.graph)):
        # read by a keyed step: each record's event time goes with it (Flink: the record's or timer's)
        columns += [F.col(c) for c in HIDDEN if c in df.columns]
        up = comp.frames[id(producer)]
        return Frame(df.select(*columns), up.time)
    return Frame(df.select(*columns), None)
