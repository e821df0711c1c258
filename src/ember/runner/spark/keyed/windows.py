"""Flink's window operator, run as a keyed function on the bucket runtime.

Windows Spark has no native form for — count windows, global windows with
triggers, evictors, allowed lateness with a late-data side output, Python
``AggregateFunction`` / ``ProcessWindowFunction`` / reduce on any window — are
one :class:`WindowOperator` per step. It keeps, per key, each open window's
contents (an accumulator, or the elements when an evictor or a whole-window
function needs them), each window's trigger state, and which windows wait for
which timer, all in the key's slot of the bucket state (so in Spark's
checkpoint). Timers are the runtime's per-key timers.

Semantics follow Flink's ``WindowOperator``: an element is added to each
window it is assigned to unless that window is already past its end plus the
allowed lateness; an element no window accepts is late and goes to the
late-data side output (or is counted as dropped). A window is removed at its
end plus the allowed lateness (event time) or at its end (processing time).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from itertools import islice
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd

from ember.errors import UserFunctionError
from ember.functions import AggregateFunction, KeyedProcessFunction, OutputTag, WindowContext
from ember.state.descriptors import ReducingStateDescriptor, StateDescriptor
from ember.windowing.assigners import GLOBAL_WINDOW, SlidingWindows, TimeWindow, TumblingWindows, WindowAssigner
from ember.windowing.evictors import Evictor, TimestampedValue
from ember.windowing.triggers import (
    ContinuousProcessingTimeTrigger,
    CountTrigger,
    EventTimeTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
    TriggerContext,
    TriggerResult,
)

__all__ = ["WindowSpec", "WindowOperator", "PARTIAL_START", "PARTIAL_ACC", "PARTIAL_COUNT"]

# Reserved slot entries of a key: window contents, trigger state, window timers.
_WIN, _TRIG, _T_EVENT, _T_PROC = "\x00windows", "\x00trigger", "\x00wt_event", "\x00wt_proc"
LATE_COUNTER = "late_dropped"
# Columns of a partial aggregate (with the key fields) sent from the combiner to the window step.
PARTIAL_START, PARTIAL_ACC, PARTIAL_COUNT = "__ember_window_start", "__ember_acc", "__ember_records"


@dataclass(frozen=True)
class WindowSpec:
    """Everything one window step declares (built by the API, validated there)."""

    assigner: WindowAssigner
    trigger: Trigger
    evictor: Evictor | None = None
    allowed_lateness_ms: int = 0
    late_tag: OutputTag | None = None
    aggregate: AggregateFunction | None = None
    reduce: Any = None
    window_function: Any = None  # ProcessWindowFunction
    key_names: tuple[str, ...] = ()
    result_fields: tuple[str, ...] = ()  # aggregate results without a window function
    step: str = "window"
    combined: bool = False  # the input is partial aggregates from :meth:`WindowOperator.combiner`

    @property
    def combinable(self) -> bool:
        """Whether partial aggregation before the shuffle gives exactly the same output:
        event-time fixed windows with the default trigger and an AggregateFunction; no
        evictor, no allowed lateness (each late element would fire again) and no late-data
        side output (it needs the late records themselves)."""
        return (
            isinstance(self.assigner, TumblingWindows | SlidingWindows)
            and not self.assigner.processing_time
            and type(self.trigger) is EventTimeTrigger
            and self.evictor is None
            and self.aggregate is not None
            and self.allowed_lateness_ms == 0
            and self.late_tag is None
        )

    @property
    def keeps_elements(self) -> bool:
        """Whether a window holds its elements (evictor, or a whole-window function alone)."""
        return self.evictor is not None or (self.aggregate is None and self.reduce is None)


class _Scope:
    """What trigger state objects read: the state of the current key's current window."""

    def __init__(self) -> None:
        self.current: dict[str, Any] = {}
        self.now = 0


class _RuntimeTime:
    """Time as the keyed runtime ``rt`` has it for the current call."""

    rt: Any

    @property
    def current_watermark(self) -> int | None:
        return self.rt.watermark

    @property
    def current_processing_time(self) -> int:
        return self.rt.now


class _TriggerContext(_RuntimeTime, TriggerContext):
    def __init__(self, op: "WindowOperator") -> None:
        self._op = op
        self.scope = _Scope()
        self.window: TimeWindow | None = None
        self.rt: Any = None
        self.merged: list[dict[str, Any]] = []
        self._states: dict[str, Any] = {}

    def bind(self, rt: Any, window: TimeWindow) -> "_TriggerContext":
        self.rt, self.window = rt, window
        self.scope.now = rt.now
        self.scope.current = rt.current.setdefault(_TRIG, {}).setdefault(window, {})
        return self

    def release(self) -> None:
        """Drop an emptied window entry so state does not keep dead windows."""
        table = self.rt.current.get(_TRIG)
        if table is not None and not self.scope.current:
            table.pop(self.window, None)
            if not table:
                del self.rt.current[_TRIG]

    def _timers(self, kind: str) -> dict[int, set[TimeWindow]]:
        return self.rt.current.setdefault(kind, {})

    def register_event_time_timer(self, timestamp: int) -> None:
        self._timers(_T_EVENT).setdefault(int(timestamp), set()).add(self.window)
        self.rt.register_event_time_timer(int(timestamp))

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._timers(_T_PROC).setdefault(int(timestamp), set()).add(self.window)
        self.rt.register_processing_time_timer(int(timestamp))

    def _delete(self, kind: str, timestamp: int, delete: Any) -> None:
        timers = self.rt.current.get(kind)
        waiting = timers.get(timestamp) if timers else None
        if waiting is None:
            return
        waiting.discard(self.window)
        if not waiting:
            del timers[timestamp]
            delete(timestamp)
            if not timers:
                del self.rt.current[kind]

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._delete(_T_EVENT, int(timestamp), self.rt.delete_event_time_timer)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._delete(_T_PROC, int(timestamp), self.rt.delete_processing_time_timer)

    def get_partitioned_state(self, descriptor: StateDescriptor) -> Any:
        from ember.runner.spark.keyed.runtime import state_object

        state = self._states.get(descriptor.name)
        if state is None:
            state = self._states[descriptor.name] = state_object(self.scope, descriptor)
        return state

    def merge_partitioned_state(self, descriptor: StateDescriptor) -> None:
        values = [m[descriptor.name] for m in self.merged if descriptor.name in m]
        if not values:
            return
        if isinstance(descriptor, ReducingStateDescriptor):
            merged = values[0]
            for v in values[1:]:
                merged = descriptor.reduce_fn(merged, v)
        else:
            merged = values[-1]
        self.scope.current[descriptor.name] = merged


class _WindowContext(_RuntimeTime, WindowContext):
    def __init__(self, rt: Any, window: TimeWindow) -> None:
        self.rt, self.window = rt, window

    def output(self, tag: OutputTag, record: Any) -> None:
        self.rt.output(tag, record)


class WindowOperator(KeyedProcessFunction):
    """The keyed function of one window step (see the module docstring)."""

    def __init__(self, spec: WindowSpec) -> None:
        self.spec = spec
        self._tctx: _TriggerContext | None = None

    def open(self, ctx: Any) -> None:
        self._tctx = _TriggerContext(self)

    # -- whole batches (the common case, vectorised around the user's function) ------

    @property
    def _batchable(self) -> bool:
        """Fixed time windows with the default time trigger (or a continuous one) and an
        incremental function: per element, those triggers only (re)register timers that
        depend on the window (and the batch's time), never on the element, so a batch can
        be grouped by (key, window) first and the trigger run once per new window
        (elements behind the watermark still go one by one)."""
        spec = self.spec
        return (
            isinstance(spec.assigner, TumblingWindows | SlidingWindows)
            and type(spec.trigger) in (EventTimeTrigger, ProcessingTimeTrigger, ContinuousProcessingTimeTrigger)
            and spec.evictor is None
            and not spec.keeps_elements
        )

    @property
    def _count_size(self) -> int | None:
        """N of a tumbling count window (``count_window(N)``) with an incremental function."""
        spec, trigger = self.spec, self.spec.trigger
        if (
            isinstance(trigger, PurgingTrigger) and type(trigger.trigger) is CountTrigger
            and spec.assigner.is_global and spec.evictor is None and not spec.keeps_elements
        ):
            return trigger.trigger.count
        return None

    def _count_batch(self, rt: Any, records: list[dict[str, Any]], keys: list[Any], out: list[Any]) -> None:
        """Tumbling count windows a key at a time: the same state as the per-element path
        (the count trigger's counter and the window's accumulator), one pass over its records."""
        spec, size = self.spec, self._count_size
        counter = spec.trigger.trigger._state
        agg, reduce_fn = spec.aggregate, spec.reduce
        codes, uniques = pd.factorize(pd.Series(keys, dtype=object), sort=False)
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        edges = [0, *(np.flatnonzero(np.diff(sorted_codes) != 0) + 1).tolist(), len(order)]
        order_l = order.tolist()
        for a, b in zip(edges, edges[1:]):
            if a == b:
                continue
            key = uniques[sorted_codes[a]]
            found = rt.enter(key)
            tctx = self._tctx.bind(rt, GLOBAL_WINDOW)
            seen_state = tctx.get_partitioned_state(counter)
            seen = seen_state.get() or 0
            contents = rt.current.setdefault(_WIN, {})
            acc = contents.get(GLOBAL_WINDOW)
            try:
                for i in order_l[a:b]:
                    record = records[i]
                    if acc is None:
                        acc = record if agg is None else agg.add(record, agg.create_accumulator())
                    else:
                        acc = agg.add(record, acc) if agg is not None else reduce_fn(acc, record)
                    seen += 1
                    if seen >= size:
                        contents[GLOBAL_WINDOW] = acc
                        self._emit(rt, GLOBAL_WINDOW, contents, out)
                        acc, seen = None, 0
            except UserFunctionError:
                raise
            except Exception as exc:
                raise UserFunctionError(f"step '{spec.step}': {type(exc).__name__}: {exc}") from exc
            if acc is None:
                contents.pop(GLOBAL_WINDOW, None)
            else:
                contents[GLOBAL_WINDOW] = acc
            seen_state.clear()
            if seen:
                seen_state.add(seen)
            tctx.release()
            self._tidy(rt)
            rt.leave(key, found)

    def _starts(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(record index, window start) for every window of every record."""
        a = self.spec.assigner
        slide = a.size_ms if isinstance(a, TumblingWindows) else a.slide_ms
        last = ts - (ts - a.offset_ms) % slide
        idx, starts = [], []
        for j in range(-(-a.size_ms // slide)):
            start = last - j * slide
            ok = start > ts - a.size_ms
            idx.append(np.nonzero(ok)[0])
            starts.append(start[ok])
        return np.concatenate(idx), np.concatenate(starts)

    def _groups(self, keys: list[Any], ts: np.ndarray) -> tuple[list[int], list[int], list[Any], list[int]]:
        """Each record's windows grouped by (key, window): record indices, window starts,
        each group's key, and group boundaries; time order kept within a group."""
        rec, starts = self._starts(ts)
        codes, uniques = pd.factorize(pd.Series(keys, dtype=object), sort=False)
        order = np.lexsort((starts, codes[rec]))
        rec, starts = rec[order], starts[order]
        group_codes = codes[rec]
        bounds = np.flatnonzero((np.diff(group_codes) != 0) | (np.diff(starts) != 0)) + 1
        edges = [0, *bounds.tolist(), len(rec)] if len(rec) else [0]
        return rec.tolist(), starts.tolist(), [uniques[c] for c in group_codes[edges[:-1]].tolist()], edges

    def combiner(self, fields: list[str], keys: tuple[str, ...], time_column: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
        """The ``mapInArrow`` function that pre-aggregates a partition's records per
        (key, window) with the user's ``add``; the window step ``merge`` s the partials.
        Records of a (key, window) are added in timestamp order."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from ember.runner.spark.keyed.runtime import records_builder

        spec, build = self.spec, records_builder(fields)
        agg = spec.aggregate

        def key_codes(batch: Any) -> tuple[np.ndarray, list[Any]]:
            if len(keys) == 1:
                encoded = pc.dictionary_encode(batch.column(keys[0]))
                return encoded.indices.to_numpy(zero_copy_only=False), encoded.dictionary.to_pylist()
            cols = [batch.column(k).to_pylist() for k in keys]
            codes, uniques = pd.factorize(pd.Series(list(zip(*cols)), dtype=object), sort=False)
            return codes, list(uniques)

        def combine(batches: Iterator[Any]) -> Iterator[Any]:
            partials: dict[tuple[Any, int], list[Any]] = {}
            add = agg.add
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                ts = batch.column(time_column).cast(pa.timestamp("ms")).cast(pa.int64()).to_numpy(zero_copy_only=False)
                codes, uniques = key_codes(batch)
                rec, starts = self._starts(ts)
                order = np.lexsort((ts[rec], starts, codes[rec]))
                rec, starts = rec[order], starts[order]
                group_codes = codes[rec]
                edges = [0, *(np.flatnonzero((np.diff(group_codes) != 0) | (np.diff(starts) != 0)) + 1).tolist(), len(rec)]
                # Records built in group order, so each group is a run of the list.
                taken = batch.take(pa.array(rec)) if len(rec) else batch.slice(0, 0)
                records = iter(build([taken.column(f).to_pylist() for f in fields]))
                starts_l, gc = starts.tolist(), group_codes.tolist()
                for a, b in zip(edges, edges[1:]):
                    slot_key = (uniques[gc[a]], starts_l[a])
                    slot = partials.get(slot_key)
                    acc = agg.create_accumulator() if slot is None else slot[0]
                    try:
                        for record in islice(records, b - a):
                            acc = add(record, acc)
                    except Exception as exc:
                        raise UserFunctionError(f"step '{spec.step}': add raised {type(exc).__name__}: {exc}") from exc
                    partials[slot_key] = [acc, (slot[1] if slot else 0) + b - a]
            if not partials:
                return
            columns: list[list[Any]] = [[] for _ in keys]
            starts_out, accs, counts = [], [], []
            for (key, start), (acc, n) in partials.items():
                for col, part in zip(columns, key if len(keys) > 1 else (key,)):
                    col.append(part)
                starts_out.append(start)
                accs.append(pickle.dumps(acc, protocol=pickle.HIGHEST_PROTOCOL))
                counts.append(n)
            names = [*keys, PARTIAL_START, PARTIAL_ACC, PARTIAL_COUNT, time_column]
            arrays = [*columns, starts_out, accs, counts, pc.multiply(pa.array(starts_out, pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC"))]
            yield pa.RecordBatch.from_pydict(dict(zip(names, arrays)))

        return combine

    def process_batch(self, rt: Any, build: Any, keys: list[Any], columns: list[list[Any]],
                      times: list[int] | None, out: list[Any]) -> bool:
        if self.spec.combined:
            self._merge_partials(rt, build(columns), keys, out)
            return True
        if self._count_size is not None:
            self._count_batch(rt, build(columns), keys, out)
            return True
        if not self._batchable:
            return False
        spec, n = self.spec, len(keys)
        size = spec.assigner.size_ms
        processing = spec.assigner.processing_time
        ts = np.full(n, rt.now, dtype=np.int64) if processing else np.asarray(times, dtype=np.int64)
        wm = None if processing else rt.watermark
        slow = np.zeros(n, dtype=bool)
        if wm is not None:  # windows already past their end: late firing or late record, element by element
            rec, starts = self._starts(ts)
            slow[rec[starts + size - 1 <= wm]] = True
        fast = np.flatnonzero(~slow)
        records = build(columns)
        recs, starts_l, group_keys, edges = self._groups([keys[i] for i in fast.tolist()], ts[fast])
        recs = fast[recs].tolist() if len(recs) else []
        agg, reduce_fn = spec.aggregate, spec.reduce
        add = agg.add if agg is not None else None
        for g, (a, b) in enumerate(zip(edges, edges[1:])):
            key = group_keys[g]
            found = rt.enter(key)
            window = TimeWindow(starts_l[a], starts_l[a] + size)
            contents = rt.current.setdefault(_WIN, {})
            acc = contents.get(window)
            new = acc is None
            try:
                if add is not None:
                    if new:
                        acc = agg.create_accumulator()
                    for i in recs[a:b]:
                        acc = add(records[i], acc)
                else:
                    start_at = a
                    if new:
                        acc, start_at = records[recs[a]], a + 1
                    for i in recs[start_at:b]:
                        acc = reduce_fn(acc, records[i])
            except Exception as exc:
                raise UserFunctionError(
                    f"step '{spec.step}': {'add' if add is not None else 'reduce'} raised {type(exc).__name__}: {exc}"
                ) from exc
            contents[window] = acc
            if new:  # what the trigger does for a window's first element: its end timer
                rt.timestamp = int(ts[recs[a]])
                first = records[recs[a]]
                tctx = self._tctx.bind(rt, window)
                self._apply(rt, window, spec.trigger.on_element(first, rt.timestamp, window, tctx), out)
                tctx.release()
                self._register_cleanup(rt, window)
            rt.leave(key, found)
        for i in np.flatnonzero(slow).tolist():
            key = keys[i]
            found = rt.enter(key)
            rt.timestamp = int(ts[i])
            out.extend(self.process_element(records[i], rt))
            rt.leave(key, found)
        return True

    # -- elements -------------------------------------------------------------------

    def process_element(self, value: dict[str, Any], ctx: Any) -> list[Any]:
        spec, out = self.spec, []
        ts = ctx.now if spec.assigner.processing_time else ctx.timestamp
        windows = spec.assigner.assign(ts)
        if spec.assigner.merging:
            merged = self._merge(ctx, windows[0])
            windows = [merged] if merged is not None else []
        placed = False
        for window in windows:
            if self._is_late(window, ctx):
                continue
            placed = True
            self._add(ctx, window, value, ts)
            tctx = self._tctx.bind(ctx, window)
            result = self._call_trigger("on_element", spec.trigger.on_element, (value, ts, window, tctx))
            self._apply(ctx, window, result, out)
            tctx.bind(ctx, window).release()
            self._register_cleanup(ctx, window)
        if not placed:
            self._late(ctx, value)
        self._tidy(ctx)
        return out

    def _merge_partials(self, rt: Any, partials: list[dict[str, Any]], keys: list[Any], out: list[Any]) -> None:
        """Partial aggregates from the combiner: a window past its end drops the whole
        partial (counted as late records, as the element path would); otherwise the
        partial is merged in, and a new window gets its trigger timer and cleanup."""
        spec = self.spec
        size, agg = spec.assigner.size_ms, spec.aggregate
        for key, partial in zip(keys, partials):
            start = partial[PARTIAL_START]
            window = TimeWindow(start, start + size)
            if self._is_late(window, rt):
                rt.count(LATE_COUNTER, partial[PARTIAL_COUNT])
                continue
            found = rt.enter(key)
            contents = rt.current.setdefault(_WIN, {})
            acc = pickle.loads(partial[PARTIAL_ACC])
            prev = contents.get(window)
            contents[window] = acc if prev is None else self._call("merge", agg.merge, (prev, acc))
            if prev is None:
                rt.timestamp = start
                tctx = self._tctx.bind(rt, window)
                self._apply(rt, window, spec.trigger.on_element(partial, start, window, tctx), out)
                tctx.release()
                self._register_cleanup(rt, window)
            rt.leave(key, found)

    def _is_late(self, window: TimeWindow, ctx: Any) -> bool:
        wm = ctx.watermark
        return (
            not self.spec.assigner.processing_time
            and wm is not None
            and not window.is_global
            and window.max_timestamp + self.spec.allowed_lateness_ms <= wm
        )

    def _late(self, ctx: Any, value: dict[str, Any]) -> None:
        if self.spec.late_tag is not None:
            ctx.output(self.spec.late_tag, value)
        else:
            ctx.count(LATE_COUNTER)

    def _add(self, ctx: Any, window: TimeWindow, value: dict[str, Any], ts: int) -> None:
        spec = self.spec
        windows = ctx.current.setdefault(_WIN, {})
        if spec.keeps_elements:
            windows.setdefault(window, []).append(TimestampedValue(value, ts))
        elif spec.aggregate is not None:
            acc = windows.get(window)
            if acc is None:
                acc = self._call("create_accumulator", spec.aggregate.create_accumulator, ())
            windows[window] = self._call("add", spec.aggregate.add, (value, acc))
        else:
            prev = windows.get(window)
            windows[window] = value if prev is None else self._call("reduce", spec.reduce, (prev, value))

    def _combine(self, a: Any, b: Any) -> Any:
        spec = self.spec
        if spec.keeps_elements:
            return sorted([*a, *b], key=lambda e: e.timestamp)
        if spec.aggregate is not None:
            return self._call("merge", spec.aggregate.merge, (a, b))
        return self._call("reduce", spec.reduce, (a, b))

    def _merge(self, ctx: Any, new: TimeWindow) -> TimeWindow | None:
        """Session windows: merge ``new`` with the key's windows it touches.
        Returns the window the element belongs to, or None when that is late."""
        windows = ctx.current.get(_WIN, {})
        touching = sorted(w for w in windows if w.intersects(new))
        merged = new
        for w in touching:
            merged = merged.cover(w)
        if self._is_late(merged, ctx):
            return None
        if touching == [merged]:
            return merged
        contents = None
        for w in touching:
            c = windows.pop(w)
            contents = c if contents is None else self._combine(contents, c)
        if contents is not None:
            windows[merged] = contents
        trigger, tctx = self.spec.trigger, self._tctx
        if touching:
            states = ctx.current.get(_TRIG, {})
            tctx.merged = [states.get(w, {}) for w in touching]
            tctx.bind(ctx, merged)
            self._call_trigger("on_merge", trigger.on_merge, (merged, tctx))
            tctx.release()
            tctx.merged = []
            for w in touching:
                tctx.bind(ctx, w)
                self._call_trigger("clear", trigger.clear, (w, tctx))
                tctx.scope.current.clear()
                tctx.release()
                self._delete_cleanup(ctx, w)
        return merged

    # -- timers ---------------------------------------------------------------------

    def _cleanup_time(self, window: TimeWindow) -> tuple[str, int] | None:
        if window.is_global:
            return None
        if self.spec.assigner.processing_time:
            return _T_PROC, window.max_timestamp
        return _T_EVENT, window.max_timestamp + self.spec.allowed_lateness_ms

    def _register_cleanup(self, ctx: Any, window: TimeWindow) -> None:
        self._cleanup_timer(ctx, window, register=True)

    def _delete_cleanup(self, ctx: Any, window: TimeWindow) -> None:
        self._cleanup_timer(ctx, window, register=False)

    def _cleanup_timer(self, ctx: Any, window: TimeWindow, *, register: bool) -> None:
        when = self._cleanup_time(window)
        if when is None:
            return
        kind, at = when
        tctx = self._tctx.bind(ctx, window)
        if kind == _T_PROC:
            (tctx.register_processing_time_timer if register else tctx.delete_processing_time_timer)(at)
        else:
            (tctx.register_event_time_timer if register else tctx.delete_event_time_timer)(at)
        tctx.release()

    def on_timer(self, timestamp: int, ctx: Any) -> list[Any]:
        out: list[Any] = []
        kind = _T_PROC if ctx.time_domain == "processing_time" else _T_EVENT
        timers = ctx.current.get(kind, {})
        due = timers.pop(timestamp, set())
        if not timers:
            ctx.current.pop(kind, None)
        trigger = self.spec.trigger
        for window in sorted(due):
            tctx = self._tctx.bind(ctx, window)
            hook = trigger.on_processing_time if kind == _T_PROC else trigger.on_event_time
            result = self._call_trigger(hook.__name__, hook, (timestamp, window, tctx))
            self._apply(ctx, window, result, out)
            tctx.bind(ctx, window).release()
            if self._cleanup_time(window) == (kind, timestamp):
                self._clear_window(ctx, window)
        self._tidy(ctx)
        return out

    def _clear_window(self, ctx: Any, window: TimeWindow) -> None:
        windows = ctx.current.get(_WIN)
        if windows is not None:
            windows.pop(window, None)
        tctx = self._tctx.bind(ctx, window)
        self._call_trigger("clear", self.spec.trigger.clear, (window, tctx))
        tctx.scope.current.clear()
        tctx.release()

    @staticmethod
    def _tidy(ctx: Any) -> None:
        if not ctx.current.get(_WIN, True):
            del ctx.current[_WIN]

    # -- firing ---------------------------------------------------------------------

    def _apply(self, ctx: Any, window: TimeWindow, result: TriggerResult, out: list[Any]) -> None:
        if not isinstance(result, TriggerResult):
            raise UserFunctionError(
                f"step '{self.spec.step}': trigger {self.spec.trigger.describe()} returned {result!r}; "
                "return a TriggerResult (CONTINUE, FIRE, PURGE or FIRE_AND_PURGE)"
            )
        windows = ctx.current.get(_WIN, {})
        if result.is_fire and window in windows:
            self._emit(ctx, window, windows, out)
        if result.is_purge:
            windows.pop(window, None)

    def _emit(self, ctx: Any, window: TimeWindow, windows: dict[TimeWindow, Any], out: list[Any]) -> None:
        spec = self.spec
        contents = windows[window]
        if spec.keeps_elements:
            elements = contents
            if spec.evictor is not None:
                elements = self._call("evict_before", spec.evictor.evict_before, (list(elements), window))
            values = [e.value for e in elements]
            if spec.aggregate is not None:
                acc = self._call("create_accumulator", spec.aggregate.create_accumulator, ())
                for v in values:
                    acc = self._call("add", spec.aggregate.add, (v, acc))
                results = [self._call("get_result", spec.aggregate.get_result, (acc,))]
            elif spec.reduce is not None:
                reduced = values[0] if values else None
                for v in values[1:]:
                    reduced = self._call("reduce", spec.reduce, (reduced, v))
                results = [reduced] if values else []
            else:
                results = values
            if spec.evictor is not None:
                kept = self._call("evict_after", spec.evictor.evict_after, (list(elements), window))
                windows[window] = list(kept)
        elif spec.aggregate is not None:
            results = [self._call("get_result", spec.aggregate.get_result, (contents,))]
        else:
            results = [contents]
        if spec.window_function is not None:
            wctx = _WindowContext(ctx, window)
            emitted = self._call("process", spec.window_function.process, (ctx.current_key, wctx, results))
            if emitted is not None:
                out.extend(emitted)
        elif spec.aggregate is not None:
            out.extend(self._row(ctx.current_key, window, r) for r in results)
        else:
            out.extend(results)

    def _row(self, key: Any, window: TimeWindow, result: Any) -> dict[str, Any]:
        spec = self.spec
        row = dict(zip(spec.key_names, key if len(spec.key_names) > 1 else (key,)))
        row["window_start"] = None if window.is_global else window.start
        row["window_end"] = None if window.is_global else window.end
        if isinstance(result, dict):
            row.update(result)
        elif isinstance(result, tuple | list):
            row.update(zip(spec.result_fields, result))
        else:
            row[spec.result_fields[0]] = result
        return row

    # -- user code ------------------------------------------------------------------

    def _call(self, what: str, fn: Any, args: tuple[Any, ...]) -> Any:
        try:
            return fn(*args)
        except UserFunctionError:
            raise
        except Exception as exc:
            raise UserFunctionError(
                f"step '{self.spec.step}': {what} raised {type(exc).__name__}: {exc}"
            ) from exc

    def _call_trigger(self, what: str, fn: Any, args: tuple[Any, ...]) -> Any:
        return self._call(f"trigger {self.spec.trigger.describe()}.{what}", fn, args)
