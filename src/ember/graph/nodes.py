"""Graph nodes: immutable declarations of one pipeline step each.

A node knows its inputs, a unique step name, and how to describe itself. It
knows nothing about Spark; the runner's translation table maps each node type
to a translator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ember.time.watermarks import WatermarkStrategy
from ember.windowing.aggregates import Aggregate
from ember.windowing.assigners import SessionWindows, SlidingWindows, TumblingWindows, WindowAssigner
from ember.windowing.triggers import EventTimeTrigger, ProcessingTimeTrigger

__all__ = [
    "Node",
    "SourceNode",
    "MapNode",
    "FilterNode",
    "FlatMapNode",
    "MapBatchesNode",
    "SelectNode",
    "UnionNode",
    "LookupJoinNode",
    "IntervalJoinNode",
    "SqlNode",
    "KeyByNode",
    "KeyedProcessNode",
    "ChainedProcessNode",
    "CoProcessNode",
    "BroadcastProcessNode",
    "WindowJoinNode",
    "WindowNode",
    "is_plain_window",
    "VectorizedProcessNode",
    "SideOutputNode",
    "ParseJsonNode",
    "SinkNode",
]


@dataclass(frozen=True, eq=False)
class Node:
    """One step. ``name`` is unique in its graph and appears in every error about it."""

    name: str
    inputs: tuple["Node", ...] = field(default=(), repr=False)

    @property
    def kind(self) -> str:
        return type(self).__name__.removesuffix("Node").lower()

    def describe(self) -> str:
        return self.kind


def _describe(declaration: Any) -> str:
    return declaration.describe() if declaration is not None else "?"


def _callable_name(fn: Callable[..., Any] | None) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


@dataclass(frozen=True, eq=False)
class SourceNode(Node):
    source: Any = None
    watermark: WatermarkStrategy | None = None

    def describe(self) -> str:
        time = f"; {self.watermark.describe()}" if self.watermark else ""
        return f"source {self.source.describe()}{time}"


def _dead(node: Any) -> str:
    return f"; failures -> '{node.dead_letter.name}'" if node.dead_letter is not None else ""


@dataclass(frozen=True, eq=False)
class MapNode(Node):
    """A Python function applied to every record (run on Arrow batches)."""

    fn: Callable[[dict], Any] | None = None
    output_schema: Any = None  # Spark DDL string / StructType, None = same as input
    dead_letter: Any = None  # OutputTag: records fn fails on go there instead of failing the job

    def describe(self) -> str:
        return f"map {_callable_name(self.fn)} (python, per record{_dead(self)})"


@dataclass(frozen=True, eq=False)
class FilterNode(Node):
    """Keeps records for which the predicate holds: a SQL string, a Spark Column or a Python callable."""

    predicate: Any = None
    dead_letter: Any = None  # OutputTag (Python predicates): records it fails on go there

    @property
    def is_python(self) -> bool:
        return callable(self.predicate) and not _is_column(self.predicate)

    def describe(self) -> str:
        if self.is_python:
            return f"filter {_callable_name(self.predicate)} (python, per record{_dead(self)})"
        return f"filter {self.predicate} (native SQL)"


@dataclass(frozen=True, eq=False)
class FlatMapNode(Node):
    fn: Callable[[dict], Any] | None = None
    output_schema: Any = None
    dead_letter: Any = None

    def describe(self) -> str:
        return f"flat_map {_callable_name(self.fn)} (python, per record{_dead(self)})"


@dataclass(frozen=True, eq=False)
class MapBatchesNode(Node):
    """A vectorised function over whole batches (pyarrow.RecordBatch or pandas.DataFrame)."""

    fn: Callable[[Any], Any] | None = None
    output_schema: Any = None
    batch_format: str = "arrow"
    dead_letter: Any = None  # OutputTag: records a failing batch is narrowed down to go there

    def describe(self) -> str:
        return f"map_batches {_callable_name(self.fn)} ({self.batch_format}, vectorised{_dead(self)})"


@dataclass(frozen=True, eq=False)
class SelectNode(Node):
    """Projection with SQL expression strings or Spark Columns (native)."""

    exprs: tuple[Any, ...] = ()

    def describe(self) -> str:
        return "select " + ", ".join(str(e) for e in self.exprs) + " (native SQL)"


@dataclass(frozen=True, eq=False)
class UnionNode(Node):
    def describe(self) -> str:
        return "union of " + ", ".join(n.name for n in self.inputs)


@dataclass(frozen=True, eq=False)
class LookupJoinNode(Node):
    """Join with a static table, broadcast to every task."""

    table: Any = None
    on: tuple[str, ...] = ()
    how: str = "inner"
    unmatched: Any = None  # OutputTag: records without a match go there (with how="inner")

    def describe(self) -> str:
        extra = f"; unmatched -> '{self.unmatched.name}'" if self.unmatched is not None else ""
        return f"lookup join on {', '.join(self.on)} ({self.how}, broadcast static table{extra})"


JOIN_KINDS = ("inner", "left_outer", "right_outer", "full_outer")


def _paired(left: tuple[str, ...], right: tuple[str, ...]) -> str:
    """Two streams' key fields, paired: ``k`` (same name) or ``a = b``."""
    return ", ".join(f"{a} = {b}" if a != b else a for a, b in zip(left, right))


def _pairs_out(verb: str, fn: Callable[..., Any] | None, exprs: tuple[Any, ...]) -> str:
    """What a join makes of its pairs: a Python function's records, a projection, or every field."""
    if fn is not None:
        return f"{verb} {_callable_name(fn)} (python, per pair)"
    return "select " + ", ".join(str(e) for e in exprs) if exprs else "all fields"


@dataclass(frozen=True, eq=False)
class IntervalJoinNode(Node):
    """Flink's interval join of two keyed streams (``inputs``: left, right): each pair with
    equal keys and ``left.ts + lower_ms <= right.ts <= left.ts + upper_ms``, bounds
    inclusive; ``how`` adds the unmatched records of one or both sides (Spark's outer
    joins). The pairs go to ``fn(left, right)`` (a Python function returning records,
    ``output_schema``) or are projected by SQL ``exprs`` over ``left.`` / ``right.``
    (neither: every field of both sides)."""

    left_keys: tuple[str, ...] = ()
    right_keys: tuple[str, ...] = ()
    lower_ms: int = 0
    upper_ms: int = 0
    how: str = "inner"
    fn: Callable[[Any, Any], Any] | None = None
    output_schema: Any = None
    exprs: tuple[Any, ...] = ()
    dead_letter: Any = None  # OutputTag: pairs ``fn`` raises on go there (the join then runs on Ember's runtime)

    def describe(self) -> str:
        keys = _paired(self.left_keys, self.right_keys)
        what = _pairs_out("process", self.fn, self.exprs)
        return (f"interval join ({self.how}) of {self.inputs[0].name} and {self.inputs[1].name} on {keys}, "
                f"right.ts in [left.ts {self.lower_ms:+d} ms, left.ts {self.upper_ms:+d} ms]: {what}{_dead(self)}")


@dataclass(frozen=True, eq=False)
class SqlNode(Node):
    """A Spark SQL query over streams registered as views (``views[i]`` names ``inputs[i]``);
    each view also has the stream's event time as a watermarked timestamp column ``rowtime``."""

    query: str = ""
    views: tuple[str, ...] = ()
    rowtime: str = "rowtime"

    def describe(self) -> str:
        text = " ".join(self.query.split())
        return f"sql over {', '.join(self.views)}: {text[:120]}{'...' if len(text) > 120 else ''} (Spark SQL)"


@dataclass(frozen=True, eq=False)
class KeyByNode(Node):
    """Partition by key: records with equal keys go to the same state partition.
    ``reinterpret``: the stream is already partitioned by these keys (Flink's
    ``reinterpretAsKeyedStream``): a keyed step reading it may be chained to the keyed
    step before it (ember.graph.chaining)."""

    keys: tuple[Any, ...] = ()
    reinterpret: bool = False

    def describe(self) -> str:
        if not self.keys:  # the whole stream as one key (a non-keyed CEP pattern)
            return "key_by nothing: the whole stream, one key"
        what = "reinterpret_as_keyed " if self.reinterpret else "key_by "
        return what + ", ".join(str(k) for k in self.keys)


@dataclass(frozen=True, eq=False)
class KeyedProcessNode(Node):
    """A KeyedProcessFunction with managed keyed state, run per record."""

    keys: tuple[str, ...] = ()
    fn: Any = None
    output_schema: Any = None
    dead_letter: Any = None  # OutputTag: records process_element raises on go there instead of failing the job

    def describe(self) -> str:
        return f"process {type(self.fn).__name__} by {', '.join(self.keys)} (python, keyed state){_dead(self)}"


@dataclass(frozen=True, eq=False)
class ChainedProcessNode(KeyedProcessNode):
    """Keyed process steps on one key run as one step (Flink's operator chaining;
    ember.graph.chaining): ``steps`` as declared (the last may be a keyed window), ``fn``
    runs them in turn on each record (ember.chaining.ChainedFunction), ``output_schema`` and
    ``dead_letter`` are the last's."""

    steps: tuple[Node, ...] = ()  # keyed process steps, the last possibly a keyed window

    def describe(self) -> str:
        fns = " -> ".join(type(s.fn).__name__ if isinstance(s, KeyedProcessNode) else s.describe() for s in self.steps)
        return f"process {fns} by {', '.join(self.keys)} (python, keyed state, chained){_dead(self)}"


@dataclass(frozen=True, eq=False)
class CoProcessNode(KeyedProcessNode):
    """Two connected keyed streams (``inputs``: their key_by steps) into one
    KeyedCoProcessFunction ``fn`` with shared keyed state (the runner runs it as one keyed
    step, ember.coprocess); ``keys`` are the first stream's key fields, ``other_keys`` the second's."""

    other_keys: tuple[str, ...] = ()

    def describe(self) -> str:
        keys = _paired(self.keys, self.other_keys)
        return (f"co-process {type(self.fn).__name__} of {self.inputs[0].name} and {self.inputs[1].name} "
                f"by {keys} (python, shared keyed state){_dead(self)}")


@dataclass(frozen=True, eq=False)
class BroadcastProcessNode(CoProcessNode):
    """A keyed stream (``inputs[0]``: its key_by step) connected with a broadcast stream
    (``inputs[1]``) into one KeyedBroadcastProcessFunction ``fn``: keyed state by ``keys``,
    and the broadcast ``descriptors``' MapStates, the same copy in every state bucket.
    Without ``keys``: a non-keyed stream and a BroadcastProcessFunction (broadcast state only)."""

    descriptors: tuple[Any, ...] = ()

    def describe(self) -> str:
        names = ", ".join(d.name for d in self.descriptors)
        if not self.keys:
            return (f"broadcast-process {type(self.fn).__name__} of {self.inputs[0].name} (non-keyed) "
                    f"with broadcast {self.inputs[1].name} (python, broadcast state {names}){_dead(self)}")
        return (f"broadcast-process {type(self.fn).__name__} of {self.inputs[0].name} by {', '.join(self.keys)} "
                f"with broadcast {self.inputs[1].name} (python, keyed state + broadcast state {names}){_dead(self)}")


@dataclass(frozen=True, eq=False)
class WindowJoinNode(CoProcessNode):
    """Flink's window join of two keyed streams (``inputs``: their key_by steps): the pairs of
    records with equal keys in the same event-time window of ``assigner`` (tumbling or
    sliding), emitted when the window closes; ``how`` adds each window's records without a
    partner. The pairs go to ``join_fn(left, right)`` (``output_schema``) or are projected by
    SQL ``exprs`` over ``left.`` / ``right.``. The runner runs it as a co-process step."""

    assigner: Any = None
    how: str = "inner"
    join_fn: Callable[[Any, Any], Any] | None = None
    exprs: tuple[Any, ...] = ()

    def describe(self) -> str:
        keys = _paired(self.keys, self.other_keys)
        what = _pairs_out("apply", self.join_fn, self.exprs)
        return (f"window join ({self.how}) of {self.inputs[0].name} and {self.inputs[1].name} on {keys}, "
                f"{_describe(self.assigner)} (python, keyed state): {what}{_dead(self)}")


@dataclass(frozen=True, eq=False)
class VectorizedProcessNode(Node):
    """A VectorizedKeyedFunction: one call per state bucket and micro-batch, columnar state."""

    keys: tuple[str, ...] = ()
    fn: Any = None
    output_schema: Any = None
    dead_letter: Any = None  # OutputTag: the records of a key its call fails on alone go there

    def describe(self) -> str:
        return f"process_batches {type(self.fn).__name__} by {', '.join(self.keys)} (vectorised, keyed state){_dead(self)}"


@dataclass(frozen=True, eq=False)
class WindowNode(Node):
    """A window step: records grouped by key (none: the whole stream) into windows by
    ``assigner``, emitted when ``trigger`` fires (None: the assigner's default), after
    ``evictor``, with ``allowed_lateness_ms`` and a late-data side output ``late_tag``;
    finished by built-in ``aggregates``, or a Python ``aggregate_fn`` / ``reduce_fn`` /
    ``window_fn``. How it runs is the runner's choice (Spark's runner: ``plain`` windows
    on Spark's native windowing, the rest on Ember's window operator)."""

    keys: tuple[Any, ...] = ()
    assigner: WindowAssigner | None = None
    trigger: Any = None  # None = the assigner's default
    evictor: Any = None
    allowed_lateness_ms: int = 0
    late_tag: Any = None  # OutputTag
    aggregates: tuple[tuple[str, Aggregate], ...] = ()  # built-in aggregates, or:
    aggregate_fn: Any = None  # AggregateFunction
    reduce_fn: Any = None
    window_fn: Any = None  # ProcessWindowFunction
    output_schema: Any = None
    label: str = ""  # how the window was declared, e.g. "count window 100"
    dead_letter: Any = None  # OutputTag: records aggregate_fn.add / reduce_fn raises on go there

    @property
    def plain(self) -> bool:
        """Built-in aggregates on a tumbling, sliding or processing-time session window
        with its default trigger: no evictor, no allowed lateness, no late-data output, no
        Python function (Spark's native windowing runs it)."""
        return bool(self.aggregates) and is_plain_window(
            self.assigner, self.trigger, self.evictor, self.allowed_lateness_ms, self.late_tag
        )

    def describe(self) -> str:
        parts = [self.label or _describe(self.assigner)]
        if self.trigger is not None:
            parts.append(f"trigger {self.trigger.describe()}")
        if self.evictor is not None:
            parts.append(f"evictor {self.evictor.describe()}")
        if self.allowed_lateness_ms:
            parts.append(f"allowed lateness {self.allowed_lateness_ms} ms")
        if self.late_tag is not None:
            parts.append(f"late data -> side output '{self.late_tag.name}'")
        if self.dead_letter is not None:
            parts.append(f"failures -> '{self.dead_letter.name}'")
        if self.aggregates:
            what = ", ".join(f"{name}={a.describe()}" for name, a in self.aggregates)
        else:
            fns = [type(f).__name__ if not callable(f) or hasattr(f, "process") else _callable_name(f)
                   for f in (self.aggregate_fn, self.reduce_fn, self.window_fn) if f is not None]
            what = " + ".join(fns)
        keys = ", ".join(str(k) for k in self.keys) or "(all)"
        return f"window {'; '.join(parts)} by {keys}: {what}"


def is_plain_window(assigner: Any, trigger: Any, evictor: Any, allowed_lateness_ms: int, late_tag: Any) -> bool:
    """A window Spark's native windowing runs as Flink would: tumbling, sliding, or a
    processing-time session window, with its default trigger (left out, or declared: one
    pipeline, one meaning), no evictor, no allowed lateness and no late-data output (see
    :attr:`WindowNode.plain`). Not an event-time session window: Spark drops a record
    behind the watermark that Flink merges into a session still open."""
    event_time_sessions = isinstance(assigner, SessionWindows) and not assigner.processing_time
    timed = isinstance(assigner, TumblingWindows | SlidingWindows | SessionWindows) and not event_time_sessions
    default = ProcessingTimeTrigger if timed and assigner.processing_time else EventTimeTrigger
    default_trigger = trigger is None or type(trigger) is default
    return timed and default_trigger and evictor is None and not allowed_lateness_ms and late_tag is None


@dataclass(frozen=True, eq=False)
class ParseJsonNode(Node):
    """Decode a JSON text field into typed fields; undecodable records go to a dead-letter side output."""

    field: str = ""
    fields: tuple[tuple[str, str, bool], ...] = ()  # (name, type, nullable)
    dead_letter: Any = None  # OutputTag

    def describe(self) -> str:
        decl = ", ".join(f"{n} {t}{'' if null else ' not null'}" for n, t, null in self.fields)
        return f"parse_json {self.field} -> {decl} (vectorised; bad records -> '{self.dead_letter.name}')"


@dataclass(frozen=True, eq=False)
class SideOutputNode(Node):
    """The records a step emitted to one side output (an OutputTag)."""

    tag: Any = None

    def describe(self) -> str:
        return f"side output '{self.tag.name}' of {self.inputs[0].name}"


@dataclass(frozen=True, eq=False)
class SinkNode(Node):
    sink: Any = None

    def describe(self) -> str:
        return f"sink {self.sink.describe()}"


def _is_column(obj: Any) -> bool:
    return type(obj).__name__ == "Column"
