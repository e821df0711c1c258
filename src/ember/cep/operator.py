"""The CEP step: a :class:`~ember.functions.KeyedProcessFunction` running a pattern's
matcher per key on Ember's keyed runtime — so its partial matches are keyed state:
checkpointed, exactly once, in savepoints, restart-checked like any process step.

Event time (Flink's CEP operator): each key's events wait in keyed state until the watermark
passes them, then go to the matcher in timestamp order (arrival order on ties), and time
advances to the watermark (timing out partial matches, completing trailing negative
stages). An event at or behind the watermark when it arrives is late: dropped and counted in
``late_dropped``, or sent to the ``late`` side output when one is given (Flink's
``sideOutputLateData``). Processing time: events go to the matcher as they arrive.

With ``dead_letter``, an event a condition raises on goes to that side output and leaves
every partial match as it was — as if the event had not arrived; a match or timed-out
match the handler raises on goes there too (``raw``: the match as JSON), and what that
call emitted is discarded. Without it, either fails the job naming the step.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Any, Iterable

import numpy as np

from ember.cep.nfa import Matcher, compile_pattern, relevance, sql_relevance
from ember.cep.pattern import Pattern
from ember.errors import UserFunctionError
from ember.functions import Context, KeyedProcessFunction, RuntimeContext, record_text
from ember.state.descriptors import ValueStateDescriptor

__all__ = ["PatternProcessFunction", "CepFunction", "SelectFunction", "SQL_PREFIX"]

SQL_PREFIX = "__cep_"  # columns holding a SQL condition's value, computed by Spark before the step
LATE = "late_dropped"


class PatternProcessFunction:
    """Receives each match as ``{stage name: [events]}`` (stages that took no event are
    absent) and yields output records in the step's output schema; with ``timed_out=tag``,
    :meth:`process_timed_out_match` receives the partial matches ``within`` cut short and
    yields records for that side output."""

    def open(self, ctx: RuntimeContext) -> None:  # noqa: B027 - optional hook
        """Called once per task before the first match."""

    def process_match(self, match: dict[str, list[dict[str, Any]]], ctx: Context) -> Iterable[Any] | None:
        raise NotImplementedError

    def process_timed_out_match(self, match: dict[str, list[dict[str, Any]]], ctx: Context) -> Iterable[Any] | None:
        """A partial match that timed out (``within``); records for the ``timed_out`` side output."""
        return None


class SelectFunction(PatternProcessFunction):
    """``select(fn)``: one output record per match, ``fn(match)``."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def process_match(self, match: dict[str, list[dict[str, Any]]], ctx: Context) -> Iterable[Any]:
        return (self.fn(match),)


class CepFunction(KeyedProcessFunction):
    """Matches ``pattern`` per key and hands matches to ``handler``."""

    # process_batch is a faster path to what process_element does per record (so the step may
    # end a chain of keyed steps, which feeds it record by record: ember.graph.chaining)
    batch_path_optional = True
    whole_batch = True  # process_batch drains a key's due events in order: it needs the bucket's batch in one call

    def __init__(self, pattern: Pattern, handler: PatternProcessFunction, step: str, timed_out: Any = None,
                 sql_columns: dict[str, str] | None = None, late: Any = None, dead_letter: Any = None) -> None:
        self.pattern, self.handler, self.step = pattern, handler, step
        self.timed_out, self.sql_columns, self.late = timed_out, dict(sql_columns or {}), late
        self.dead_letter = dead_letter

    def open(self, ctx: RuntimeContext) -> None:
        self.matcher = Matcher(compile_pattern(self.pattern, self.sql_columns))
        # events no stage can take, nor any negation, until or greedy guard see, when that
        # depends on the event alone: not queued (they would leave every partial match as it is)
        self._relevant = relevance(self.matcher.plan)
        # ... and when every condition is SQL, that test runs on the conditions' columns (numpy)
        self._relevant_columns = sql_relevance(self.pattern, self.sql_columns) if self._relevant is not None else None
        # per key: [partial matches, waiting events (ts, seq, values) as a heap, next seq, the values' field names]
        self.cep = ctx.get_state(ValueStateDescriptor("cep-nfa"))
        self._fields: tuple[str, ...] = ()  # the records' field names (waiting events keep their values only)
        self.handler.open(ctx)

    def process_batch(self, rt: Any, build: Any, keys: list[Any], columns: list[list[Any]], times: list[int] | None,
                      out: list[Any]) -> bool:
        """Event time, a whole bucket's micro-batch at once (the keyed runtime's batch path):
        each key's records are taken together and those that wait keep their values only; the
        matcher runs when the watermark passes them — in this call for the events the batch's
        own watermark advance will pass (``rt.in_batch_watermark``: the job's only stateful
        step), else in ``on_timer``. Processing time: False (one ``process_element`` per record)."""
        if times is None or not getattr(rt, "event_time", False):
            return False
        if not self._fields and keys:
            self._fields = tuple(build([[c[0]] for c in columns])[0])
        fields, watermark, cell = self._fields, rt.watermark, self.cep
        floor = watermark if watermark is not None else -(1 << 63)
        advance = getattr(rt, "in_batch_watermark", None)
        due = advance(times[-1]) if advance is not None and times else None  # (times ascending)
        relevant = self._relevant
        # One dict per event (the runtime's builder) where conditions or the drain read them;
        # events that wait keep their values only (smaller state).
        records: list[Any] | None
        kept: Iterable[int]
        if self._relevant_columns is not None and keys:  # (late events are kept: counted or sent on below)
            kept, records = self._relevant_records(build, columns, times, floor)
        else:
            records = build(columns) if relevant is not None or due is not None else None
            if relevant is None:
                kept = range(len(keys))
            else:
                assert records is not None
                kept = [i for i, record in enumerate(records) if times[i] <= floor or relevant(record)]
        rows = list(zip(*columns)) if records is None else None
        positions: dict[Any, list[int]] = {}
        for i in kept:
            found = positions.get(keys[i])
            if found is None:
                positions[keys[i]] = [i]
            else:
                found.append(i)
        late = 0
        for key, indices in positions.items():
            slot = rt.enter(key)
            st = cell.value() or [[], [], 0, fields]
            if len(st) < 4 or st[3] is not fields:
                st[3:] = [fields]
            buffered, seq = st[1], st[2]
            earliest = buffered[0][0] if buffered else None
            fresh = []  # (ts, seq, the record's index in the batch)
            for i in indices:
                ts = times[i]
                if ts <= floor:
                    late += 1
                    if self.late is not None:
                        event = records[i] if records is not None else dict(zip(fields, rows[i]))  # type: ignore[index]
                        rt.output(self.late, _without_sql(event))
                    continue
                fresh.append((ts, seq, i))
                seq += 1
            st[2] = seq
            if due is not None and ((fresh and fresh[0][0] <= due) or (buffered and buffered[0][0] <= due)):
                assert records is not None
                fresh = self._drain(st, fresh, records, due, rt, out)
            for ts, n, i in fresh:
                heapq.heappush(buffered, (ts, n, rows[i] if rows is not None else tuple(records[i].values())))  # type: ignore[index]
            if buffered and buffered[0][0] != earliest:  # (earliest: its timer is set, or it was drained)
                rt.register_event_time_timer(buffered[0][0])  # due when the watermark reaches the earliest waiting event
            if st[0] or buffered:
                cell.update(st)
            else:
                cell.clear()
            rt.leave(key, slot)
        if late and self.late is None:
            rt.count(LATE, late)
        return True

    def _relevant_records(self, build: Any, columns: list[list[Any]], times: list[int],
                          floor: int) -> tuple[list[int], list[Any]]:
        """The batch's relevant or late events (their indices) when every condition is SQL,
        found on the conditions' columns, and a dict for each of them only (None elsewhere)."""
        assert self._relevant_columns is not None
        where = {f: i for i, f in enumerate(self._fields)}
        mask = np.asarray(times, dtype=np.int64) <= floor
        for name in self._relevant_columns:
            mask |= np.asarray(columns[where[name]], dtype=bool)  # (a null is False, as Spark's WHERE)
        kept = np.flatnonzero(mask).tolist()
        records: list[Any] = [None] * len(times)
        if kept:
            for i, record in zip(kept, build([[c[i] for i in kept] for c in columns])):
                records[i] = record
        return kept, records

    def _drain(self, st: list, fresh: list[tuple], records: list[dict[str, Any]], due: int, rt: Any,
               out: list[Any]) -> list[tuple]:
        """The key's waiting events and its ``fresh`` ones (``(ts, seq, index in records)``,
        in time order) that the batch's watermark advance, to ``due``, will pass: to the
        matcher now, as ``on_timer`` would take them once that watermark fires the key's timer
        (outputs stamped alike: with the first event's time), then time advanced to ``due``.
        Returns the fresh events that wait."""
        waiting = _pop_due(st[1], due) if st[1] else None
        cut = len(fresh) if not fresh or fresh[-1][0] <= due else bisect.bisect_right(fresh, due, key=lambda item: item[0])
        ready = sorted(waiting + fresh[:cut]) if waiting else fresh[:cut]  # by (ts, seq): seq breaks ties
        kept_watermark = rt.watermark
        rt.watermark = due  # what the handler sees, as in on_timer at the end of the batch
        rt.timestamp = ready[0][0]
        rt.time_domain = "event_time"
        rt.emitting(out, ready[0][0])
        self._match(st, ready, records, due, rt, out, processing=False)
        rt.watermark = kept_watermark
        return fresh[cut:]

    def _match(self, st: list, ready: list[tuple], records: list[dict[str, Any]] | None, now: int, ctx: Any,
               out: list[Any], processing: bool) -> None:
        """``ready`` events, ``(ts, seq, values)`` or ``(ts, seq, index in records)`` in time
        order, to the matcher; then time advanced to ``now`` and the window's timer set."""
        fields = st[3] if len(st) > 3 else ()
        feed, partials = self.matcher.event, st[0]
        for ts, seq, event in ready:  # (_feed, inlined: the loop of every waiting event)
            record = records[event] if type(event) is int else dict(zip(fields, event))  # type: ignore[index]
            try:
                partials, done, expired = feed(partials, seq, ts, record)
            except Exception as exc:
                self._condition_failed(exc, record, ctx)
                continue  # (the matcher built new partial matches; the ones it was given are as they were)
            if done or expired:
                self._emit(done, expired, ctx, out)
        st[0], done, expired = self.matcher.advance(partials, now)
        if done or expired:
            self._emit(done, expired, ctx, out)
        self._arm(st, ctx, processing)

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterable[Any] | None:
        st = self.cep.value() or [[], [], 0]
        seq = st[2]
        st[2] = seq + 1
        ts = ctx.timestamp
        watermark = ctx.current_watermark
        if ts is not None and getattr(ctx, "event_time", False):
            if watermark is not None and ts <= watermark:
                if self.late is not None:
                    ctx.output(self.late, _without_sql(value))
                elif getattr(ctx, "count", None) is not None:
                    ctx.count(LATE)  # type: ignore[attr-defined]
                self.cep.update(st)
                return None
            if not st[1] or ts < st[1][0][0]:
                ctx.register_event_time_timer(ts)  # the earliest waiting event's time: due when the watermark reaches it
            fields = tuple(value)
            if fields != self._fields:  # the same for every record of the step: one object, pickled once per bucket
                self._fields = fields
            if len(st) < 4 or st[3] is not self._fields:
                st[3:] = [self._fields]
            heapq.heappush(st[1], (ts, seq, tuple(value.values())))
            self.cep.update(st)
            return None
        now = ctx.current_processing_time
        out: list[Any] = []
        st[0] = self._feed(st[0], seq, now, value, ctx, out)
        self._arm(st, ctx, processing=True)
        self.cep.update(st)
        return out

    def on_timer(self, timestamp: int, ctx: Context) -> Iterable[Any] | None:
        st = self.cep.value()
        if st is None:
            return None
        out: list[Any] = []
        event_time = getattr(ctx, "time_domain", "event_time") == "event_time" and getattr(ctx, "event_time", False)
        now = ctx.current_watermark if event_time else ctx.current_processing_time
        if now is None:
            return None
        buffered = st[1]
        self._match(st, _pop_due(buffered, now), None, now, ctx, out, processing=not event_time)
        if event_time and buffered:
            ctx.register_event_time_timer(buffered[0][0])
        if st[0] or st[1]:
            self.cep.update(st)
        else:
            self.cep.clear()
        return out

    def _feed(self, partials: list, seq: int, ts: int, event: dict[str, Any], ctx: Context, out: list[Any]) -> list:
        try:
            fed, done, expired = self.matcher.event(partials, seq, ts, event)
        except Exception as exc:
            self._condition_failed(exc, event, ctx)
            return partials  # (the matcher built new partial matches; the ones it was given are as they were)
        partials = fed
        if done or expired:
            self._emit(done, expired, ctx, out)
        return partials

    def _condition_failed(self, exc: Exception, event: dict[str, Any], ctx: Context) -> None:
        """A pattern condition raised on ``event``: the job fails naming the step, or the
        event becomes a dead letter."""
        error = f"step '{self.step}': a pattern condition raised {type(exc).__name__}: {exc}"
        if self.dead_letter is None:
            raise UserFunctionError(f"{error} on event {event!r}") from exc
        ctx.output(self.dead_letter, {"raw": record_text(_without_sql(event)), "error": error})

    def _emit(self, done: list, expired: list, ctx: Context, out: list[Any]) -> None:
        if self.sql_columns:  # the SQL conditions' columns are Ember's, not the user's
            done, expired = _visible(done), _visible(expired)
        handler = self.handler
        if type(handler) is SelectFunction:  # one record per match: the call without its generality
            as_dict, fn = self.matcher.as_dict, handler.fn
            for m in done:
                match = as_dict(m)
                try:
                    record = fn(match)
                except Exception as exc:
                    self._handler_failed(handler.process_match, exc, match, ctx)
                    continue
                out.append(record)
        else:
            for m in done:
                result = self._call(handler.process_match, m, ctx)
                if result is not None:
                    out.extend(result)
        if self.timed_out is not None:
            for m in expired:
                result = self._call(handler.process_timed_out_match, m, ctx)
                for record in result or ():
                    ctx.output(self.timed_out, record)

    def _call(self, method: Any, m: tuple, ctx: Context) -> Any:
        match = self.matcher.as_dict(m)
        sides = getattr(ctx, "side", None)
        emitted = len(sides) if sides is not None else 0
        try:
            result = method(match, ctx)
            return None if result is None else list(result)  # a generator runs here, inside the guard
        except Exception as exc:
            if sides is not None:
                del sides[emitted:]  # the side outputs the failed call emitted
            self._handler_failed(method, exc, match, ctx)
            return None

    def _handler_failed(self, method: Any, exc: Exception, match: dict[str, Any], ctx: Context) -> None:
        """The handler raised on ``match``: the job fails naming the step, or the match becomes a dead letter."""
        error = f"step '{self.step}': {type(self.handler).__name__}.{method.__name__} raised {type(exc).__name__}: {exc}"
        if self.dead_letter is None:
            raise UserFunctionError(f"{error} on match {match!r}") from exc
        ctx.output(self.dead_letter, {"raw": record_text(match), "error": error})

    def _arm(self, st: list, ctx: Context, processing: bool) -> None:
        """A timer at the earliest partial match's window end (timeouts, trailing negatives)."""
        window = self.pattern.window_ms
        if window is None or not st[0]:
            return
        due = min(p[3][0][2] for p in st[0]) + window
        if processing:
            ctx.register_processing_time_timer(due)
        else:
            ctx.register_event_time_timer(due)


def _pop_due(buffered: list[tuple], now: int) -> list[tuple]:
    """The waiting events (a heap of ``(ts, seq, values)``) at or before ``now``, taken off it in order."""
    due = []
    while buffered and buffered[0][0] <= now:
        due.append(heapq.heappop(buffered))
    return due


def _without_sql(event: dict[str, Any]) -> dict[str, Any]:
    """The event as the user's stream has it: without the SQL conditions' columns."""
    return {k: v for k, v in event.items() if not k.startswith(SQL_PREFIX)}


def _visible(matches: list) -> list:
    return [tuple((s, q, t, _without_sql(e)) for s, q, t, e in m) for m in matches]
