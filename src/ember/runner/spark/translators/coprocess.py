"""Two connected keyed streams into one KeyedCoProcessFunction, on Ember's keyed runtime.

Both streams are unioned into rows of one shape (ember.coprocess: which stream, the
keys under shared names, each stream's fields under its own prefix) and run as one
keyed step, so state and timers of a key are shared by both inputs. With event time,
each stream gets its own watermark (its own strategy, set on its own column before the
union): Spark's watermark is then the least of the two, as Flink's two-input operators
take the least of their inputs'. The rows reach the keyed runtime with their event time
in ms, and the runtime decides about late rows, as for one input.

A keyed stream connected with a broadcast stream runs the same way, except that every
broadcast row goes to every state bucket (keyed/broadcast.py).
"""

from __future__ import annotations

from typing import Any, Callable

from pyspark.sql import functions as F
from pyspark.sql import types as T

from ember.coprocess import INPUT, CoProcessAdapter, field_column, key_column
from ember.errors import PipelineError
from ember.graph.nodes import BroadcastProcessNode, CoProcessNode, IntervalJoinNode, KeyByNode, WindowJoinNode
from ember.runner.spark.compilation import Compilation, Frame, translates
from ember.runner.spark.deadletters import read_dead_letters
from ember.runner.spark.keyed.broadcast import BROADCAST_INPUT, FIRST, KEYED_INPUT, BroadcastAdapter, UnkeyedBroadcast
from ember.runner.spark.keyed.intervaljoin import IntervalJoinFunction
from ember.runner.spark.keyed.runtime import HIDDEN, PRE, without_hidden
from ember.runner.spark.keyed.windowjoin import window_join_function
from ember.runner.spark.pickling import ship_by_value
from ember.runner.spark.translators.eventtime import TIME, own_watermark
from ember.runner.spark.translators.keyed import BUCKET, LaneInputs, bucket_of, chained, keyed_input, keyed_operator
from ember.runner.spark.translators.python_ops import output_struct, pair_records
from ember.runner.spark.translators.transforms import check_paired_keys, column
from ember.time.watermarks import TimeCharacteristic

__all__ = ["keyed_interval_join", "joined_pairs"]

ROW_KEY = "__ember_row_key"  # a non-keyed stream's rows on a broadcast step: a hash of the record


def _event_time(node: Any, ups: list[Frame], what: str, required: bool = False) -> bool:
    """Whether both inputs have event time (``required``: else a PipelineError), or neither."""
    timed = [up.time is not None and up.time.characteristic is TimeCharacteristic.EVENT_TIME for up in ups]
    if timed[0] != timed[1]:
        raise PipelineError(
            f"{what}: one stream has event time and the other has not; give both sources a WatermarkStrategy "
            "with a timestamp field (or neither, for processing time)", node.name,
        )
    if required and not timed[0]:
        raise PipelineError(f"{what} needs event time on both streams: give their sources a WatermarkStrategy "
                            "with a timestamp field", node.name)
    return timed[0]


def _rows(comp: Compilation, node: Any, up: Frame, stream: int, keys: tuple[str, ...], key_types: list[Any],
          structs: list[Any], event_time: bool, input_value: int) -> tuple[Any, list[Any]]:
    """``up``'s rows in the union's shape: its input value, the key columns (null without
    ``keys``), every stream's fields (the others' null) and, with event time, TIME — and,
    when one input is a keyed step's output (a chain, docs/design/dataflow.md), PRE.

    An input from a source gets its own watermark here; one from a keyed step carries each
    row's event time (TIME) and PRE flag already, and its watermark is its source's, set
    before that step: Spark's watermark is the least of the two either way."""
    df = up.df
    mark = f"__ember_watermark_of_{stream}"
    after_step = chained(comp, node, event_time)
    from_step = after_step and TIME in df.columns  # (a keyed step's rows, or a SQL step's: translators/sql.py)
    if event_time and not from_step:
        assert up.time is not None
        df, own_time = own_watermark(comp, df, up.time, node.name, mark, keys)
    key_values = [F.col(keys[i]) if keys else F.lit(None).cast(t) for i, t in enumerate(key_types)]
    columns = [value.alias(name) for name, value in _record_columns(stream, key_values, structs, input_value)]
    if from_step:
        columns += [F.col(TIME), F.col(PRE)]
    elif event_time:
        columns.append(own_time)
        if after_step:  # the other input's rows: none was emitted ahead of an upstream watermark
            columns.append(F.lit(False).alias(PRE))
    return df, columns


def _record_columns(stream: int, keys: list[Any], structs: list[Any], input_value: int) -> list[tuple[str, Any]]:
    """A record of input ``stream`` in the two-input step's row shape, as (name, expression)
    pairs: its input value, the ``keys`` under shared names, every input's fields under that
    input's prefix (the other input's null)."""
    columns = [(INPUT, F.lit(input_value))]
    columns += [(key_column(i), key) for i, key in enumerate(keys)]
    for other, struct in enumerate(structs, start=1):
        for f in struct.fields:
            columns.append((field_column(other, f.name), F.col(f.name) if other == stream else F.lit(None).cast(f.dataType)))
    return columns


def _connected(comp: Compilation, node: Any, what: str, fn: Callable[[list[Any]], Any],
               out: Callable[[list[Any]], T.StructType], paired: tuple[tuple[str, ...], tuple[str, ...]] | None = None,
               timed_only: bool = False) -> tuple[Frame, list[Any]]:
    """Both keyed inputs of ``node`` as one keyed step running ``fn(structs)`` (a
    KeyedCoProcessFunction) with output type ``out(structs)``; with the inputs' record types.
    ``paired``: each input's key fields (default: a co-process step's ``keys``, ``other_keys``);
    ``timed_only``: the step needs event time on both inputs."""
    first_keys, second_keys = paired or (node.keys, node.other_keys)
    ups = [comp.frame(k.inputs[0] if isinstance(k, KeyByNode) else k) for k in node.inputs]
    structs = [without_hidden(up.df.schema) for up in ups]
    check_paired_keys(node.name, ("first", structs[0], first_keys), ("second", structs[1], second_keys))
    event_time = _event_time(node, ups, what, required=timed_only)
    key_types = [structs[0][k].dataType for k in first_keys]
    adapter = CoProcessAdapter(fn(structs), structs[0].names, structs[1].names)
    keys = tuple(key_column(i) for i in range(len(first_keys)))
    paired_keys = (first_keys, second_keys)
    fanned = comp.plan.lane_inputs(node)
    if fanned:  # a lane of a fan-out: the fanned-out inputs' rows are made there (translators/fanout.py)
        shapes = [_shape(comp, node, k + 1, [F.col(c) for c in paired_keys[k]], structs, event_time, k + 1) for k in fanned]
        if len(fanned) == 2:
            inputs = LaneInputs(shapes[0], None, second=shapes[1])
            like = _shaped_like(ups[0].df, shapes[0])
        else:
            other = 1 - fanned[0]
            df, columns = _rows(comp, node, ups[other], other + 1, paired_keys[other], key_types, structs, event_time,
                                other + 1)
            inputs = LaneInputs(shapes[0], df.select(*columns))
            like = inputs.other
        frame = keyed_operator(comp, node, Frame(like, ups[0].time), keys, adapter, out(structs), event_time,
                               timed=event_time, dead_letter=read_dead_letters(comp, node), lane_inputs=inputs)
        return frame, structs
    rows = []
    for stream, (up, keys_) in enumerate(zip(ups, paired_keys), start=1):
        df, columns = _rows(comp, node, up, stream, keys_, key_types, structs, event_time, stream)
        rows.append(df.select(*columns))
    union = rows[0].unionByName(rows[1])
    frame = keyed_operator(comp, node, Frame(union, ups[0].time), keys, adapter, out(structs), event_time, timed=event_time,
                           dead_letter=read_dead_letters(comp, node))
    return frame, structs


def _shaped_like(df: Any, shape: tuple[tuple[str, Any], ...]) -> Any:
    """A frame of a lane's row shape (for its columns and types only: never run), from ``df``,
    the records of one of its inputs — whose event time may be set only where the fan-out is."""
    return df.select(*[(F.lit(None).cast("bigint") if name == TIME and TIME not in df.columns else expr).alias(name)
                       for name, expr in shape if name != PRE or PRE in df.columns])


def _shape(comp: Compilation, node: Any, stream: int, keys: list[Any], structs: list[Any], event_time: bool,
           input_value: int) -> tuple[tuple[str, Any], ...]:
    """A lane's rows from the input that reads the fan-out (``stream``): the columns ``_rows``
    gives such an input, as (name, expression) pairs over its records — which carry their
    event time as ``TIME`` already (and ``PRE`` after a keyed step), set before the fan-out."""
    shape = _record_columns(stream, keys, structs, input_value)
    if event_time:
        shape.append((TIME, F.col(TIME)))
        if chained(comp, node, event_time):
            shape.append((PRE, F.col(PRE)))
    return tuple(shape)


@translates(CoProcessNode)
def _co_process(comp: Compilation, node: CoProcessNode) -> Frame:
    return _connected(comp, node, "connect", lambda structs: node.fn,
                      lambda structs: output_struct(node.output_schema, None, node.name))[0]


@translates(WindowJoinNode)
def _window_join(comp: Compilation, node: WindowJoinNode) -> Frame:
    """A co-process step (keyed/windowjoin.py) emitting each pair."""
    dead = read_dead_letters(comp, node)
    return joined_pairs(comp, node, "join", lambda pair: window_join_function(node.assigner, node.how, pair, dead),
                        node.join_fn, node.exprs, timed_only=not node.assigner.processing_time)


def keyed_interval_join(comp: Compilation, node: IntervalJoinNode) -> Frame:
    """An interval join as a co-process step (keyed/intervaljoin.py): where another stateful
    step comes before or after it (planner: ``native_join``)."""
    dead = read_dead_letters(comp, node)
    return joined_pairs(comp, node, "interval_join",
                        lambda pair: IntervalJoinFunction(node.lower_ms, node.upper_ms, node.how, pair, dead),
                        node.fn, node.exprs, (node.left_keys, node.right_keys), timed_only=True)


def joined_pairs(comp: Compilation, node: Any, what: str, function: Callable[[Callable[[Any, Any], list[Any]]], Any],
                 join_fn: Callable[[Any, Any], Any] | None, exprs: tuple[Any, ...],
                 paired: tuple[tuple[str, ...], tuple[str, ...]] | None = None, timed_only: bool = False) -> Frame:
    """A join's pairs from the co-process step ``function(pair)``: through ``join_fn`` (rows of
    ``node.output_schema``) or, for ``select``, as both records' fields side by side, then
    projected over ``left``/``right`` (``exprs``; none: every field, the right side's renamed
    ``right_<field>`` where the left has the name); ``paired``, ``timed_only``: as ``_connected``."""
    if join_fn is not None:
        out = output_struct(node.output_schema, None, node.name)
        ship_by_value(join_fn)
        pair = pair_records(join_fn, out.names, node.name)
        return _connected(comp, node, what, lambda structs: function(pair), lambda structs: out, paired, timed_only)[0]
    present = ("__ember_has_left", "__ember_has_right")

    def flat_out(structs: list[Any]) -> T.StructType:
        flat = [T.StructField(field_column(side, f.name), f.dataType)
                for side, struct in enumerate(structs, start=1) for f in struct.fields]
        return T.StructType(flat + [T.StructField(p, T.BooleanType()) for p in present])

    def make(structs: list[Any]) -> Any:
        names = [s.names for s in structs]

        def pair(left: Any, right: Any) -> list[Any]:  # both records' fields side by side, and which are there
            values = [None] * len(names[0]) if left is None else [left[f] for f in names[0]]
            values += [None] * len(names[1]) if right is None else [right[f] for f in names[1]]
            return [(*values, left is not None, right is not None)]

        return function(pair)

    frame, structs = _connected(comp, node, what, make, flat_out, paired, timed_only)
    fields = [s.names for s in structs]

    def view(frame: Frame) -> Frame:
        df = frame.df
        hidden = [F.col(c) for c in df.columns if c in HIDDEN]
        records = [
            F.when(F.col(flag), F.struct(*[F.col(field_column(side, f)).alias(f) for f in names])).alias(label)
            for side, (label, names, flag) in enumerate(zip(("left", "right"), fields, present), start=1)
        ]
        joined = df.select(*records, *hidden)
        if exprs:
            return Frame(joined.select(*[column(e) for e in exprs], *hidden), frame.time)
        left, right = fields
        renamed = [F.col(f"right.{f}").alias(f"right_{f}" if f in left else f) for f in right]
        return Frame(joined.select(*[F.col(f"left.{f}").alias(f) for f in left], *renamed, *hidden), frame.time)

    if comp.plan.lane(node):  # its operator's rows reach the branches after the fan-out's split: the view goes there
        comp.lane_views[id(node)] = view
    return view(frame)


@translates(BroadcastProcessNode)
def _broadcast_process(comp: Compilation, node: BroadcastProcessNode) -> Frame:
    """Keyed rows go to their key's bucket, every broadcast row to every bucket (each bucket
    keeps a copy of the broadcast state; keyed/broadcast.py), bucket 0's copy marked FIRST.
    A non-keyed stream's rows are keyed by a hash of the whole record: placement only (its
    function has no keyed state), spread over the buckets."""
    ups = [keyed_input(comp, node, node.keys), comp.frame(node.inputs[1])]
    structs = [without_hidden(up.df.schema) for up in ups]
    event_time = _event_time(node, ups, "connect with a broadcast stream")
    row_keys = node.keys
    row_key = F.xxhash64(*[F.col(f) for f in structs[0].names])  # a non-keyed stream's placement
    if not row_keys:
        row_keys = (ROW_KEY,)
        ups[0] = Frame(ups[0].df.withColumn(ROW_KEY, row_key), ups[0].time)
    key_types = [ups[0].df.schema[k].dataType for k in row_keys]
    keys = tuple(key_column(i) for i in range(len(row_keys)))
    df, columns = _rows(comp, node, ups[1], 2, (), key_types, structs, event_time, BROADCAST_INPUT)
    copies = df.select(*columns, F.explode(F.sequence(F.lit(0), F.lit(comp.buckets - 1))).alias(BUCKET))
    copies = copies.withColumn(FIRST, F.col(BUCKET) == 0)
    fn = node.fn if node.keys else UnkeyedBroadcast(node.fn)
    adapter = BroadcastAdapter(fn, structs[0].names, structs[1].names, node.descriptors)
    out = output_struct(node.output_schema, None, node.name)
    if comp.plan.lane_inputs(node):  # a lane of a fan-out, its keyed input the fanned-out rows (fanout.py)
        key_exprs = [F.col(k) for k in node.keys] if node.keys else [row_key]
        shape = _shape(comp, node, 1, key_exprs, structs, event_time, KEYED_INPUT) + ((FIRST, F.lit(False)),)
        inputs = LaneInputs(shape, copies, BUCKET)
        return keyed_operator(comp, node, Frame(copies.drop(BUCKET), ups[0].time), keys, adapter, out, event_time,
                              timed=event_time, tie_break=INPUT, dead_letter=read_dead_letters(comp, node),
                              lane_inputs=inputs)
    df, columns = _rows(comp, node, ups[0], 1, row_keys, key_types, structs, event_time, KEYED_INPUT)
    events = df.select(*columns, F.lit(False).alias(FIRST)).withColumn(BUCKET, bucket_of(keys, comp.buckets))
    union = events.unionByName(copies)
    return keyed_operator(comp, node, Frame(union, ups[0].time), keys, adapter, out, event_time, timed=event_time,
                          tie_break=INPUT, dead_letter=read_dead_letters(comp, node))
