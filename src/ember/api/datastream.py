"""DataStream, KeyedStream and WindowedStream: declare steps, build the graph.

Nothing here runs anything: every method adds a node to the pipeline graph and
returns a new stream. Arguments are checked here, when the step is declared.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, TypeVar

from ember.api.broadcast import BroadcastConnectedStream, BroadcastStream, broadcast_descriptors
from ember.api.connected import ConnectedStreams
from ember.api.dead_letters import dead_letter_tag, optional_dead_letter_tag
from ember.api.joins import IntervalJoin, WindowJoin
from ember.connectors.base import Sink
from ember.connectors.external import parse_json_schema
from ember.connectors.sinks import ConsoleSink
from ember.errors import ConfigError, PipelineError
from ember.functions import AggregateFunction, KeyedProcessFunction, OutputTag, ProcessWindowFunction, VectorizedKeyedFunction
from ember.graph import nodes as n
from ember.graph.graph import Graph
from ember.graph.nodes import is_plain_window
from ember.rolling import EMIT_MODES, RollingField, RollingReduce
from ember.runner.spark.planner import physical_notes
from ember.time.durations import to_ms
from ember.windowing.aggregates import Agg, Aggregate
from ember.windowing.assigners import GlobalWindows, WindowAssigner
from ember.windowing.evictors import CountEvictor, Evictor
from ember.windowing.triggers import CountTrigger, PurgingTrigger, Trigger

__all__ = ["DataStream", "KeyedStream", "WindowedStream", "PipelineBuilder"]

N = TypeVar("N", bound=n.Node)

_BATCH_FORMATS = ("arrow", "pandas")
_JOIN_KINDS = ("inner", "left")


def _is_column(obj: Any) -> bool:
    return type(obj).__name__ == "Column"


class PipelineBuilder(Protocol):
    """What a stream needs from the environment that made it (a StreamEnvironment):
    unique step names, and the sinks its next ``execute`` runs."""

    def _step_name(self, name: str | None, prefix: str) -> str: ...

    def _register_sink(self, node: n.SinkNode) -> None: ...

    def _register_view(self, name: str, node: n.Node) -> None: ...


class DataStream:
    """A stream of records with named fields (a Spark schema)."""

    def __init__(self, env: PipelineBuilder, node: n.Node) -> None:
        self._env = env
        self._node = node

    @property
    def node(self) -> n.Node:
        return self._node

    def _add(self, cls: type[N], name: str | None, prefix: str, inputs: Iterable[n.Node] | None = None, **fields: Any) -> N:
        step = self._env._step_name(name, prefix)
        return cls(name=step, inputs=tuple(inputs or (self._node,)), **fields)

    # -- per-record Python ----------------------------------------------------------
    def map(
        self, fn: Callable[[dict], Any], output_schema: Any = None, *, dead_letter: Any = None, name: str | None = None
    ) -> "DataStream":
        """Apply ``fn`` to every record (a dict of field -> value).

        ``fn`` returns a dict, a tuple in ``output_schema`` order, or (one-column
        schemas) a bare value. ``output_schema`` (Spark DDL string or StructType)
        defaults to the input schema. Runs on Arrow batches inside Spark.

        A record ``fn`` raises on (or whose result does not fit the schema) fails
        the job, naming the step, the function and the record — or, with
        ``dead_letter=OutputTag(...)``, goes to that side output (``raw``: the
        record as JSON, ``error``: what happened) and the job goes on.
        """
        _require_callable(fn, "map", name)
        dead = optional_dead_letter_tag(dead_letter, "map dead_letter", name)
        return DataStream(self._env, self._add(n.MapNode, name, "map", fn=fn, output_schema=output_schema, dead_letter=dead))

    def flat_map(
        self, fn: Callable[[dict], Iterable[Any]], output_schema: Any = None, *, dead_letter: Any = None,
        name: str | None = None,
    ) -> "DataStream":
        """Apply ``fn`` to every record; it returns an iterable of zero or more output
        records. ``dead_letter`` as for :meth:`map` (a failing record emits nothing)."""
        _require_callable(fn, "flat_map", name)
        dead = optional_dead_letter_tag(dead_letter, "flat_map dead_letter", name)
        node = self._add(n.FlatMapNode, name, "flat_map", fn=fn, output_schema=output_schema, dead_letter=dead)
        return DataStream(self._env, node)

    def filter(
        self, predicate: str | Any | Callable[[dict], bool], *, dead_letter: Any = None, name: str | None = None
    ) -> "DataStream":
        """Keep the records for which ``predicate`` holds.

        A string (``"event_type = 'view'"``) or a Spark ``Column`` compiles to
        native Spark SQL; a Python callable gets each record as a dict
        (``dead_letter`` as for :meth:`map`).
        """
        if not (isinstance(predicate, str) and predicate.strip()) and not _is_column(predicate) and not callable(predicate):
            raise PipelineError(
                f"filter takes a SQL string, a Spark Column or a callable, got {predicate!r}", name or "filter"
            )
        dead = None
        if dead_letter is not None:
            if not callable(predicate) or _is_column(predicate):
                raise PipelineError("filter: dead_letter is for Python predicates (SQL cannot fail per record)", name or "filter")
            dead = dead_letter_tag(dead_letter, "filter dead_letter", name)
        return DataStream(self._env, self._add(n.FilterNode, name, "filter", predicate=predicate, dead_letter=dead))

    # -- vectorised and native ---------------------------------------------------------
    def map_batches(
        self,
        fn: Callable[[Any], Any],
        output_schema: Any = None,
        *,
        batch_format: str = "arrow",
        dead_letter: Any = None,
        name: str | None = None,
    ) -> "DataStream":
        """Apply ``fn`` to whole batches: a ``pyarrow.RecordBatch`` (``batch_format="arrow"``)
        or a ``pandas.DataFrame`` (``"pandas"``); it returns the same kind (an Arrow
        Table is accepted too). ``output_schema`` defaults to the input schema.

        ``dead_letter=OutputTag(...)``: a batch ``fn`` raises on (or, with Arrow, whose result
        does not fit the output schema) is split in halves and each half called again, down to
        single records; the records ``fn`` fails on alone go to that side output (``raw``: the
        record as JSON, ``error``: why), the others' results go on. So ``fn`` must give each
        record the same result whichever records share its batch (Spark's batching is
        arbitrary anyway). Without it, a failing batch fails the job.

        Between two keyed steps ``fn`` must return one row per input row, in order: row i
        keeps record i's event time (a function returning another number of rows fails the
        job, naming the step). With ``dead_letter`` there, a batch that fails — also by
        returning another number of rows, or (Arrow) rows that do not fit the schema — is
        narrowed down alike, and the other records' rows keep their event time; the dead
        letters must then be read by sinks, not by a stateful step (refused before the job
        starts)."""
        _require_callable(fn, "map_batches", name)
        if batch_format not in _BATCH_FORMATS:
            raise PipelineError(
                f"batch_format must be one of {', '.join(_BATCH_FORMATS)}, got {batch_format!r}", name or "map_batches"
            )
        dead = optional_dead_letter_tag(dead_letter, "map_batches dead_letter", name)
        node = self._add(n.MapBatchesNode, name, "map_batches", fn=fn, output_schema=output_schema, batch_format=batch_format,
                         dead_letter=dead)
        return DataStream(self._env, node)

    def select(self, *exprs: str | Any, name: str | None = None) -> "DataStream":
        """Project with SQL expressions (``"CAST(event_time AS BIGINT) AS event_time"``) or Spark Columns."""
        if not exprs:
            raise PipelineError("select needs at least one expression", name or "select")
        for e in exprs:
            if not (isinstance(e, str) and e.strip()) and not _is_column(e):
                raise PipelineError(f"select takes SQL strings or Spark Columns, got {e!r}", name or "select")
        return DataStream(self._env, self._add(n.SelectNode, name, "select", exprs=tuple(exprs)))

    def union(self, *others: "DataStream", name: str | None = None) -> "DataStream":
        """Merge streams with the same fields (matched by name)."""
        if not others:
            raise PipelineError("union needs at least one other stream", name or "union")
        for o in others:
            if not isinstance(o, DataStream):
                raise PipelineError(f"union takes DataStreams, got {o!r}", name or "union")
            if o._env is not self._env:
                raise PipelineError("cannot union streams of different environments", name or "union")
        inputs = (self._node, *(o._node for o in others))
        return DataStream(self._env, self._add(n.UnionNode, name, "union", inputs=inputs))

    def create_view(self, name: str) -> "DataStream":
        """Name this stream for SQL: ``env.sql("SELECT ... FROM name ...")`` reads it (Flink's
        ``createTemporaryView``; docs/sql.md). Returns the stream itself."""
        self._env._register_view(name, self._node)
        return self

    def connect(self, other: "DataStream | BroadcastStream") -> Any:
        """Connect with ``other`` (Flink's ``ConnectedStreams``): then ``.map(fn1, fn2)`` /
        ``.flat_map(fn1, fn2)``, or ``.key_by(key1, key2).process(KeyedCoProcessFunction, schema)``
        with keyed state and timers shared by both streams (ember.api.connected).

        ``keyed.connect(rules.broadcast(descriptor))`` connects a keyed stream with a
        broadcast stream: then ``.process(KeyedBroadcastProcessFunction, schema)``; a
        non-keyed stream's ``connect(rules.broadcast(descriptor))`` takes a
        ``BroadcastProcessFunction`` (ember.api.broadcast; docs/broadcast.md)."""
        if isinstance(other, BroadcastStream):
            if isinstance(self, KeyedStream) and not all(isinstance(k, str) for k in self.keys):
                raise PipelineError("a stream connected with a broadcast stream must be keyed by field names", "connect")
            return BroadcastConnectedStream(self, other, DataStream)
        return ConnectedStreams(self, other, DataStream)

    def join(self, other: "DataStream", how: str = "inner", *, name: str | None = None) -> WindowJoin:
        """Flink's window join: ``a.join(b).where("k").equal_to("k").window(assigner).apply(fn, schema)``
        (or ``.select("left.x AS x", ...)``): the pairs with equal keys in the same event-time
        window, emitted when it closes (ember.api.joins; docs/joins.md)."""
        return WindowJoin(self, other, how, name, DataStream)

    def broadcast(self, *descriptors: Any) -> BroadcastStream:
        """This stream as broadcast state's input (Flink's ``broadcast(MapStateDescriptor)``): every
        task gets every record, to write the named MapStates in ``process_broadcast_element``
        of a :class:`~ember.functions.KeyedBroadcastProcessFunction` (``keyed.connect(...)``)."""
        return BroadcastStream(self, broadcast_descriptors(descriptors, self._node.name))

    def join_lookup(
        self, table: Any, on: str | Iterable[str], how: str = "inner", *, unmatched: Any = None, name: str | None = None
    ) -> "DataStream":
        """Join every record with a static lookup table (broadcast to every task).

        ``table`` is a pandas DataFrame, a Spark DataFrame, or a list of dicts.
        ``how`` is ``"inner"`` (drop records without a match) or ``"left"``.
        ``unmatched`` (an :class:`OutputTag`, inner joins only) sends the records
        without a match to that side output instead of dropping them, as dead
        letters: ``raw`` (the record as JSON) and ``error`` (which key had no match).
        """
        keys = (on,) if isinstance(on, str) else tuple(on)
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise PipelineError(f"join_lookup 'on' must name one or more fields, got {on!r}", name or "join_lookup")
        if how not in _JOIN_KINDS:
            raise PipelineError(f"join_lookup how must be one of {', '.join(_JOIN_KINDS)}, got {how!r}", name or "join_lookup")
        if table is None:
            raise PipelineError("join_lookup needs a table", name or "join_lookup")
        if unmatched is not None:
            if how != "inner":
                raise PipelineError("join_lookup: unmatched records exist only for how='inner'", name or "join_lookup")
            unmatched = dead_letter_tag(unmatched, "join_lookup unmatched", name)
        node = self._add(n.LookupJoinNode, name, "join_lookup", table=table, on=keys, how=how, unmatched=unmatched)
        return DataStream(self._env, node)

    def parse_json(self, field: str, schema: str, *, dead_letter: Any, name: str | None = None) -> "DataStream":
        """Decode the JSON object in the text field ``field`` into the fields of
        ``schema`` (``"ad_id string not null, event_time bigint, ..."``; types
        string, boolean, tinyint, smallint, int, bigint, float, double; keys not
        declared are ignored). The other fields of the stream are kept.

        A record that is not a JSON object, has a field of the wrong type, or
        lacks a ``NOT NULL`` field goes to the side output ``dead_letter`` (an
        :class:`OutputTag`) with ``raw`` (the text) and ``error`` (the reason);
        the pipeline must read it (``get_side_output(dead_letter)``), so no bad
        record is lost unnoticed. Decoding is vectorised (Arrow's JSON reader,
        record by record only for a batch holding a bad record)."""
        step = name or "parse_json"
        if not isinstance(field, str) or not field:
            raise PipelineError(f"parse_json: field must name the JSON text field, got {field!r}", step)
        try:
            fields = parse_json_schema(schema, "parse_json")
        except ConfigError as exc:
            raise PipelineError(str(exc), step) from None
        tag = dead_letter_tag(dead_letter, "parse_json dead_letter", name)
        node = self._add(n.ParseJsonNode, name, "parse_json", field=field, fields=fields, dead_letter=tag)
        return DataStream(self._env, node)

    # -- keys and windows ----------------------------------------------------------------
    def key_by(self, *keys: str | Any, name: str | None = None) -> "KeyedStream":
        """Partition by one or more fields (names or Spark Columns)."""
        if not keys:
            raise PipelineError("key_by needs at least one key field", name or "key_by")
        for k in keys:
            if not (isinstance(k, str) and k) and not _is_column(k):
                raise PipelineError(
                    f"key_by takes field names or Spark Columns, got {k!r}; "
                    "compute the key with select(...) or map(...) first",
                    name or "key_by",
                )
        return KeyedStream(self._env, self._add(n.KeyByNode, name, "key_by", keys=tuple(keys)))

    def _as_one_key(self) -> "KeyedStream":
        """The whole stream as one key — for steps Flink runs on a non-keyed stream with
        parallelism 1 (``CEP.pattern`` of a plain stream): on Ember's keyed runtime the key is
        ``()`` and one task runs the step."""
        return KeyedStream(self._env, self._add(n.KeyByNode, None, "key_by", keys=()))

    def reinterpret_as_keyed(self, *keys: str, name: str | None = None) -> "KeyedStream":
        """This stream as already partitioned by ``keys`` (field names): Flink's
        ``reinterpretAsKeyedStream``. A keyed ``process`` step, CEP step or window reading it
        straight after a keyed ``process`` (or CEP) step keyed by the same fields runs *chained*
        to that step — in one Spark operator, each record handed over in Python, no shuffle
        between them (docs/design/dataflow.md, "Chaining keyed steps"). The promise: every record the step
        before emits carries the key it was called with; a record that does not is the
        reading step's dead letter (or fails the job, naming both keys). Where the steps
        cannot chain, this is ``key_by(*keys)``."""
        step = name or "reinterpret_as_keyed"
        if not keys:
            raise PipelineError("reinterpret_as_keyed needs at least one key field", step)
        for k in keys:
            if not (isinstance(k, str) and k):
                raise PipelineError(f"reinterpret_as_keyed takes field names, got {k!r}", step)
        return KeyedStream(self._env, self._add(n.KeyByNode, name, "key_by", keys=tuple(keys), reinterpret=True))

    def window_all(self, assigner: WindowAssigner) -> "WindowedStream":
        """A window over the whole (non-keyed) stream. Built-in aggregates on a plain
        tumbling or sliding window compile to Spark's native windowing; anything else
        (a Python function, trigger, evictor, lateness, session windows) runs on Ember's
        window operator as one key — one task, as Flink runs ``windowAll``."""
        return WindowedStream(self, (), assigner)

    def count_window_all(self, size: int, slide: int | None = None) -> "WindowedStream":
        """Windows of ``size`` records of the whole (non-keyed) stream: tumbling, or sliding
        every ``slide`` records — Flink's ``countWindowAll``; one key on Ember's window
        operator (one task). Records are counted in timestamp order within a micro-batch
        when the stream has event time, else in arrival order."""
        return _count_window(self, (), size, slide)

    # -- sinks ------------------------------------------------------------------------
    def sink_to(self, sink: Sink, *, name: str | None = None) -> n.SinkNode:
        """Send this stream to ``sink``; the environment's next ``execute`` runs it."""
        if not isinstance(sink, Sink):
            raise PipelineError(f"sink_to takes an Ember sink (e.g. CollectSink()), got {sink!r}", name or "sink")
        node = self._add(n.SinkNode, name, "sink", sink=sink)
        self._env._register_sink(node)
        return node

    def print(self, num_rows: int = 20) -> n.SinkNode:  # noqa: A003 - Flink's name
        """Print results to the console."""
        return self.sink_to(ConsoleSink(num_rows=num_rows))

    def get_side_output(self, tag: Any, *, name: str | None = None) -> "DataStream":
        """The side output ``tag`` of this step: records a process function sent with
        ``ctx.output(tag, ...)``, a window's late records (``side_output_late_data``), or a
        step's dead letters (``dead_letter=tag``)."""
        if not isinstance(tag, OutputTag):
            raise PipelineError(f"get_side_output takes an OutputTag, got {tag!r}", name or "side_output")
        if isinstance(self._node, n.ParseJsonNode | n.LookupJoinNode | n.MapNode | n.FlatMapNode | n.FilterNode
                      | n.MapBatchesNode | n.VectorizedProcessNode | n.IntervalJoinNode | n.WindowJoinNode):
            own = self._node.unmatched if isinstance(self._node, n.LookupJoinNode) else self._node.dead_letter
            if own is None or tag != own:
                raise PipelineError(
                    f"step '{self._node.name}' emits no side output '{tag.name}'"
                    + (f" (its dead letters go to '{own.name}')" if own is not None else ""),
                    name or "side_output",
                )
            tag = own
        elif not isinstance(self._node, n.KeyedProcessNode | n.WindowNode):
            raise PipelineError(
                f"step '{self._node.name}' ({self._node.kind}) has no side outputs; "
                "side outputs come from process functions, windows and dead letters (parse_json, "
                "join_lookup(unmatched=...), map / flat_map / filter / map_batches / process_batches / joins with dead_letter=...)",
                name or "side_output",
            )
        if isinstance(self._node, n.WindowNode) and self._node.dead_letter is not None and tag == self._node.dead_letter:
            tag = self._node.dead_letter
        elif isinstance(self._node, n.WindowNode) and tag != self._node.late_tag and self._node.window_fn is None:
            raise PipelineError(
                f"window '{self._node.name}' emits no side output '{tag.name}' (its late-data tag is "
                f"{self._node.late_tag!r}, its dead letters' {getattr(self._node.dead_letter, 'name', None)!r})",
                name or "side_output",
            )
        return DataStream(self._env, self._add(n.SideOutputNode, name, f"{tag.name}", tag=tag))

    def explain(self) -> str:
        """The graph up to this stream, one step per line."""
        graph = Graph([n.SinkNode(name="(unsinked)", inputs=(self._node,), sink=_Unsinked())])
        return graph.explain(physical_notes(graph))


class KeyedStream(DataStream):
    """A stream partitioned by key. ``window(...)`` groups it into keyed windows;
    other operations run after the partitioning (Flink's keyBy + map)."""

    @property
    def keys(self) -> tuple[Any, ...]:
        assert isinstance(self._node, n.KeyByNode)
        return self._node.keys

    def window(self, assigner: WindowAssigner) -> "WindowedStream":
        """Group each key's records into windows: tumbling, sliding or session,
        in event time or processing time, or ``GlobalWindows.create()`` with a trigger."""
        return WindowedStream(self, self.keys, assigner)

    def count_window(self, size: int, slide: int | None = None) -> "WindowedStream":
        """Windows of ``size`` records per key: tumbling (fires and clears every
        ``size`` records), or sliding (every ``slide`` records, over the last ``size``).

        Records of a key are counted in timestamp order within a micro-batch when
        the stream has event time, else in arrival order.
        """
        return _count_window(self, self.keys, size, slide)

    def process(self, fn: Any, output_schema: Any, *, dead_letter: Any = None, name: str | None = None) -> DataStream:
        """Run ``fn`` (a :class:`~ember.functions.KeyedProcessFunction`) on every
        record with managed keyed state; ``output_schema`` (Spark DDL) types what it yields.

        Within a micro-batch each key's records are processed in timestamp order
        when the stream has event time, else in arrival order. ``dead_letter=OutputTag(...)``:
        a record ``process_element`` raises on goes to that side output (``raw``: the record
        as JSON, ``error``: why) and what that call emitted is discarded; the state and timers
        it changed before raising stay changed. A timer ``on_timer`` raises on goes there too
        (``raw``: its key and timestamp). Without it, such a record fails the job.
        """
        step = name or "process"
        if not isinstance(fn, KeyedProcessFunction):
            raise PipelineError(f"process takes a KeyedProcessFunction instance, got {fn!r}", step)
        if not output_schema:
            raise PipelineError("process needs an output_schema (Spark DDL string or StructType)", step)
        if not all(isinstance(k, str) for k in self.keys):
            raise PipelineError("process needs key_by with field names (not Columns)", step)
        dead = optional_dead_letter_tag(dead_letter, "process dead_letter", name)
        node = self._add(n.KeyedProcessNode, name, "process", keys=self.keys, fn=fn, output_schema=output_schema,
                         dead_letter=dead)
        return DataStream(self._env, node)

    def process_batches(self, fn: Any, output_schema: Any, *, dead_letter: Any = None,
                        name: str | None = None) -> DataStream:
        """Run ``fn`` (a :class:`~ember.functions.VectorizedKeyedFunction`) on whole
        micro-batches of many keys at once, with columnar keyed state — the fast variant
        of :meth:`process` when the logic can be written with pandas/numpy.

        ``dead_letter=OutputTag(...)``: a call that raises (or returns what does not fit) is
        narrowed down by keys — the keys split in halves, each called again with its records
        and state — to the keys it fails on alone: their records of the batch go to that side
        output (``raw``: each record as JSON, ``error``: why) and their state stays as it was;
        the other keys' outputs and updates apply. Without it, such a call fails the job."""
        step = name or "process_batches"
        if not isinstance(fn, VectorizedKeyedFunction):
            raise PipelineError(f"process_batches takes a VectorizedKeyedFunction instance, got {fn!r}", step)
        if not output_schema:
            raise PipelineError("process_batches needs an output_schema (Spark DDL string or StructType)", step)
        if not isinstance(fn.state_schema, str) or not fn.state_schema.strip():
            raise ConfigError(f"{type(fn).__name__}.state_schema must declare the state columns, e.g. 'state int'")
        if not all(isinstance(k, str) for k in self.keys):
            raise PipelineError("process_batches needs key_by with field names (not Columns)", step)
        dead = optional_dead_letter_tag(dead_letter, "process_batches dead_letter", name)
        node = self._add(n.VectorizedProcessNode, name, "process_batches", keys=self.keys, fn=fn, output_schema=output_schema,
                         dead_letter=dead)
        return DataStream(self._env, node)

    def interval_join(self, other: "KeyedStream", how: str = "inner", *, name: str | None = None) -> IntervalJoin:
        """Flink's interval join with ``other`` (also keyed, keys paired in order): then
        ``.between(lower, upper)`` and ``.process(fn, schema)`` or ``.select(...)``
        (ember.api.joins.IntervalJoin; docs/joins.md)."""
        return IntervalJoin(self, other, how, name, DataStream)

    # -- rolling aggregations (no window: one output per record, or per key and batch) ---------
    # ``emit="record"`` (Flink's): one output per input record; ``emit="batch"``: one per key and
    # micro-batch, the key's aggregate after the batch's records — the last of the per-record
    # outputs (docs/windows.md, "Rolling aggregations").
    def reduce(self, fn: Callable[[dict, dict], dict], *, emit: str = "record", name: str | None = None) -> DataStream:
        """Flink's rolling reduce: per record, ``fn(previous_result, record)`` (the key's
        first record as it is), emitted and kept in keyed state. The output has the
        input's fields (ember.rolling)."""
        _require_callable(fn, "reduce", name)
        return self._rolling(RollingReduce(fn, _emit(emit, name or "reduce")), name, "reduce")

    def sum(self, field: str, *, emit: str = "record", name: str | None = None) -> DataStream:
        """Per record, the key's first record with ``field`` replaced by the running sum."""
        return self._rolling(RollingField("sum", field, emit=_emit(emit, name or "sum")), name, "sum", field)

    def min(self, field: str, *, emit: str = "record", name: str | None = None) -> DataStream:
        """Per record, the key's first record with ``field`` replaced by the running minimum."""
        return self._rolling(RollingField("min", field, emit=_emit(emit, name or "min")), name, "min", field)

    def max(self, field: str, *, emit: str = "record", name: str | None = None) -> DataStream:
        """Per record, the key's first record with ``field`` replaced by the running maximum."""
        return self._rolling(RollingField("max", field, emit=_emit(emit, name or "max")), name, "max", field)

    def min_by(self, field: str, *, emit: str = "record", name: str | None = None) -> DataStream:
        """Per record, the record with the smallest ``field`` so far (the earlier on ties)."""
        return self._rolling(RollingField("min", field, by=True, emit=_emit(emit, name or "min_by")), name, "min_by", field)

    def max_by(self, field: str, *, emit: str = "record", name: str | None = None) -> DataStream:
        """Per record, the record with the largest ``field`` so far (the earlier on ties)."""
        return self._rolling(RollingField("max", field, by=True, emit=_emit(emit, name or "max_by")), name, "max_by", field)

    def _rolling(self, fn: KeyedProcessFunction, name: str | None, prefix: str, field: str | None = None) -> DataStream:
        step = name or prefix
        if field is not None and (not isinstance(field, str) or not field):
            raise PipelineError(f"{prefix} takes a field name, got {field!r}", step)
        if not all(isinstance(k, str) for k in self.keys):
            raise PipelineError(f"{prefix} needs key_by with field names (not Columns)", step)
        node = self._add(n.KeyedProcessNode, name, prefix, keys=self.keys, fn=fn, output_schema=None)
        return DataStream(self._env, node)


def _count_window(stream: DataStream, keys: tuple[Any, ...], size: int, slide: int | None) -> "WindowedStream":
    """A tumbling (``slide`` None) or sliding count window over ``stream`` keyed by ``keys``."""
    for what, v in (("size", size), ("slide", slide)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            raise PipelineError(f"count_window {what} must be a positive int, got {v!r}", "window")
    if slide is None:
        return WindowedStream(
            stream, keys, GlobalWindows.create(),
            trigger=PurgingTrigger.of(CountTrigger.of(size)), label=f"count window {size}",
        )
    return WindowedStream(
        stream, keys, GlobalWindows.create(), trigger=CountTrigger.of(slide),
        evictor=CountEvictor.of(size), label=f"count window {size} every {slide}",
    )


def _emit(emit: Any, step: str) -> str:
    """A rolling aggregation's emit mode, checked when declared."""
    if emit not in EMIT_MODES:
        raise PipelineError(f"emit must be one of {', '.join(map(repr, EMIT_MODES))}, got {emit!r}", step)
    return str(emit)


class WindowedStream:
    """Windows of a keyed stream awaiting their function.

    ``trigger``, ``evictor``, ``allowed_lateness`` and ``side_output_late_data``
    refine the windows (each returns a new WindowedStream); ``aggregate``,
    ``reduce``, ``process`` and the built-in shortcuts (``count``, ``sum``...)
    finish them. Built-in aggregates on plain time and session windows compile
    to Spark's native windowing; everything else runs on Ember's window
    operator over managed keyed state (docs/windows.md).
    """

    def __init__(
        self,
        stream: DataStream,
        keys: tuple[Any, ...],
        assigner: WindowAssigner,
        *,
        trigger: Any = None,
        evictor: Any = None,
        allowed_lateness_ms: int = 0,
        late_tag: Any = None,
        label: str = "",
    ) -> None:
        if not isinstance(assigner, WindowAssigner):
            raise PipelineError(
                f"window takes a window assigner such as TumblingEventTimeWindows.of(...), got {assigner!r}", "window"
            )
        self._stream = stream
        self._keys = keys
        self._assigner = assigner
        self._trigger = trigger
        self._evictor = evictor
        self._lateness = allowed_lateness_ms
        self._late_tag = late_tag
        self._label = label

    def _with(self, **changes: Any) -> "WindowedStream":
        fields = dict(
            trigger=self._trigger, evictor=self._evictor, allowed_lateness_ms=self._lateness,
            late_tag=self._late_tag, label=self._label,
        )
        fields.update(changes)
        return WindowedStream(self._stream, self._keys, self._assigner, **fields)

    # -- refinements -----------------------------------------------------------------
    def trigger(self, trigger: Any) -> "WindowedStream":
        """Replace the assigner's default trigger (e.g. ``CountTrigger.of(100)``, a custom Trigger)."""
        if not isinstance(trigger, Trigger):
            raise PipelineError(f"trigger takes an ember.windowing.triggers.Trigger, got {trigger!r}", "window")
        return self._with(trigger=trigger)

    def evictor(self, evictor: Any) -> "WindowedStream":
        """Remove elements before/after the window function runs (``CountEvictor.of(10)``...)."""
        if not isinstance(evictor, Evictor):
            raise PipelineError(f"evictor takes an ember.windowing.evictors.Evictor, got {evictor!r}", "window")
        return self._with(evictor=evictor)

    def allowed_lateness(self, lateness: Any) -> "WindowedStream":
        """Keep windows open this long after the watermark passed their end; an element
        arriving then fires the window again with the updated result."""
        if self._assigner.processing_time:
            raise PipelineError("allowed lateness applies to event-time windows only", "window")
        return self._with(allowed_lateness_ms=to_ms(lateness, "allowed lateness", allow_zero=True))

    def side_output_late_data(self, tag: Any) -> "WindowedStream":
        """Send elements that arrive after their windows closed (end + allowed lateness)
        to the side output ``tag`` instead of dropping them: read them with
        ``result.get_side_output(tag)``; they keep the input's fields."""
        if not isinstance(tag, OutputTag):
            raise PipelineError(f"side_output_late_data takes an OutputTag, got {tag!r}", "window")
        return self._with(late_tag=tag)

    # -- finishing ---------------------------------------------------------------------
    def _window(self, name: str | None, **fields: Any) -> DataStream:
        """The window step. Built-in aggregates on a plain window (``is_plain_window``: no
        trigger, evictor, lateness or late-data output; not an event-time session) may be
        global or keyed by Columns; anything else needs keys that are field names."""
        plain = bool(fields.get("aggregates")) and is_plain_window(
            self._assigner, self._trigger, self._evictor, self._lateness, self._late_tag
        )
        if not plain and not all(isinstance(k, str) for k in self._keys):
            raise PipelineError("this window needs key_by with field names (not Columns)", name or "window")
        stream = self._stream
        node = stream._add(
            n.WindowNode, name, "window",
            keys=self._keys, assigner=self._assigner, trigger=self._trigger, evictor=self._evictor,
            allowed_lateness_ms=self._lateness, late_tag=self._late_tag, label=self._label, **fields,
        )
        return DataStream(stream._env, node)

    def aggregate(
        self,
        fn: Any = None,
        window_function: Any = None,
        *,
        output_schema: Any = None,
        dead_letter: Any = None,
        name: str | None = None,
        **aggregates: Aggregate,
    ) -> DataStream:
        """Aggregate each window.

        Either named built-ins — ``aggregate(views=Agg.count(), spent=Agg.sum("price"))`` —
        or a Python :class:`~ember.functions.AggregateFunction` with the
        ``output_schema`` of its ``get_result`` (a dict, a tuple, or a bare value
        for one field). The result has the key fields, ``window_start`` and
        ``window_end`` (epoch ms; null for global windows) and the aggregate's
        fields. With a ``window_function`` (a ProcessWindowFunction receiving the
        one aggregated result), ``output_schema`` is that function's output.
        ``dead_letter=OutputTag(...)`` (with an AggregateFunction): a record ``add`` (or
        ``create_accumulator``) raises on goes to that side output (``raw``: the record as
        JSON, ``error``: why) and into no window; the window keeps what it had. A window
        ``get_result`` or the window function raises on emits nothing and goes there too
        (``raw``: its key and bounds). The step then aggregates record by record (no partial
        aggregation before the shuffle).
        """
        step = name or "window"
        if dead_letter is not None and fn is None:
            raise PipelineError("dead_letter is for a Python AggregateFunction (built-in aggregates cannot fail per record)",
                                step)
        dead = optional_dead_letter_tag(dead_letter, "aggregate dead_letter", name)
        if fn is not None:
            if aggregates:
                raise PipelineError("aggregate takes an AggregateFunction or named built-ins, not both", step)
            if not isinstance(fn, AggregateFunction):
                raise PipelineError(f"aggregate takes an AggregateFunction instance, got {fn!r}", step)
            if window_function is not None and not isinstance(window_function, ProcessWindowFunction):
                raise PipelineError(f"window_function must be a ProcessWindowFunction, got {window_function!r}", step)
            if not output_schema:
                raise PipelineError("aggregate with an AggregateFunction needs output_schema (Spark DDL)", step)
            return self._window(name, aggregate_fn=fn, window_fn=window_function, output_schema=output_schema,
                                dead_letter=dead)
        if not aggregates:
            raise PipelineError("aggregate needs at least one named aggregate, e.g. count=Agg.count()", step)
        for out, agg in aggregates.items():
            if not isinstance(agg, Aggregate):
                raise PipelineError(f"aggregate '{out}' must be an Agg.*(...) value, got {agg!r}", step)
        return self._window(name, aggregates=tuple(aggregates.items()))

    def reduce(self, fn: Callable[[dict, dict], dict], *, dead_letter: Any = None, name: str | None = None) -> DataStream:
        """Combine each window's records pairwise with ``fn(a, b) -> record``; the
        output is the reduced record (the input's fields). ``dead_letter``: as for
        :meth:`aggregate` (a record ``fn`` raises on)."""
        _require_callable(fn, "reduce", name)
        dead = optional_dead_letter_tag(dead_letter, "reduce dead_letter", name)
        return self._window(name, reduce_fn=fn, dead_letter=dead)

    def process(self, fn: Any, output_schema: Any, *, dead_letter: Any = None, name: str | None = None) -> DataStream:
        """Run a :class:`~ember.functions.ProcessWindowFunction` on all of a
        window's elements when it fires; ``output_schema`` types what it yields.
        ``dead_letter=OutputTag(...)``: a window ``fn`` raises on emits nothing and goes to
        that side output (``raw``: its key, ``window_start`` and ``window_end``)."""
        step = name or "window"
        if not isinstance(fn, ProcessWindowFunction):
            raise PipelineError(f"process takes a ProcessWindowFunction instance, got {fn!r}", step)
        if not output_schema:
            raise PipelineError("process needs an output_schema (Spark DDL string or StructType)", step)
        dead = optional_dead_letter_tag(dead_letter, "process dead_letter", name)
        return self._window(name, window_fn=fn, output_schema=output_schema, dead_letter=dead)

    def count(self, *, name: str | None = None) -> DataStream:
        return self.aggregate(name=name, count=Agg.count())

    def sum(self, field: str, *, name: str | None = None) -> DataStream:
        return self.aggregate(name=name, **{f"sum_{field}": Agg.sum(field)})

    def min(self, field: str, *, name: str | None = None) -> DataStream:
        return self.aggregate(name=name, **{f"min_{field}": Agg.min(field)})

    def max(self, field: str, *, name: str | None = None) -> DataStream:
        return self.aggregate(name=name, **{f"max_{field}": Agg.max(field)})

    def avg(self, field: str, *, name: str | None = None) -> DataStream:
        return self.aggregate(name=name, **{f"avg_{field}": Agg.avg(field)})

    def first(self, field: str, *, name: str | None = None) -> DataStream:
        return self.aggregate(name=name, **{f"first_{field}": Agg.first(field)})

    def last(self, field: str, *, name: str | None = None) -> DataStream:
        return self.aggregate(name=name, **{f"last_{field}": Agg.last(field)})


class _Unsinked(Sink):
    def describe(self) -> str:
        return "(no sink yet)"


def _require_callable(fn: Any, op: str, name: str | None) -> None:
    if not callable(fn) or _is_column(fn):
        raise PipelineError(f"{op} takes a Python callable, got {fn!r}", name or op)
