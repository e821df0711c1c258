"""DataStream, KeyedStream and WindowedStream: declare steps, build the graph.

Nothing here runs anything: every method adds a node to the pipeline graph and
returns a new stream. Arguments are checked here, when the step is declared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

from ember.connectors.base import Sink
from ember.connectors.sinks import ConsoleSink
from ember.errors import PipelineError
from ember.graph import nodes as n
from ember.windowing.aggregates import Agg, Aggregate
from ember.windowing.assigners import WindowAssigner

if TYPE_CHECKING:
    from ember.api.environment import StreamEnvironment

__all__ = ["DataStream", "KeyedStream", "WindowedStream"]

_BATCH_FORMATS = ("arrow", "pandas")
_JOIN_KINDS = ("inner", "left")


def _is_column(obj: Any) -> bool:
    return type(obj).__name__ == "Column"


class DataStream:
    """A stream of records with named fields (a Spark schema)."""

    def __init__(self, env: "StreamEnvironment", node: n.Node) -> None:
        self._env = env
        self._node = node

    @property
    def node(self) -> n.Node:
        return self._node

    def _add(self, cls: type[n.Node], name: str | None, prefix: str, inputs=None, **fields: Any) -> n.Node:
        step = self._env._step_name(name, prefix)
        return cls(name=step, inputs=tuple(inputs or (self._node,)), **fields)

    # -- per-record Python ----------------------------------------------------------
    def map(self, fn: Callable[[dict], Any], output_schema: Any = None, *, name: str | None = None) -> "DataStream":
        """Apply ``fn`` to every record (a dict of field -> value).

        ``fn`` returns a dict, a tuple in ``output_schema`` order, or (one-column
        schemas) a bare value. ``output_schema`` (Spark DDL string or StructType)
        defaults to the input schema. Runs on Arrow batches inside Spark.
        """
        _require_callable(fn, "map", name)
        return DataStream(self._env, self._add(n.MapNode, name, "map", fn=fn, output_schema=output_schema))

    def flat_map(self, fn: Callable[[dict], Iterable[Any]], output_schema: Any = None, *, name: str | None = None) -> "DataStream":
        """Apply ``fn`` to every record; it returns an iterable of zero or more output records."""
        _require_callable(fn, "flat_map", name)
        return DataStream(self._env, self._add(n.FlatMapNode, name, "flat_map", fn=fn, output_schema=output_schema))

    def filter(self, predicate: str | Any | Callable[[dict], bool], *, name: str | None = None) -> "DataStream":
        """Keep the records for which ``predicate`` holds.

        A string (``"event_type = 'view'"``) or a Spark ``Column`` compiles to
        native Spark SQL; a Python callable gets each record as a dict.
        """
        if not (isinstance(predicate, str) and predicate.strip()) and not _is_column(predicate) and not callable(predicate):
            raise PipelineError(
                f"filter takes a SQL string, a Spark Column or a callable, got {predicate!r}", name or "filter"
            )
        return DataStream(self._env, self._add(n.FilterNode, name, "filter", predicate=predicate))

    # -- vectorised and native ---------------------------------------------------------
    def map_batches(
        self,
        fn: Callable[[Any], Any],
        output_schema: Any = None,
        *,
        batch_format: str = "arrow",
        name: str | None = None,
    ) -> "DataStream":
        """Apply ``fn`` to whole batches: a ``pyarrow.RecordBatch`` (``batch_format="arrow"``)
        or a ``pandas.DataFrame`` (``"pandas"``); it returns the same kind (an Arrow
        Table is accepted too). ``output_schema`` defaults to the input schema."""
        _require_callable(fn, "map_batches", name)
        if batch_format not in _BATCH_FORMATS:
            raise PipelineError(
                f"batch_format must be one of {', '.join(_BATCH_FORMATS)}, got {batch_format!r}", name or "map_batches"
            )
        node = self._add(n.MapBatchesNode, name, "map_batches", fn=fn, output_schema=output_schema, batch_format=batch_format)
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

    def join_lookup(self, table: Any, on: str | Iterable[str], how: str = "inner", *, name: str | None = None) -> "DataStream":
        """Join every record with a static lookup table (broadcast to every task).

        ``table`` is a pandas DataFrame, a Spark DataFrame, or a list of dicts.
        ``how`` is ``"inner"`` (drop records without a match) or ``"left"``.
        """
        keys = (on,) if isinstance(on, str) else tuple(on)
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise PipelineError(f"join_lookup 'on' must name one or more fields, got {on!r}", name or "join_lookup")
        if how not in _JOIN_KINDS:
            raise PipelineError(f"join_lookup how must be one of {', '.join(_JOIN_KINDS)}, got {how!r}", name or "join_lookup")
        if table is None:
            raise PipelineError("join_lookup needs a table", name or "join_lookup")
        node = self._add(n.LookupJoinNode, name, "join_lookup", table=table, on=keys, how=how)
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

    def window_all(self, assigner: WindowAssigner) -> "WindowedStream":
        """A window over the whole (non-keyed) stream."""
        return WindowedStream(self, (), assigner)

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

    def explain(self) -> str:
        """The graph up to this stream, one step per line."""
        from ember.graph.graph import Graph

        return Graph([n.SinkNode(name="(unsinked)", inputs=(self._node,), sink=_Unsinked())]).explain()


class KeyedStream(DataStream):
    """A stream partitioned by key. ``window(...)`` groups it into keyed windows;
    other operations run after the partitioning (Flink's keyBy + map)."""

    @property
    def keys(self) -> tuple[Any, ...]:
        assert isinstance(self._node, n.KeyByNode)
        return self._node.keys

    def window(self, assigner: WindowAssigner) -> "WindowedStream":
        """Group each key's records into windows: tumbling, sliding or session,
        in event time or processing time."""
        return WindowedStream(self, self.keys, assigner)

    def process(self, fn: Any, output_schema: Any, *, name: str | None = None) -> DataStream:
        """Run ``fn`` (a :class:`~ember.api.functions.KeyedProcessFunction`) on every
        record with managed keyed state; ``output_schema`` (Spark DDL) types what it yields.

        Within a micro-batch each key's records are processed in timestamp order
        when the stream has event time, else in arrival order.
        """
        from ember.api.functions import KeyedProcessFunction

        step = name or "process"
        if not isinstance(fn, KeyedProcessFunction):
            raise PipelineError(f"process takes a KeyedProcessFunction instance, got {fn!r}", step)
        if not output_schema:
            raise PipelineError("process needs an output_schema (Spark DDL string or StructType)", step)
        if not all(isinstance(k, str) for k in self.keys):
            raise PipelineError("process needs key_by with field names (not Columns)", step)
        node = self._add(n.KeyedProcessNode, name, "process", keys=self.keys, fn=fn, output_schema=output_schema)
        return DataStream(self._env, node)


class WindowedStream:
    """Windows of a (keyed) stream awaiting their aggregate."""

    def __init__(self, stream: DataStream, keys: tuple[Any, ...], assigner: WindowAssigner) -> None:
        if not isinstance(assigner, WindowAssigner):
            raise PipelineError(
                f"window takes a window assigner such as TumblingEventTimeWindows.of(...), got {assigner!r}", "window"
            )
        self._stream = stream
        self._keys = keys
        self._assigner = assigner

    def aggregate(self, *, name: str | None = None, **aggregates: Aggregate) -> DataStream:
        """Named built-in aggregates: ``aggregate(views=Agg.count(), spent=Agg.sum("price"))``.

        The result has the key fields, ``window_start`` and ``window_end`` (epoch
        ms) and one field per aggregate, emitted once per window when the
        watermark passes its end.
        """
        if not aggregates:
            raise PipelineError("aggregate needs at least one named aggregate, e.g. count=Agg.count()", name or "window")
        for out, agg in aggregates.items():
            if not isinstance(agg, Aggregate):
                raise PipelineError(f"aggregate '{out}' must be an Agg.*(...) value, got {agg!r}", name or "window")
        stream = self._stream
        node = stream._add(
            n.WindowAggregateNode, name, "window",
            keys=self._keys, assigner=self._assigner, aggregates=tuple(aggregates.items()),
        )
        return DataStream(stream._env, node)

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
