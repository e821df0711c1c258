"""Flink's window join as a co-process function on Ember's keyed runtime.

Each record of either stream goes into keyed state under every window of the assigner
that has not closed yet (Flink's rule: a window is late once the watermark reached its
last timestamp); a record with no open window is late, dropped and counted. The first
record of a window registers an event-time timer at the window's last timestamp; when it
fires, the window's pairs (and, in an outer join, its records without a partner) are
emitted — with that timestamp, as Flink's window operator does — and the window is
dropped from state. Records are kept in arrival order per side, the runtime having sorted
each key's rows by timestamp within a batch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ember.functions import Context, KeyedCoProcessFunction, RuntimeContext
from ember.runner.spark.keyed.pairs import Pairs
from ember.runner.spark.keyed.windows import LATE_COUNTER
from ember.state.descriptors import ValueStateDescriptor
from ember.windowing.assigners import SlidingWindows, TumblingWindows

__all__ = ["WindowJoinFunction"]

_WINDOWS = ValueStateDescriptor("window join")  # {window start: ([left records], [right records])}


class WindowJoinFunction(KeyedCoProcessFunction):
    """The pairs of each key's windows. ``pair(left, right)`` makes the output rows of one
    pair (a list; either side None in an outer join); with ``dead_letter``, a pair it fails
    on is a dead letter (keyed/pairs.py)."""

    def __init__(self, assigner: TumblingWindows | SlidingWindows, how: str, pair: Callable[[Any, Any], list[Any]],
                 dead_letter: str | None = None) -> None:
        self.assigner, self.pairs = assigner, Pairs(pair, dead_letter)
        self.size = assigner.size_ms
        self.outer = (how in ("left_outer", "full_outer"), how in ("right_outer", "full_outer"))

    def open(self, ctx: RuntimeContext) -> None:
        self.windows = ctx.get_state(_WINDOWS)

    def process_element1(self, value: dict[str, Any], ctx: Context) -> None:
        self._add(0, value, ctx)

    def process_element2(self, value: dict[str, Any], ctx: Context) -> None:
        self._add(1, value, ctx)

    def _add(self, side: int, value: dict[str, Any], ctx: Context) -> None:
        assert ctx.timestamp is not None  # a window join runs in event time only
        watermark = ctx.current_watermark
        table: dict[int, tuple[list[Any], list[Any]]] | None = None
        for window in self.assigner.assign(ctx.timestamp):
            if watermark is not None and window.max_timestamp <= watermark:
                continue  # closed: the record is late for it
            if table is None:
                table = self.windows.value() or {}
            entry = table.get(window.start)
            if entry is None:
                entry = table[window.start] = ([], [])
                ctx.register_event_time_timer(window.max_timestamp)
            entry[side].append(value)
        if table is None:
            runtime: Any = ctx  # the keyed runtime counts it: late_dropped
            runtime.count(LATE_COUNTER)
        else:
            self.windows.update(table)

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        table = self.windows.value() or {}
        entry = table.pop(timestamp + 1 - self.size, None)
        if table:
            self.windows.update(table)
        else:
            self.windows.clear()
        if entry is None:
            return None
        lefts, rights = entry
        out: list[Any] = []
        for left in lefts:
            for right in rights:
                out.extend(self.pairs(left, right, ctx))
        if self.outer[0] and not rights:
            for left in lefts:
                out.extend(self.pairs(left, None, ctx))
        if self.outer[1] and not lefts:
            for right in rights:
                out.extend(self.pairs(None, right, ctx))
        return out
