"""Joins of two streams: Flink's interval join, ``a.key_by(k).interval_join(b.key_by(k))``,
and window join, ``a.join(b).where(k).equal_to(k).window(assigner).apply(fn)``.

Declared here, checked when declared; the runner compiles it to Spark's native
stream-stream join with watermarks (docs/joins.md). This module knows streams only
through what :class:`~ember.api.datastream.KeyedStream` hands it, so the API's
modules import one way.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

from ember.api.dead_letters import optional_dead_letter_tag
from ember.errors import ConfigError, PipelineError
from ember.graph import nodes as n
from ember.time.durations import to_ms
from ember.windowing.assigners import SessionWindows, SlidingWindows, TumblingWindows, WindowAssigner

__all__ = ["IntervalJoin", "WindowJoin"]


def _signed_ms(value: timedelta | int, what: str) -> int:
    """``value`` in whole milliseconds, negative allowed (a bound before the left record)."""
    if isinstance(value, timedelta) and value < timedelta(0):
        return -to_ms(-value, what)
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return -to_ms(-value, what)
    return to_ms(value, what, allow_zero=True)


def _check_pair_function(fn: Any, output_schema: Any, what: str, step: str) -> None:
    """A join's ``fn(left, right)`` and its output schema, checked when declared."""
    if not callable(fn):
        raise PipelineError(f"{what} takes a function fn(left, right), got {fn!r}", step)
    if not output_schema:
        raise PipelineError(f"{what} needs an output_schema (Spark DDL string or StructType)", step)


def _projection(exprs: tuple[Any, ...], what: str, step: str) -> tuple[Any, ...]:
    """A join's ``select`` expressions, checked: SQL strings or Spark Columns."""
    for e in exprs:
        if not (isinstance(e, str) and e.strip()) and type(e).__name__ != "Column":
            raise PipelineError(f"{what} select takes SQL strings or Spark Columns, got {e!r}", step)
    return tuple(exprs)


class IntervalJoin:
    """``left.interval_join(right)``, waiting for :meth:`between` and then :meth:`process`
    or :meth:`select` (Flink's ``IntervalJoined``).

    A pair joins when its keys are equal and ``left.ts + lower <= right.ts <= left.ts +
    upper`` (both bounds inclusive, as in Flink), ``ts`` being each stream's event-time
    field. ``how="inner"`` is Flink's interval join; ``"left_outer"``, ``"right_outer"``
    and ``"full_outer"`` (Spark's) also emit each record that found no partner, with the
    other side null, once the watermark shows none can come.
    """

    def __init__(self, left: Any, right: Any, how: str, name: str | None, stream_type: type) -> None:
        step = name or "interval_join"
        if not hasattr(right, "keys") or not isinstance(getattr(right, "node", None), n.KeyByNode):
            raise PipelineError("interval_join takes a keyed stream: other.key_by(...)", step)
        if right._env is not left._env:
            raise PipelineError("cannot join streams of different environments", step)
        if how not in n.JOIN_KINDS:
            raise PipelineError(f"interval_join how must be one of {', '.join(n.JOIN_KINDS)}, got {how!r}", step)
        for side, keys in (("left", left.keys), ("right", right.keys)):
            if not all(isinstance(k, str) for k in keys):
                raise PipelineError(f"interval_join needs key_by with field names on the {side} stream (not Columns)", step)
        if len(left.keys) != len(right.keys):
            raise PipelineError(
                f"the two streams are keyed by {len(left.keys)} and {len(right.keys)} fields; "
                "interval_join pairs the keys in order, so both need as many", step,
            )
        self._left, self._right, self._how, self._name = left, right, how, name
        self._stream_type = stream_type
        self._bounds: tuple[int, int] | None = None

    def between(self, lower: timedelta | int, upper: timedelta | int) -> "IntervalJoin":
        """``right.ts`` within ``[left.ts + lower, left.ts + upper]`` (timedelta or ms; lower may be negative)."""
        step = self._name or "interval_join"
        try:
            lo, hi = _signed_ms(lower, "interval_join lower bound"), _signed_ms(upper, "interval_join upper bound")
        except ConfigError as e:
            raise PipelineError(str(e), step) from None
        if lo > hi:
            raise PipelineError(f"interval_join lower bound {lo} ms is after the upper bound {hi} ms", step)
        self._bounds = (lo, hi)
        return self

    def process(self, fn: Callable[[dict[str, Any] | None, dict[str, Any] | None], Any], output_schema: Any,
                *, dead_letter: Any = None, name: str | None = None) -> Any:
        """``fn(left, right)`` per joined pair (Flink's ``ProcessJoinFunction``): a record
        (dict or tuple in ``output_schema`` order), an iterable of records, or None. In an
        outer join the missing side is None. ``dead_letter=OutputTag(...)``: a pair ``fn``
        raises on (or whose result does not fit the schema) goes to that side output
        (``raw``: ``{"left": ..., "right": ...}``, ``error``: why) and the join goes on; the
        join then runs on Ember's keyed runtime rather than Spark's native join."""
        _check_pair_function(fn, output_schema, "interval_join process", self._step(name))
        dead = optional_dead_letter_tag(dead_letter, "interval_join dead_letter", name)
        return self._join(name, fn=fn, output_schema=output_schema, dead_letter=dead)

    def select(self, *exprs: str | Any, name: str | None = None) -> Any:
        """Project each joined pair with SQL over ``left.<field>`` and ``right.<field>``
        (``"left.ad_id AS ad_id"``, ``"right.ts - left.ts AS delay_ms"``); natively, no Python.
        Without expressions: every left field, then every right field (a right field whose
        name the left side has too is renamed ``right_<name>``)."""
        return self._join(name, exprs=_projection(exprs, "interval_join", self._step(name)))

    def _step(self, name: str | None) -> str:
        return name or self._name or "interval_join"

    def _join(self, name: str | None, **fields: Any) -> Any:
        if self._bounds is None:
            raise PipelineError("interval_join needs .between(lower, upper) before process/select", self._step(name))
        lo, hi = self._bounds
        left = self._left
        node = left._add(
            n.IntervalJoinNode, name or self._name, "interval_join", inputs=(left.node, self._right.node),
            left_keys=tuple(left.keys), right_keys=tuple(self._right.keys), lower_ms=lo, upper_ms=hi,
            how=self._how, **fields,
        )
        return self._stream_type(left._env, node)


class WindowJoin:
    """``left.join(right)`` (Flink's ``JoinedStreams``): ``.where(*left_keys)``,
    ``.equal_to(*right_keys)``, ``.window(assigner)``, then :meth:`apply` or :meth:`select`.

    Every pair of records with equal keys whose timestamps fall in the same window of the
    assigner (tumbling or sliding, event time) is emitted when the watermark passes the
    window's end, with the window's last timestamp (``end - 1``). A record whose every
    window has closed is late: dropped and counted (``late_dropped``). ``how="inner"`` is
    Flink's window join; ``"left_outer"``, ``"right_outer"`` and ``"full_outer"`` (Flink's
    coGroup) also emit, per window, each record that found no partner in it, the other side
    None. Runs on Ember's keyed runtime, both streams' records in keyed state until their
    window closes (docs/joins.md).
    """

    def __init__(self, left: Any, other: Any, how: str, name: str | None, stream_type: type) -> None:
        step = name or "window_join"
        right: Any = other
        if not isinstance(other, stream_type):
            raise PipelineError(f"join takes a DataStream, got {right!r}", step)
        if right._env is not left._env:
            raise PipelineError("cannot join streams of different environments", step)
        if how not in n.JOIN_KINDS:
            raise PipelineError(f"join how must be one of {', '.join(n.JOIN_KINDS)}, got {how!r}", step)
        self._left, self._right, self._how, self._name = left, right, how, name
        self._stream_type = stream_type
        self._keys: tuple[str, ...] | None = None
        self._other_keys: tuple[str, ...] | None = None
        self._assigner: WindowAssigner | None = None

    @staticmethod
    def _fields(keys: tuple[Any, ...], what: str, step: str) -> tuple[str, ...]:
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise PipelineError(f"join {what} takes field names, got {keys!r}", step)
        return tuple(keys)

    def where(self, *keys: str) -> "WindowJoin":
        """The left stream's key fields."""
        self._keys = self._fields(keys, "where", self._step(None))
        return self

    def equal_to(self, *keys: str) -> "WindowJoin":
        """The right stream's key fields, paired in order with ``where``'s."""
        step = self._step(None)
        if self._keys is None:
            raise PipelineError("join needs .where(...) before .equal_to(...)", step)
        other = self._fields(keys, "equal_to", step)
        if len(other) != len(self._keys):
            raise PipelineError(f"join: {len(self._keys)} key fields in where, {len(other)} in equal_to", step)
        self._other_keys = other
        return self

    def window(self, assigner: WindowAssigner) -> "WindowJoin":
        """The windows pairs must share: ``TumblingEventTimeWindows.of(...)``, ``SlidingEventTimeWindows.of(...)``
        or ``EventTimeSessionWindows.with_gap(...)`` (sessions merge over both streams), or their
        processing-time variants (a record in the windows of its micro-batch's processing time)."""
        step = self._step(None)
        if self._other_keys is None:
            raise PipelineError("join needs .where(...).equal_to(...) before .window(...)", step)
        if not isinstance(assigner, TumblingWindows | SlidingWindows | SessionWindows):
            raise PipelineError(
                f"a window join takes tumbling, sliding or session windows (event or processing time), got {assigner!r} "
                "(global windows are not supported for joins)", step,
            )
        self._assigner = assigner
        return self

    def apply(self, fn: Callable[[dict[str, Any] | None, dict[str, Any] | None], Any], output_schema: Any,
              *, dead_letter: Any = None, name: str | None = None) -> Any:
        """``fn(left, right)`` per pair (Flink's ``JoinFunction`` / ``FlatJoinFunction``): a record
        (dict or tuple in ``output_schema`` order), an iterable of records, or None. In an outer
        join the missing side is None. ``dead_letter=OutputTag(...)``: a pair ``fn`` raises on
        (or whose result does not fit the schema) goes to that side output (``raw``:
        ``{"left": ..., "right": ...}``, ``error``: why) and the window's other pairs go on."""
        _check_pair_function(fn, output_schema, "join apply", self._step(name))
        dead = optional_dead_letter_tag(dead_letter, "join dead_letter", name)
        return self._join(name, join_fn=fn, output_schema=output_schema, dead_letter=dead)

    def select(self, *exprs: str | Any, name: str | None = None) -> Any:
        """Project each pair with SQL over ``left.<field>`` and ``right.<field>``, natively.
        Without expressions: every left field, then every right field (a right field whose
        name the left side has too is renamed ``right_<name>``)."""
        return self._join(name, exprs=_projection(exprs, "join", self._step(name)))

    def _step(self, name: str | None) -> str:
        return name or self._name or "window_join"

    def _join(self, name: str | None, **fields: Any) -> Any:
        if self._assigner is None or self._keys is None or self._other_keys is None:
            raise PipelineError("join needs .where(...).equal_to(...).window(...) before apply/select", self._step(name))
        left, right = self._left.key_by(*self._keys), self._right.key_by(*self._other_keys)
        node = left._add(
            n.WindowJoinNode, name or self._name, "window_join", inputs=(left.node, right.node),
            keys=self._keys, other_keys=self._other_keys, assigner=self._assigner, how=self._how, **fields,
        )
        return self._stream_type(left._env, node)
