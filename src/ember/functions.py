"""User function interfaces: what a user subclasses (``KeyedProcessFunction``,
``AggregateFunction``, ``ProcessWindowFunction``, ...) and the contexts those
functions receive. Declarations only: the runner implements the contexts."""

from __future__ import annotations

import json
from typing import Any, Iterable

from ember.errors import ConfigError
from ember.state.descriptors import StateDescriptor
from ember.state.interfaces import ValueState
from ember.time.timers import TimerService

__all__ = [
    "KeyedProcessFunction",
    "KeyedCoProcessFunction",
    "KeyedBroadcastProcessFunction",
    "BroadcastProcessFunction",
    "VectorizedKeyedFunction",
    "BatchContext",
    "AggregateFunction",
    "ProcessWindowFunction",
    "WindowContext",
    "OutputTag",
    "RuntimeContext",
    "Context",
    "ValueState",  # re-exported from ember.state.interfaces
    "DEAD_LETTER_SCHEMA",
    "record_text",
]


class OutputTag:
    """Names a side output: a secondary stream a function writes with
    ``ctx.output(tag, record)`` and a pipeline reads with
    ``stream.get_side_output(tag)``. ``schema`` (Spark DDL) types its records;
    a window's late-data tag may leave it out (it carries the input records)."""

    def __init__(self, name: str, schema: Any = None) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"OutputTag: name must be an identifier (letters, digits, _), got {name!r}")
        self.name, self.schema = name, schema

    def __repr__(self) -> str:
        return f"OutputTag({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OutputTag) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("OutputTag", self.name))


DEAD_LETTER_SCHEMA = "raw string, error string"  # a dead-letter record: the input as text, and why it failed


def record_text(record: Any) -> str:
    """A record as JSON text for a dead letter's ``raw`` (values JSON cannot hold as their text)."""
    return json.dumps(record, default=str, ensure_ascii=False)


class AggregateFunction:
    """Incremental aggregation: ``create_accumulator``, ``add``, ``merge``, ``get_result``."""

    def create_accumulator(self) -> Any:
        raise NotImplementedError

    def add(self, value: Any, accumulator: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def get_result(self, accumulator: Any) -> Any:
        raise NotImplementedError


class RuntimeContext:
    """Given to :meth:`KeyedProcessFunction.open`: declares state.

    ``get_state`` returns the state object matching the descriptor: a value,
    list, map, reducing or aggregating state (:mod:`ember.state.interfaces`).
    """

    def get_state(self, descriptor: StateDescriptor) -> Any:
        raise NotImplementedError


class Context(TimerService):
    """Given with every element and timer: the current key, the element's (or
    timer's) timestamp, the current watermark and processing time (epoch ms),
    and the timer service of the current key (a due timer calls ``on_timer``)."""

    current_key: Any
    timestamp: int | None

    def output(self, tag: OutputTag, record: Any) -> None:
        """Emit ``record`` (a dict or tuple in the tag's schema) to the side output ``tag``.
        Records for a tag no pipeline reads with ``get_side_output`` are discarded."""
        raise NotImplementedError


class WindowContext:
    """Given to :meth:`ProcessWindowFunction.process`: the window being emitted
    (``window.start`` / ``window.end``, epoch ms), the current watermark and
    processing time, and side outputs."""

    window: Any

    @property
    def current_watermark(self) -> int | None:
        raise NotImplementedError

    @property
    def current_processing_time(self) -> int:
        raise NotImplementedError

    def output(self, tag: OutputTag, record: Any) -> None:
        raise NotImplementedError


class ProcessWindowFunction:
    """Whole-window logic: ``process(key, context, elements)`` gets every element
    of a window when it fires (or, after ``aggregate(fn, window_function=...)``,
    the one aggregated result) and yields output records in its output schema."""

    def process(self, key: Any, context: WindowContext, elements: list[Any]) -> Iterable[Any] | None:
        raise NotImplementedError


class KeyedProcessFunction:
    """Per-record logic with managed keyed state.

    Override :meth:`process_element`; it receives each record (a dict) and a
    :class:`Context`, and yields (or returns an iterable of) output records —
    dicts or tuples in the output schema's order. Declare state in
    :meth:`open` with ``ctx.get_state(ValueStateDescriptor(...))``; the state
    objects always refer to the key of the record being processed.
    """

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Called once per task before the first element."""

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        """Called for a timer of ``ctx.current_key``; yields output records like ``process_element``."""
        return None


class KeyedCoProcessFunction:
    """Per-record logic over two connected keyed streams with *shared* keyed state and
    timers (Flink's ``KeyedCoProcessFunction``): ``a.connect(b).key_by(ka, kb).process(fn, schema)``.

    :meth:`process_element1` receives the first stream's records, :meth:`process_element2`
    the second's, both with the same :class:`Context` as a :class:`KeyedProcessFunction`'s:
    state declared in :meth:`open` and timers refer to the current key, whichever stream
    the record came from. Within a micro-batch a key's records of both streams are processed
    in timestamp order (event time), else in arrival order.
    """

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Called once per task before the first element."""

    def process_element1(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError

    def process_element2(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        """Called for a timer of ``ctx.current_key``; yields output records."""
        return None


class KeyedBroadcastProcessFunction:
    """A keyed stream checked against *broadcast state*: state every task holds the same
    copy of, written by a second stream (Flink's dynamic-rules pattern):
    ``events.key_by(k).connect(rules.broadcast(descriptor)).process(fn, schema)``.

    - :meth:`process_broadcast_element` gets each record of the broadcast stream, with
      ``ctx.get_broadcast_state(descriptor)`` read-write (a MapState). It runs on every
      task with the same records in the same order, so every copy stays the same. It has
      no current key: keyed state and timers raise, except through
      ``ctx.apply_to_keyed_state(descriptor, fn)``, which calls ``fn(key, state)`` for every
      key holding that (keyed) state. What it yields (and its side outputs) is emitted once.
    - :meth:`process_element` gets each keyed record, with keyed state, timers and
      ``ctx.get_broadcast_state(descriptor)`` read-only (writing it raises).
    - :meth:`on_timer` as in a :class:`KeyedProcessFunction`, broadcast state read-only.

    Within a micro-batch both streams' records are processed in timestamp order (event
    time: each stream needs a watermark strategy, and the step's watermark is the least of
    the two, as in Flink), a broadcast record before keyed records of the same timestamp;
    without event time, the batch's broadcast records before its keyed records. Broadcast
    state is checkpointed with the keyed state: exactly once across restarts, in savepoints.
    """

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Called once per task before the first element: declare keyed state here."""

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError

    def process_broadcast_element(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        """Called for a timer of ``ctx.current_key``; yields output records."""
        return None


class BroadcastProcessFunction:
    """A *non-keyed* stream checked against broadcast state (Flink's
    ``BroadcastProcessFunction``): ``events.connect(rules.broadcast(descriptor)).process(fn,
    schema)``, for rules that apply to every record alike, with no state per key.

    - :meth:`process_broadcast_element` gets each record of the broadcast stream, with
      ``ctx.get_broadcast_state(descriptor)`` read-write; it runs on every task with the same
      records in the same order, and what it yields is emitted once.
    - :meth:`process_element` gets each record of the other stream, with the broadcast state
      read-only.

    Both contexts offer ``timestamp``, ``current_watermark``, ``current_processing_time``,
    ``output(tag, record)`` and ``get_broadcast_state``; there is no current key, keyed
    state or timers (key the stream first and use a :class:`KeyedBroadcastProcessFunction`
    for those). Broadcast state is exactly once across restarts and in savepoints, as for
    the keyed variant.
    """

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Called once per task before the first element (there is no keyed state to declare)."""

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError

    def process_broadcast_element(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError


class BatchContext:
    """Given to :meth:`VectorizedKeyedFunction.process_batch`: the micro-batch's
    watermark (event time, else None) and processing time, epoch ms."""

    current_watermark: int | None
    current_processing_time: int


class VectorizedKeyedFunction:
    """Keyed logic over many keys at once, for speed: pandas in, columnar state in and out.

    ``state_schema`` (Spark DDL, e.g. ``"state int"``) declares the per-key state
    columns. Ember calls :meth:`process_batch` once per state bucket and
    micro-batch (not per key, not per record) with

    - ``events``: the bucket's records of this batch, a pandas DataFrame sorted
      by key, then by timestamp (event time) or arrival order;
    - ``state``: the current state of the keys in ``events`` that have any, a
      DataFrame indexed by key (a MultiIndex for several key fields) with the
      ``state_schema`` columns;

    and it returns ``(output, updates)``: output rows (a DataFrame with the
    step's output_schema columns, or None) and state updates (a DataFrame indexed
    by key with the state columns, or None). An update row replaces the key's
    state; a row of nulls deletes it; keys without an update row keep theirs.
    No timers in this variant: use a :class:`KeyedProcessFunction` for those.
    """

    state_schema: str = ""

    def open(self) -> None:  # noqa: B027 - optional hook
        """Called once per task before the first batch."""

    def process_batch(self, events: Any, state: Any, ctx: BatchContext) -> tuple[Any, Any]:
        raise NotImplementedError
