"""Flink's window join as a co-process function on Ember's keyed runtime.

Each record of either stream goes into keyed state under every window of the assigner
that has not closed yet (Flink's rule: a window is late once the watermark reached its
last timestamp); a record with no open window is late, dropped and counted. The first
record of a window registers an event-time timer at the window's last timestamp; when it
fires, the window's pairs (and, in an outer join, its records without a partner) are
emitted — with that timestamp, as Flink's window operator does — and the window is
dropped from state. Records are kept in arrival order per side, the runtime having sorted
each key's rows by timestamp within a batch.

Session windows (``SessionJoinFunction``) merge over both streams, as Flink's window join
(a coGroup of the two streams' union, windowed per key) does: a record opens the session
``[ts, ts + gap)``, which merges with every open session of its key it overlaps or touches
(with their records and their timers: one timer, at the merged session's last timestamp).
A record that merges with nothing and whose session has already closed is late.

Processing-time windows (and sessions) take each record at the micro-batch's processing time
(Spark's batch timestamp, the same for a replayed batch) and fire on processing-time timers;
no record is late for them.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ember.functions import Context, KeyedCoProcessFunction, RuntimeContext
from ember.runner.spark.keyed.pairs import Pairs, outer_sides
from ember.runner.spark.keyed.windows import LATE_COUNTER
from ember.state.descriptors import ValueStateDescriptor
from ember.windowing.assigners import SessionWindows, SlidingWindows, TimeWindow, TumblingWindows

__all__ = ["WindowJoinFunction", "SessionJoinFunction", "window_join_function"]

_WINDOWS = ValueStateDescriptor("window join")  # {window start: ([left records], [right records])}
_SESSIONS = ValueStateDescriptor("session join")  # {TimeWindow: ([left records], [right records])}


def window_join_function(assigner: TumblingWindows | SlidingWindows | SessionWindows, how: str,
                         pair: Callable[[Any, Any], list[Any]], dead_letter: str | None = None) -> KeyedCoProcessFunction:
    """The co-process function joining the windows of ``assigner``."""
    if isinstance(assigner, SessionWindows):
        return SessionJoinFunction(assigner.gap_ms, how, pair, dead_letter, assigner.processing_time)
    return WindowJoinFunction(assigner, how, pair, dead_letter)


def _pairs_of(pairs: Pairs, outer: tuple[bool, bool], lefts: list[Any], rights: list[Any], ctx: Context) -> list[Any]:
    """A window's output: every pair, and in an outer join each record of a side without partners."""
    out: list[Any] = []
    for left in lefts:
        for right in rights:
            out.extend(pairs(left, right, ctx))
    if outer[0] and not rights:
        for left in lefts:
            out.extend(pairs(left, None, ctx))
    if outer[1] and not lefts:
        for right in rights:
            out.extend(pairs(None, right, ctx))
    return out


class _JoinedWindows(KeyedCoProcessFunction):
    """What both window joins share: the pair function, the outer sides, one entry point per stream."""

    def __init__(self, how: str, pair: Callable[[Any, Any], list[Any]], dead_letter: str | None, processing: bool) -> None:
        self.pairs = Pairs(pair, dead_letter)
        self.outer = outer_sides(how)
        self.processing = processing

    def _time(self, ctx: Context) -> tuple[int, int | None]:
        """The record's time in the windows' domain, and the watermark it is late behind (None: never late)."""
        if self.processing:
            return ctx.current_processing_time, None
        assert ctx.timestamp is not None  # the translator requires event time for event-time windows
        return ctx.timestamp, ctx.current_watermark

    def _register(self, ctx: Context, timestamp: int) -> None:
        if self.processing:
            ctx.register_processing_time_timer(timestamp)
        else:
            ctx.register_event_time_timer(timestamp)

    def _delete(self, ctx: Context, timestamp: int) -> None:
        if self.processing:
            ctx.delete_processing_time_timer(timestamp)
        else:
            ctx.delete_event_time_timer(timestamp)

    def process_element1(self, value: dict[str, Any], ctx: Context) -> None:
        self._add(0, value, ctx)

    def process_element2(self, value: dict[str, Any], ctx: Context) -> None:
        self._add(1, value, ctx)

    def _add(self, side: int, value: dict[str, Any], ctx: Context) -> None:
        raise NotImplementedError


class WindowJoinFunction(_JoinedWindows):
    """The pairs of each key's windows. ``pair(left, right)`` makes the output rows of one
    pair (a list; either side None in an outer join); with ``dead_letter``, a pair it fails
    on is a dead letter (keyed/pairs.py)."""

    def __init__(self, assigner: TumblingWindows | SlidingWindows, how: str, pair: Callable[[Any, Any], list[Any]],
                 dead_letter: str | None = None) -> None:
        super().__init__(how, pair, dead_letter, assigner.processing_time)
        self.assigner, self.size = assigner, assigner.size_ms

    def open(self, ctx: RuntimeContext) -> None:
        self.windows = ctx.get_state(_WINDOWS)

    def _add(self, side: int, value: dict[str, Any], ctx: Context) -> None:
        time, watermark = self._time(ctx)
        table: dict[int, tuple[list[Any], list[Any]]] | None = None
        for window in self.assigner.assign(time):
            if watermark is not None and window.max_timestamp <= watermark:
                continue  # closed: the record is late for it
            if table is None:
                table = self.windows.value() or {}
            entry = table.get(window.start)
            if entry is None:
                entry = table[window.start] = ([], [])
                self._register(ctx, window.max_timestamp)
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
        return _pairs_of(self.pairs, self.outer, lefts, rights, ctx)


class SessionJoinFunction(_JoinedWindows):
    """The pairs of each key's sessions (gap ``gap_ms``), merged over both streams."""

    def __init__(self, gap_ms: int, how: str, pair: Callable[[Any, Any], list[Any]], dead_letter: str | None = None,
                 processing: bool = False) -> None:
        super().__init__(how, pair, dead_letter, processing)
        self.gap = gap_ms

    def open(self, ctx: RuntimeContext) -> None:
        self.sessions = ctx.get_state(_SESSIONS)

    def _add(self, side: int, value: dict[str, Any], ctx: Context) -> None:
        time, watermark = self._time(ctx)
        new = TimeWindow(time, time + self.gap)
        sessions: dict[TimeWindow, tuple[list[Any], list[Any]]] = self.sessions.value() or {}
        touching = sorted(w for w in sessions if w.intersects(new))  # overlapping or touching: one session now
        merged = new
        for w in touching:
            merged = merged.cover(w)
        if watermark is not None and merged.max_timestamp <= watermark:
            runtime: Any = ctx  # closed (only when it touches no open session): late, the keyed runtime counts it
            runtime.count(LATE_COUNTER)
            return
        lefts: list[Any] = []
        rights: list[Any] = []
        for w in touching:  # the merged sessions' records, earliest session first, and one timer
            old_lefts, old_rights = sessions.pop(w)
            lefts += old_lefts
            rights += old_rights
            if w.end != merged.end:
                self._delete(ctx, w.max_timestamp)
        (lefts, rights)[side].append(value)
        sessions[merged] = (lefts, rights)
        self._register(ctx, merged.max_timestamp)  # (registered once if pending already)
        self.sessions.update(sessions)

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        sessions: dict[TimeWindow, tuple[list[Any], list[Any]]] = self.sessions.value() or {}
        due = next((w for w in sessions if w.max_timestamp == timestamp), None)
        if due is None:
            return None
        lefts, rights = sessions.pop(due)
        if sessions:
            self.sessions.update(sessions)
        else:
            self.sessions.clear()
        return _pairs_of(self.pairs, self.outer, lefts, rights, ctx)
