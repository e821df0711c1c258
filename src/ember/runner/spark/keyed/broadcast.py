"""A keyed stream and a broadcast stream as one input of Ember's keyed runtime.

``events.key_by(k).connect(rules.broadcast(d)).process(fn)`` runs ``fn`` (a
:class:`~ember.functions.KeyedBroadcastProcessFunction`) as one keyed step. The runner
unions both streams into rows of one shape (ember.coprocess's: which input, the key
fields, each stream's fields under its own prefix) and sends every broadcast row to
*every* state bucket (translators/coprocess.py), so each bucket keeps its own copy of the
broadcast state (blob[BROADCAST], checkpointed with the bucket) and every copy sees the
same records in the same order: the same state everywhere, as Flink's broadcast state on
every task. :class:`BroadcastAdapter` hands each row back to ``process_element`` or
``process_broadcast_element``; of a broadcast record's copies only the one in bucket 0
emits (``FIRST``), so its output is emitted once.

A non-keyed stream's ``connect(rules.broadcast(d)).process(fn)`` (a
:class:`~ember.functions.BroadcastProcessFunction`) runs the same way: its rows are spread
over the buckets by a hash of the whole record (placement only), and
:class:`UnkeyedBroadcast` hands ``fn`` a context without key, keyed state or timers.
"""

from __future__ import annotations

from typing import Any, Iterable

from ember.coprocess import INPUT, field_column
from ember.functions import (
    BroadcastProcessFunction,
    Context,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    RuntimeContext,
)
from ember.runner.spark.keyed.runtime import NO_KEY, KeyedRuntime
from ember.state.descriptors import MapStateDescriptor

__all__ = ["BroadcastAdapter", "UnkeyedBroadcast", "BROADCAST_INPUT", "KEYED_INPUT", "FIRST"]

# INPUT of a broadcast row sorts before a keyed row's: at equal timestamps broadcast first.
BROADCAST_INPUT, KEYED_INPUT = 0, 1
FIRST = "__ember_first_copy"  # on a broadcast row: whether its output is kept (bucket 0's copy)


class BroadcastAdapter(KeyedProcessFunction):
    """``fn``'s two inputs as one: a keyed row becomes its record for ``process_element``,
    a broadcast row its record for ``process_broadcast_element`` (no current key, the
    broadcast state writable)."""

    def __init__(self, fn: KeyedBroadcastProcessFunction, fields: list[str], broadcast_fields: list[str],
                 descriptors: tuple[MapStateDescriptor, ...]) -> None:
        self.fn, self.descriptors = fn, descriptors
        self.columns = ([(f, field_column(1, f)) for f in fields], [(f, field_column(2, f)) for f in broadcast_fields])

    def open(self, ctx: RuntimeContext) -> None:
        assert isinstance(ctx, KeyedRuntime)
        ctx.declare_broadcast(self.descriptors)
        self.fn.open(ctx)

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        if value[INPUT] == KEYED_INPUT:
            return self.fn.process_element({f: value[c] for f, c in self.columns[0]}, ctx)
        assert isinstance(ctx, KeyedRuntime)
        return self._broadcast({f: value[c] for f, c in self.columns[1]}, bool(value[FIRST]), ctx)

    def _broadcast(self, record: dict[str, Any], first: bool, rt: KeyedRuntime) -> list[Any] | None:
        slot, key, tags = rt.current, rt.current_key, rt.side_tags
        rt.current, rt.current_key, rt.broadcast_writable = NO_KEY, None, True
        if not first:
            rt.side_tags = frozenset()  # the other copies' side outputs are dropped, as their output
        try:
            result = self.fn.process_broadcast_element(record, rt)
            rows = list(result) if result is not None else None  # run it (a generator) while writable
        finally:
            rt.current, rt.current_key, rt.broadcast_writable, rt.side_tags = slot, key, False, tags
        return rows if first else None

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        return self.fn.on_timer(timestamp, ctx)

    @property
    def user_name(self) -> str:
        return str(getattr(self.fn, "user_name", type(self.fn).__name__))

    def failed_call(self, value: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
        """The method a failed row went to, its record, and whether this copy reports it (a
        broadcast record fails alike in every bucket: bucket 0's copy reports it)."""
        if value[INPUT] == KEYED_INPUT:
            return f"{self.user_name}.process_element", {f: value[c] for f, c in self.columns[0]}, True
        return (f"{self.user_name}.process_broadcast_element", {f: value[c] for f, c in self.columns[1]},
                bool(value[FIRST]))


class UnkeyedBroadcast(KeyedBroadcastProcessFunction):
    """A :class:`~ember.functions.BroadcastProcessFunction` as the keyed variant: each call
    gets a :class:`_NoKey` view of the runtime (no key, keyed state or timers)."""

    def __init__(self, fn: BroadcastProcessFunction) -> None:
        self.fn = fn
        self.user_name = type(fn).__name__

    def open(self, ctx: RuntimeContext) -> None:
        assert isinstance(ctx, KeyedRuntime)
        self.view = _NoKey(ctx, type(self.fn).__name__)
        self.fn.open(self.view)  # type: ignore[arg-type]

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        return self.fn.process_element(value, self.view)  # type: ignore[arg-type]

    def process_broadcast_element(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        return self.fn.process_broadcast_element(value, self.view)  # type: ignore[arg-type]


class _NoKey:
    """What a BroadcastProcessFunction's context offers (Flink's ReadOnlyContext / Context of a
    non-keyed stream): the record's time, the watermark, processing time, side outputs and the
    broadcast state (writable in process_broadcast_element); anything keyed is not there (an
    AttributeError saying so, which the runtime reports naming the step and the record)."""

    __slots__ = ("_rt", "_fn")

    def __init__(self, rt: KeyedRuntime, fn: str) -> None:
        self._rt, self._fn = rt, fn

    timestamp = property(lambda self: self._rt.timestamp)
    current_watermark = property(lambda self: self._rt.current_watermark)
    current_processing_time = property(lambda self: self._rt.current_processing_time)

    def output(self, tag: Any, record: Any) -> None:
        self._rt.output(tag, record)

    def get_broadcast_state(self, descriptor: Any) -> Any:
        return self._rt.get_broadcast_state(descriptor)

    def __getattr__(self, name: str) -> Any:  # an AttributeError: hasattr / getattr(ctx, name, default) work
        raise AttributeError(
            f"{self._fn}: ctx.{name} is not there — a BroadcastProcessFunction reads a non-keyed stream "
            "(no key, keyed state or timers); key the stream (key_by before connect) and use a "
            "KeyedBroadcastProcessFunction for those"
        )
