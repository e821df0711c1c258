"""A fan-out: the keyed steps reading one keyed step's output, as lanes of one operator.

Or reading one stream before any keyed step (``FanOut.root``): its rows get their event time
once, at the stem, and every lane reads them as the first step of a chain reads a source's.

The planner (fan_out_plan.FanOut) finds the step (``source``) and its readers. Here
``source``'s rows go to every lane that reads them (``explode``), each lane's
filters apply to its own rows only, each row gets its lane's state bucket offset by
the lane (``lane * buckets + pmod(xxhash64(keys), buckets)``, ``max_parallelism`` buckets: the bucket
the step would have alone), and the rows are packed per group and run by one
``transformWithStateInPandas`` operator (keyed/lanes.py). Each lane is translated by
its own translator (translators/keyed.py), which hands over its parts instead of an
operator (``Lane``). Keyed steps reading the lanes run as further levels, each one more
shared operator over the level before's rows (which pass it packed). The job splits after
the last operator: :class:`FannedOut` gives each branch its lane's rows back, level by level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.state import GroupStateTimeout

from ember.errors import PipelineError
from ember.graph.nodes import (
    FilterNode,
    FlatMapNode,
    KeyByNode,
    LookupJoinNode,
    MapBatchesNode,
    MapNode,
    Node,
    SelectNode,
    SideOutputNode,
)
from ember.runner.spark.compilation import Compilation, Frame
from ember.runner.spark.fan_out_plan import FanOut, Level
from ember.runner.spark.keyed.lanes import LANE, LanesProcessor, lane_column
from ember.runner.spark.keyed.packing import PACKED_ROWS, packer, unpacking
from ember.runner.spark.keyed.runtime import SIDE_PREFIX, TAG, side_column, without_hidden
from ember.runner.spark.keyed.tws import BucketProcessor
from ember.runner.spark.placement import dead_letters_of
from ember.runner.spark.translators.eventtime import ANCHOR, HIDDEN, keep_late_rows, restore_anchor, with_event_time
from ember.runner.spark.translators.keyed import BUCKET, bucket_of, initial_state
from ember.runner.spark.translators.python_ops import lane_map, lane_map_batches, python_filter
from ember.runner.spark.translators.transforms import column, lane_lookup, lane_select

__all__ = ["FannedOut", "fan_out"]


@dataclass(frozen=True)
class FannedOut:
    """One level's shared operator: its rows (``frame``), the column its rows name their lane
    in (``lane``), and per lane (then the pass-through) the seed of the split it gives, its
    output columns and notion of time; ``through``: the rows the pass-through lane carries
    packed (their record type), or None; ``before``: the level before, whose rows those are."""

    frame: Frame
    lane: str
    seeds: tuple[Node, ...]
    columns: tuple[tuple[str, ...], ...]
    times: tuple[Any, ...]
    through: Any
    lanes: tuple[Node, ...]  # every level's lanes (counted per batch in their branches: nowhere else)
    before: "FannedOut | None" = None

    def branches(self, rows: Any) -> list[tuple[Node, Frame]]:
        """Each seed's rows (one micro-batch of the operator's, or its streaming rows) under
        their own names — the levels before this one's included, unpacked from its pass-through."""
        out = []
        for i, (node, cols, time) in enumerate(zip(self.seeds, self.columns, self.times)):
            shown = [c for c in cols if c not in HIDDEN]  # (what only a next level's lane reads stays here)
            df = rows.filter(F.col(self.lane) == F.lit(i)).select(*[F.col(lane_column(i, c)).alias(c) for c in shown])
            if self.through is not None and i == len(self.seeds) - 1:
                df = df.mapInArrow(_unpacker(self.through.names), self.through)
                if self.before is not None:  # the level before's rows
                    out += self.before.branches(df)
                    continue
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
    """The fan-out's shared operators, level by level; the last one's rows end the query."""
    comp.frame(fan.stem)
    main = comp.frames[id(fan.stem)]
    base = comp.tagged.get(id(fan.stem)) or main
    for lane in (lane for level in fan.levels for lane in level):
        comp.frame(lane)  # translates it: keyed.py keeps its parts in comp.lanes
    lanes = [comp.lanes[id(lane)] for lane in fan.lanes]
    event_time = lanes[0].event_time
    for lane in [comp.lanes[id(lane)] for level in fan.levels for lane in level]:
        if lane.event_time != event_time or (event_time and lane.timeout == GroupStateTimeout.ProcessingTimeTimeout):
            raise PipelineError(
                f"'{lane.node.name}' runs on {'event' if lane.event_time else 'processing'} time and '{lanes[0].node.name}' "
                f"on {'event' if event_time else 'processing'} time; the steps after '{fan.source.name}' share "
                "operators, which run on one notion of time", lane.node.name,
            )
    if comp.config.state_backend != "rocksdb":
        raise PipelineError("a job with several keyed steps runs them on Spark's transformWithStateInPandas, which needs "
                            "state_backend='rocksdb'", fan.lanes[0].name)
    n = len(lanes)
    fields = without_hidden(main.df.schema).names  # the records the lanes read
    through_columns = [c for c in base.df.columns if c not in HIDDEN]
    # Which output of the stem each lane reads: its main output (None) or a side output's tag.
    # A two-input lane reading the stem on both inputs gets a second copy of a row for its second
    # input, under a lane number of its own past the pass-through's (``ids``) until its row shape is made.
    # A lane reading the stem through a union of several paths gets a copy of a row per further
    # path, numbered the same way (merged into the lane's records once their steps ran).
    extra = [*fan.second, *fan.unions]
    paths = list(fan.paths) + [path for _, path in extra]
    ids = list(range(n)) + [n + 1 + m for m in range(len(extra))]
    reads = [path[0].tag.name if path and isinstance(path[0], SideOutputNode) else None for path in paths]
    passing = [F.lit(n)] if fan.through else []

    def copies(tag: str | None) -> Any:
        return F.array(*[F.lit(i) for i, read in zip(ids, reads) if read == tag], *passing).cast("array<int>")

    lanes_of_row = copies(None)
    if TAG in base.df.columns:  # a side output's rows: the lanes reading it, and the pass-through lane
        lanes_of_row = F.when(F.col(TAG).isNull(), lanes_of_row)
        for tag in sorted({t for t in reads if t is not None}):
            lanes_of_row = lanes_of_row.when(F.col(TAG) == F.lit(tag), copies(tag))
        lanes_of_row = lanes_of_row.otherwise(F.array(*passing).cast("array<int>"))
    rows = base.df
    if fan.root and event_time and base.time is not None:  # event time once, before the rows are copied per lane
        rows = keep_late_rows(with_event_time(comp, rows, base.time, fan.stem.name))
    df = rows.withColumn(LANE, F.explode(lanes_of_row))
    # Each output's records: its columns -> their fields (a side output's are side columns).
    records = {tag: ({f: f for f in fields} if tag is None else
                     {side_column(tag, f): f for f in comp.side_types[id(fan.stem)][tag].names}) for tag in set(reads)}
    heads, tails = zip(*(_head_and_tail(path) for path in paths))
    df = _filters(df, heads, reads, records, comp, ids)
    seconds: dict[int, tuple[int, dict[str, str]]] = {}  # lane -> its second input's copies (lane number, records)
    for m, (i, _) in enumerate(fan.second):
        v, tag, tail = ids[n + m], reads[n + m], tails[n + m]
        renamed = records[tag]
        if tail:
            df, renamed = _lane_steps(comp, df, tail, LANE, v, renamed, f"__ember_mapped0_{v}_")
        seconds[i] = (v, renamed)
    merged: dict[int, list[tuple[int, dict[str, str]]]] = {}  # lane -> its union copies (lane number, records)
    for m, (i, _) in enumerate(fan.unions, start=len(fan.second)):
        v, tag, tail = ids[n + m], reads[n + m], tails[n + m]
        renamed = records[tag]
        if tail:
            df, renamed = _lane_steps(comp, df, tail, LANE, v, renamed, f"__ember_mapped0_{v}_")
        merged.setdefault(i, []).append((v, renamed))
    keys: list[tuple[str, ...]] = []
    names: list[dict[str, str] | None] = []
    placed: list[str | None] = []  # per lane: a column placing some of its rows in a bucket of their own
    for i, (lane, tag, tail) in enumerate(zip(lanes, reads, tails)):
        renamed = records[tag]
        if tail:  # the lane's own steps from its first that is no filter on: on its rows only
            df, renamed = _lane_steps(comp, df, tail, LANE, i, renamed, f"__ember_mapped0_{i}_")
        if i in merged:  # a union's paths: each copy's records into columns of the lane's own
            df, renamed = _merge_copies(df, LANE, i, renamed, merged[i], lane.node.name, f"__ember_union0_{i}_")
            placed.append(None)
            keys.append(_key_columns(lane, renamed))
            names.append(renamed)
            continue
        if lane.inputs is not None:  # a two-input step: its rows from these records, and its other input's
            df, lane_keys, lane_names, bucket = _two_input_lane(df, LANE, i, lane, renamed, second=seconds.get(i))
            keys.append(lane_keys)
            names.append(lane_names)
            placed.append(bucket)
            continue
        placed.append(None)
        if tail:
            keys.append(_key_columns(lane, renamed))
            names.append(renamed)
            continue
        keys.append(lane.keys if tag is None else tuple(side_column(tag, k) for k in lane.keys))
        names.append(None if tag is None else records[tag])
    through = T.StructType([f for f in base.df.schema.fields if f.name in through_columns]) if fan.through else None
    times = [comp.frames[id(lane)].time for lane in fan.lanes] + ([base.time] if fan.through else [])
    level = _operator(comp, df, LANE, lanes, keys, names, through, event_time, fan.seeds, times, fan.levels, None, placed)
    for k, after in enumerate(fan.after, start=1):
        level = _next_level(comp, level, k, after, event_time, fan.levels)
    return level


def _next_level(comp: Compilation, before: FannedOut, k: int, after: Level, event_time: bool,
                levels: tuple[tuple[Node, ...], ...]) -> FannedOut:
    """Level ``k``'s operator: its lanes read lanes of the level ``before``, whose rows all pass
    it packed (the branches after the split unpack them)."""
    lane = f"{LANE}_{k}"
    rows = before.frame.df
    n = len(after.lanes)
    lanes = [comp.lanes[id(node)] for node in after.lanes]
    # A two-input lane reading two lanes of the level before gets a copy of the second one's rows
    # under a lane number of its own past the pass-through's until its row shape is made.
    # A lane reading the level before through a union gets a copy per further path, likewise.
    extra = [*after.second, *after.unions]
    reads = list(after.reads) + [read for _, read, _ in extra]
    copies = []
    for i, (j, tag) in enumerate(reads):
        reading = F.col(before.lane) == F.lit(j)
        has_tag = lane_column(j, TAG) in rows.columns
        if has_tag:
            which = F.col(lane_column(j, TAG))
            reading = reading & (which.isNull() if tag is None else which == F.lit(tag))
        number = i if i < n else i + 1
        copies.append(F.when(reading, F.array(F.lit(number))).otherwise(F.array().cast("array<int>")))
    df = rows.withColumn(lane, F.explode(F.concat(*copies, F.array(F.lit(n)))))
    seconds: dict[int, tuple[int, dict[str, str]]] = {}  # lane -> its second input's copies (lane number, records)
    for m, (i, (j, tag), own) in enumerate(after.second):
        v = n + 1 + m
        df, renamed = _level_records(comp, df, before, lane, v, j, tag, own, f"__ember_mapped{k}_{v}_")
        seconds[i] = (v, renamed)
    merged: dict[int, list[tuple[int, dict[str, str]]]] = {}  # lane -> its union copies (lane number, records)
    for m, (i, (j, tag), own) in enumerate(after.unions, start=len(after.second)):
        v = n + 1 + m
        df, renamed = _level_records(comp, df, before, lane, v, j, tag, own, f"__ember_mapped{k}_{v}_")
        merged.setdefault(i, []).append((v, renamed))
    keys: list[tuple[str, ...]] = []
    names: list[dict[str, str] | None] = []
    placed: list[str | None] = []
    for i, (node, (j, tag), own) in enumerate(zip(lanes, after.reads, after.steps or [()] * n)):
        df, renamed = _level_records(comp, df, before, lane, i, j, tag, own, f"__ember_mapped{k}_{i}_")
        if i in merged:  # a union's paths: each copy's records into columns of the lane's own
            df, renamed = _merge_copies(df, lane, i, renamed, merged[i], node.node.name, f"__ember_union{k}_{i}_")
        if node.inputs is not None:  # a two-input step: its rows from these records, and its other input's
            df, lane_keys, lane_names, bucket = _two_input_lane(df, lane, i, node, renamed, f"__ember_in{k}_{i}_",
                                                                second=seconds.get(i))
            keys.append(lane_keys)
            names.append(lane_names)
            placed.append(bucket)
            continue
        placed.append(None)
        keys.append(_key_columns(node, renamed))
        names.append(renamed)
    through = T.StructType([f for f in rows.schema.fields if f.name != ANCHOR])
    seeds = after.lanes + (before.seeds[0],)  # the last seed stands for the level before (its rows)
    times = [comp.frames[id(node)].time for node in after.lanes] + [None]
    return _operator(comp, df, lane, lanes, keys, names, through, event_time, seeds, times, levels, before, placed)


def _merge_copies(df: Any, lane: str, i: int, renamed: dict[str, str], copies: list[tuple[int, dict[str, str]]],
                  name: str, prefix: str) -> tuple[Any, dict[str, str]]:
    """Lane ``i``'s rows from a union of paths: its own copies' records (``renamed``: columns ->
    fields) and each further copy's (``copies``: its lane number and records), in columns of the
    lane's own (``prefix``), every copy numbered lane ``i`` from then on."""
    out: dict[str, str] = {}
    for column_, field in renamed.items():
        value: Any = None
        for v, theirs in copies:
            other = next((c for c, f in theirs.items() if f == field), None)
            if other is None:
                raise PipelineError(f"the union before '{name}' merges rows without the field '{field}' "
                                    f"(one path has: {', '.join(sorted(theirs.values()))})", name)
            when = F.col(lane) == F.lit(v)
            value = F.when(when, F.col(other)) if value is None else value.when(when, F.col(other))
        df = df.withColumn(prefix + field, value.otherwise(F.col(column_)))
        out[prefix + field] = field
    numbers = [F.lit(v) for v, _ in copies]
    df = df.withColumn(lane, F.when(F.col(lane).isin(*numbers), F.lit(i)).otherwise(F.col(lane)).cast("int"))
    return df, out


def _level_records(comp: Compilation, df: Any, before: FannedOut, lane: str, i: int, j: int, tag: str | None,
                   own: tuple[Node, ...], prefix: str) -> tuple[Any, dict[str, str]]:
    """The records copy ``i`` of a level reads from lane ``j`` of the level ``before`` (its main
    output, or the side output ``tag``): the columns holding them -> their fields, after the
    copy's ``own`` steps (run on its rows only, writing under ``prefix``)."""
    fields = before.columns[j]
    if tag is None:
        renamed = {lane_column(j, f): f for f in fields if f != TAG and not f.startswith(SIDE_PREFIX)}
    else:
        renamed = {lane_column(j, side_column(tag, f)): f for f in comp.side_types[id(before.seeds[j])][tag].names}
        renamed.update({lane_column(j, h): h for h in HIDDEN if h in fields})
    if own:  # the lane's own steps: on its copies only
        hidden = {c: f for c, f in renamed.items() if f in HIDDEN}
        visible = {c: f for c, f in renamed.items() if f not in HIDDEN}
        df, records = _lane_steps(comp, df, own, lane, i, visible, prefix)
        renamed = {**records, **hidden}
    return df, renamed


def _operator(comp: Compilation, df: Any, lane: str, lanes: list[Any], keys: list[tuple[str, ...]],
              names: list[dict[str, str] | None], through: Any, event_time: bool, seeds: tuple[Node, ...],
              times: list[Any], levels: tuple[tuple[Node, ...], ...], before: FannedOut | None,
              placed: list[str | None] | None = None) -> FannedOut:
    """One shared operator on ``df`` (each row a copy for the lane in column ``lane``; the
    last lane the pass-through when ``through`` is its rows' type): state bucket per copy,
    packing, the lanes' processors (``names``: a lane's columns renamed for it; ``placed``: per
    lane, a column that gives a row its bucket where it is not null — a broadcast stream's
    copies, one per bucket — or None)."""
    n = len(lanes)
    # The pass-through lane keeps no state: its rows go in one group per input partition.
    buckets = comp.buckets
    bucket = F.lit(n * buckets) + F.pmod(F.spark_partition_id(), F.lit(buckets))
    for i in reversed(range(n)):
        own = bucket_of(keys[i], buckets)
        column_ = placed[i] if placed is not None else None
        if column_ is not None:
            own = F.coalesce(F.col(column_), own)
        bucket = F.when(F.col(lane) == F.lit(i), F.lit(i * buckets) + own).otherwise(bucket)
    df = df.withColumn(BUCKET, bucket.cast("int"))
    if event_time:
        df = restore_anchor(df)
    packed = T.StructType([T.StructField(BUCKET, T.IntegerType()), T.StructField(PACKED_ROWS, T.BinaryType())])
    rows = df.mapInArrow(packer(BUCKET, (ANCHOR,)), packed)
    if event_time:
        rows = restore_anchor(rows)
    processors: list[Any] = []
    for parts, renamed in zip(lanes, names):
        call = unpacking(parts.fn if renamed is None else _renamed(parts.fn, renamed))  # fields under their own names
        proc = parts.processor or BucketProcessor(call, [], None)
        proc.call, proc.anchor = call, None  # (design B's processor was made before the call was known)
        processors.append(proc)
    outputs = [[f.name for f in parts.schema.fields if f.name != ANCHOR] for parts in lanes]
    out_fields = [T.StructField(lane, T.IntegerType())]
    for i, parts in enumerate(lanes):
        out_fields += [T.StructField(lane_column(i, f.name), f.dataType) for f in parts.schema.fields if f.name != ANCHOR]
    if through is not None:
        processors.append(None)
        outputs.append([PACKED_ROWS])
        out_fields.append(T.StructField(lane_column(n, PACKED_ROWS), T.BinaryType()))
    schema = T.StructType(out_fields)
    processor = LanesProcessor(processors, outputs, ANCHOR if event_time else None, buckets, lane)
    processor.read(list(rows.columns))
    if event_time:
        schema = schema.add(ANCHOR, T.TimestampType())
        mode = "EventTime"
    else:
        timed = any(parts.timeout == GroupStateTimeout.ProcessingTimeTimeout for parts in lanes)
        mode = "ProcessingTime" if timed else "None"
    result = rows.groupBy(BUCKET).transformWithStateInPandas(
        processor, schema, "Append", mode, initialState=initial_state(comp, [parts.node for parts in lanes]),
        eventTimeColumnName=ANCHOR if event_time else ""
    )
    every = tuple(node for level in levels for node in level)
    return FannedOut(Frame(result, times[0]), lane, seeds, tuple(tuple(c) for c in outputs), tuple(times), through,
                     every, before)


def _two_input_lane(df: Any, lane: str, i: int, parts: Any, records: dict[str, str], prefix: str | None = None,
                    second: tuple[int, dict[str, str]] | None = None) -> tuple[Any, tuple[str, ...], dict[str, str], str | None]:
    """Lane ``i``, a two-input step (translators/coprocess.py: ``parts.inputs``), on ``df``:
    its copies' rows in the step's shape, in columns of the lane's own (``records``: the
    columns holding the records it reads -> their fields), and its other input's rows added
    as rows of this lane only — or, when it reads the fanned-out rows on both inputs
    (``second``: the second input's copies' lane number and records), those copies in the
    second input's shape, numbered lane ``i`` from then on. Returns the frame, the lane's key
    columns, its columns -> the step's names, and the column placing the other input's rows
    in buckets (or None)."""
    prefix = prefix or f"__ember_in0_{i}_"
    inputs = parts.inputs
    named = _named(df, records, True)
    for name, expr in inputs.shape:
        named = named.withColumn(prefix + name, F.when(F.col(lane) == F.lit(i), expr))
    df = _named(named, records, False)
    if second is not None:
        v, second_records = second
        named = _named(df, second_records, True)
        for name, expr in inputs.second:
            named = named.withColumn(prefix + name, F.when(F.col(lane) == F.lit(v), expr).otherwise(F.col(prefix + name)))
        df = _named(named, second_records, False)
        df = df.withColumn(lane, F.when(F.col(lane) == F.lit(v), F.lit(i)).otherwise(F.col(lane)).cast("int"))
    bucket = None
    if inputs.other is not None:
        other = [F.lit(i).cast("int").alias(lane), *[F.col(name).alias(prefix + name) for name, _ in inputs.shape]]
        if inputs.bucket is not None:
            bucket = prefix + BUCKET
            other.append(F.col(inputs.bucket).cast("int").alias(bucket))
            df = df.withColumn(bucket, F.lit(None).cast("int"))
        df = df.unionByName(inputs.other.select(*other), allowMissingColumns=True)
    return df, tuple(prefix + k for k in parts.keys), {prefix + name: name for name, _ in inputs.shape}, bucket


def _renamed(run: Any, names: dict[str, str]) -> Any:
    """Bucket function ``run`` reading a side output's rows: their columns renamed by ``names``
    (side column -> field), the main output's columns of the same names dropped first."""

    def call(key: Any, frames: Any, state: Any) -> Any:
        def named() -> Any:
            for pdf in frames:
                yield pdf.drop(columns=[c for c in names.values() if c in pdf.columns]).rename(columns=names)

        return run(key, named(), state)

    return call


def _head_and_tail(path: tuple[Node, ...]) -> tuple[list[Node], list[Node]]:
    """A first-level lane's own steps (``key_by`` and the side output it reads left out),
    split where the first that is no filter stands (a map, a lookup...: it reshapes the
    records): the filters before it, which lanes may share (:func:`_filters`), and the rest,
    its own."""
    own = [s for s in path if not isinstance(s, KeyByNode | SideOutputNode)]
    first = next((j for j, s in enumerate(own) if not isinstance(s, FilterNode)), len(own))
    return own[:first], own[first:]


def _filters(df: Any, heads: tuple[list[Node], ...], reads: list[str | None], records: dict[str | None, dict[str, str]],
             comp: Compilation, ids: list[int]) -> Any:
    """``df`` with each filter of the lanes' ``heads`` (the filters before a lane's first map)
    applied once, to the rows of the lanes it is on (``ids``: each head's lane number), to the
    records of the output they read (``records``: its columns -> their fields)."""
    done: list[Node] = []
    for step in (s for head in heads for s in head):
        if any(step is d for d in done):
            continue
        done.append(step)
        on = [k for k, head in enumerate(heads) if any(step is s for s in head)]
        users = [ids[k] for k in on]
        named = records[reads[on[0]]]  # (every user of a filter reads the one output it follows)
        df, _ = _on_lanes(comp, _named(df, named, True), step, LANE, users, list(named.values()))
        df = _named(df, named, False)
    return df


def _lane_steps(comp: Compilation, df: Any, steps: Any, lane: str, i: int, renamed: dict[str, str],
                prefix: str) -> tuple[Any, dict[str, str]]:
    """Lane ``i``'s own ``steps`` (fan_out_plan.LANE_STEPS), in order, on its copies
    only (in column ``lane``), the other lanes' rows passing. ``renamed``: the columns holding
    its records -> their fields. Each reshaping step writes its records into columns of its own
    (``prefix`` and its place); the lane's earlier ones are dropped. Returns the frame and the
    lane's columns -> fields after the steps."""
    for s, step in enumerate(steps):
        df, mapped = _on_lanes(comp, _named(df, renamed, True), step, lane, [i], list(renamed.values()), f"{prefix}{s}_")
        df = _named(df, renamed, False)
        if isinstance(step, FilterNode):
            continue
        spent = [c for c in renamed if c.startswith(prefix)]  # this lane's records of an earlier step
        renamed = {f"{prefix}{s}_{f}": f for f in mapped}
        df = df.drop(*spent) if spent else df
    return df, renamed


def _key_columns(lane: Any, renamed: dict[str, str]) -> tuple[str, ...]:
    """The columns of ``renamed`` (column -> field) holding the key fields of ``lane`` (a
    keyed step's ``translators.keyed.Lane``)."""
    keys = []
    for key in lane.keys:
        column_ = next((c for c, f in renamed.items() if f == key), None)
        if column_ is None:
            name = lane.node.name
            raise PipelineError(f"'{name}' keys by '{key}', a field its input does not have (it has: "
                                f"{', '.join(f for f in renamed.values() if f not in HIDDEN)})", name)
        keys.append(column_)
    return tuple(keys)


def _on_lanes(comp: Compilation, df: Any, step: Node, lane: str, users: list[int], fields: list[str],
              prefix: str = "") -> tuple[Any, list[str]]:
    """A lane's own ``step`` on the rows of lanes ``users`` (in column ``lane``), the others
    passing: a filter (no fields of its own: ``[]``), or a map / flat_map / select / lookup /
    map_batches writing its records into columns ``prefix + field`` (and its fields). ``fields``:
    the records' fields, columns of ``df`` under those names. A step's dead letters go to its
    detour's spool."""
    spool = None
    if dead_letters_of(step) is not None:  # they leave the query beside it (planner.py, spool.py)
        spool = comp.detoured.get(id(step))
        if spool is None:  # (the planner detours every such step's dead letters: not reached)
            raise PipelineError("its dead letters have no detour on this lane's path", step.name)
    if isinstance(step, FilterNode):
        if step.is_python:
            return python_filter(comp, df, step, (lane, users, fields), spool), []
        return df.filter(~F.col(lane).isin(users) | column(step.predicate)), []
    if isinstance(step, SelectNode):
        return lane_select(df, step, (lane, users[0], fields), prefix)
    if isinstance(step, LookupJoinNode):
        return lane_lookup(comp, df, step, (lane, users[0], fields), prefix, spool)
    if isinstance(step, MapBatchesNode):
        return lane_map_batches(df, step, (lane, users[0], fields), prefix, spool)
    assert isinstance(step, MapNode | FlatMapNode)
    return lane_map(df, step, (lane, users[0], fields), prefix, spool)


ASIDE = "__ember_aside_"


def _named(df: Any, renamed: dict[str, str], on: bool) -> Any:
    """``df`` with the columns of ``renamed`` (column -> field) under their fields' names,
    columns already of those names set aside (``on``), or back as they were (not ``on``) —
    so a lane's filter or map, written on the records' fields, reads the lane's columns.
    A column already under its field's name stays."""
    steps = []
    for col, name in renamed.items():
        if col == name:
            continue
        aside, own = (name, ASIDE + name), (col, name)
        steps += [aside, own] if on else [own[::-1], aside[::-1]]
    for old, new in steps:
        if old in df.columns:
            df = df.withColumnRenamed(old, new)
    return df
