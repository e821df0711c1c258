"""Flink's interval join as a co-process function on Ember's keyed runtime.

Used where the join has another stateful step before or after it in the job (alone, it
runs on Spark's native stream-stream join: translators/joins.py, same semantics). Each
record that is not late (``ts < watermark``, Flink's rule: dropped and counted) is paired
with the other side's waiting records of its key within the bounds
(``left.ts + lower <= right.ts <= left.ts + upper``) and then waits itself: a left record
until the watermark passes ``ts + upper`` (no right record that is not late can match it
after that), a right record until it passes ``ts - lower`` — an event-time timer each. A
pair carries the later record's timestamp (Flink's); in an outer join, a record that
leaves without a partner is emitted alone, with its own timestamp.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from ember.functions import Context, KeyedCoProcessFunction, RuntimeContext
from ember.runner.spark.keyed.pairs import Pairs, outer_sides
from ember.runner.spark.keyed.windows import LATE_COUNTER
from ember.state.descriptors import ValueStateDescriptor

__all__ = ["IntervalJoinFunction"]

# per key: ([left], [right]), each record [timestamp, record, matched]
_WAITING = ValueStateDescriptor("interval join")


class IntervalJoinFunction(KeyedCoProcessFunction):
    """The pairs of an interval join. ``pair(left, right)`` makes the output rows of one
    pair (a list; either side None for an outer join's record without a partner); with
    ``dead_letter``, a pair it fails on is a dead letter (keyed/pairs.py)."""

    def __init__(self, lower_ms: int, upper_ms: int, how: str, pair: Callable[[Any, Any], list[Any]],
                 dead_letter: str | None = None) -> None:
        self.lower, self.upper, self.pairs = lower_ms, upper_ms, Pairs(pair, dead_letter)
        self.outer = outer_sides(how)

    def open(self, ctx: RuntimeContext) -> None:
        self.waiting = ctx.get_state(_WAITING)

    def process_element1(self, value: dict[str, Any], ctx: Context) -> Iterator[Any] | None:
        return self._add(0, value, ctx)

    def process_element2(self, value: dict[str, Any], ctx: Context) -> Iterator[Any] | None:
        return self._add(1, value, ctx)

    def _deadline(self, side: int, ts: int) -> int:
        """When a record of ``side`` stamped ``ts`` can no longer match: the watermark past it."""
        return ts + (self.upper if side == 0 else -self.lower) + 1

    def _add(self, side: int, value: dict[str, Any], ctx: Context) -> Iterator[Any] | None:
        ts = ctx.timestamp
        assert ts is not None  # an interval join runs in event time only
        watermark = ctx.current_watermark
        if watermark is not None and ts < watermark:
            runtime: Any = ctx  # the keyed runtime counts it: late_dropped
            runtime.count(LATE_COUNTER)
            return None
        waiting: tuple[list[Any], list[Any]] = self.waiting.value() or ([], [])
        entry = [ts, value, False]
        pairs = []
        for other in waiting[1 - side]:
            left_ts, right_ts = (ts, other[0]) if side == 0 else (other[0], ts)
            if left_ts + self.lower <= right_ts <= left_ts + self.upper:
                entry[2] = other[2] = True
                pairs.append((max(left_ts, right_ts), *((value, other[1]) if side == 0 else (other[1], value))))
        waiting[side].append(entry)
        self.waiting.update(waiting)
        ctx.register_event_time_timer(self._deadline(side, ts))
        return self._emit(pairs, ctx) if pairs else None

    def _emit(self, pairs: list[tuple[int, Any, Any]], ctx: Context) -> Iterator[Any]:
        """Each pair's rows with its timestamp (the runtime stamps rows appended after a mark)."""
        runtime: Any = ctx
        for ts, left, right in pairs:
            runtime.emitting(runtime.out, ts)
            yield from self.pairs(left, right, ctx)

    def on_timer(self, timestamp: int, ctx: Context) -> Iterator[Any] | None:
        waiting = self.waiting.value()
        if not waiting:
            return None
        alone: list[tuple[int, Any, Any]] = []
        kept: tuple[list[Any], list[Any]] = ([], [])
        for side in (0, 1):
            for entry in waiting[side]:
                if self._deadline(side, entry[0]) > timestamp:
                    kept[side].append(entry)
                elif self.outer[side] and not entry[2]:
                    alone.append((entry[0], entry[1], None) if side == 0 else (entry[0], None, entry[1]))
        if kept[0] or kept[1]:
            self.waiting.update(kept)
        else:
            self.waiting.clear()
        return self._emit(alone, ctx) if alone else None
