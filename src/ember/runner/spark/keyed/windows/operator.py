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

This module is the per-element path, which defines those semantics, and the
firing and timer logic every path shares; the whole-batch paths (spec.WindowPath)
are in batch.py.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, cast

from ember.errors import UserFunctionError
from ember.functions import KeyedProcessFunction, RuntimeContext
from ember.runner.spark.keyed.contracts import RecordsBuilder
from ember.runner.spark.keyed.runtime import KeyedRuntime
from ember.runner.spark.keyed.windows.batch import BatchPath, batch_path
from ember.runner.spark.keyed.windows.contexts import WindowFunctionContext, WindowTriggerContext
from ember.runner.spark.keyed.windows.spec import (
    LATE_COUNTER,
    TRIGGER_STATE,
    WINDOW_EVENT_TIMERS,
    WINDOW_PROC_TIMERS,
    WINDOWS,
    WindowSpec,
)
from ember.windowing.assigners import TimeWindow
from ember.windowing.evictors import TimestampedValue
from ember.windowing.triggers import TriggerResult

__all__ = ["WindowOperator"]

# The parts of a key's state slot that are its windows' (contents, trigger state, timers).
_WINDOW_STATE = (WINDOWS, TRIGGER_STATE, WINDOW_EVENT_TIMERS, WINDOW_PROC_TIMERS)


class WindowOperator(KeyedProcessFunction):
    """The keyed function of one window step (see the module docstring)."""

    def __init__(self, spec: WindowSpec) -> None:
        self.spec = spec
        self.trigger_ctx = WindowTriggerContext()
        self._batches: BatchPath | None = batch_path(self)

    def open(self, ctx: RuntimeContext) -> None:
        self.trigger_ctx = WindowTriggerContext()

    def process_batch(self, rt: KeyedRuntime, build: RecordsBuilder, keys: list[Any], columns: list[list[Any]],
                      times: list[int] | None, out: list[Any]) -> bool:
        """A bucket's micro-batch on the step's whole-batch path (False: per element)."""
        return self._batches is not None and self._batches.run(rt, build, keys, columns, times, out)

    def process_element(self, value: dict[str, Any], ctx: KeyedRuntime) -> list[Any]:  # type: ignore[override]
        spec, out = self.spec, list[Any]()
        # Without event time (a count window, say) records carry no timestamp: None, as Flink's.
        ts = cast(int, ctx.now if spec.assigner.processing_time else ctx.timestamp)
        windows = spec.assigner.assign(ts)
        if spec.assigner.merging:
            before = self._before_merge(ctx, windows[0])
            try:
                merged = self._merge(ctx, windows[0])
            except UserFunctionError as exc:  # the merge function, or a trigger's on_merge / clear
                if before is None:
                    raise
                for part in _WINDOW_STATE:  # the key's sessions as they were: the record never arrived
                    ctx.current.pop(part, None)
                ctx.current.update(before)
                ctx.dead_letter(cast(str, spec.dead_letter), value, str(exc))
                return out
            windows = [merged] if merged is not None else []
        placed = False
        for window in windows:
            if self.is_late(window, ctx):
                continue
            placed = True
            if not self._element(ctx, window, value, ts, out):
                break  # a dead letter: into no further window
        if not placed:
            self._late(ctx, value)
        self.tidy(ctx)
        return out

    def is_late(self, window: TimeWindow, ctx: KeyedRuntime) -> bool:
        wm = ctx.watermark
        return (
            not self.spec.assigner.processing_time
            and wm is not None
            and not window.is_global
            and window.max_timestamp + self.spec.allowed_lateness_ms <= wm
        )

    def _late(self, ctx: KeyedRuntime, value: dict[str, Any]) -> None:
        if self.spec.late_tag is not None:
            ctx.output(self.spec.late_tag, value)
        else:
            ctx.count(LATE_COUNTER)

    def _add(self, ctx: KeyedRuntime, window: TimeWindow, value: dict[str, Any], ts: int) -> None:
        spec = self.spec
        windows = ctx.current.setdefault(WINDOWS, {})
        if spec.keeps_elements:
            windows.setdefault(window, []).append(TimestampedValue(value, ts))
        elif spec.aggregate is not None:
            acc = windows.get(window)
            if acc is None:
                acc = self.call("create_accumulator", spec.aggregate.create_accumulator, ())
            windows[window] = self.call("add", spec.aggregate.add, (value, acc))
        else:
            prev = windows.get(window)
            windows[window] = value if prev is None else self.call("reduce", spec.reduce, (prev, value))

    def _element(self, ctx: KeyedRuntime, window: TimeWindow, value: dict[str, Any], ts: int, out: list[Any]) -> bool:
        """The record into ``window`` and the trigger's answer to it. With a dead-letter output, a
        record the user's code raises on goes there (``raw``: the record as JSON, ``error``: why)
        and the window keeps what it had: after a raising ``add`` / reduce (unless the function
        changed its accumulator in place before raising), and after a raising trigger
        ``on_element`` the record is taken back out (the trigger state it changed before raising
        stays, as a process function's; a window the record opened is dropped with it). Without
        one, the error fails the step. False for a dead letter."""
        spec = self.spec
        windows = ctx.current.setdefault(WINDOWS, {})
        had = window in windows
        before = windows.get(window)
        size = len(before) if had and spec.keeps_elements else 0
        try:
            self._add(ctx, window, value, ts)
        except UserFunctionError as exc:
            return self._record_failed(ctx, value, exc)
        tctx = self.trigger_ctx.bind(ctx, window)
        try:
            result = self._call_trigger("on_element", spec.trigger.on_element, (value, ts, window, tctx))
            self.apply_result(ctx, window, result, out)
        except UserFunctionError as exc:
            if spec.dead_letter is not None:
                tctx.bind(ctx, window)
                if had and spec.keeps_elements:
                    del windows[window][size:]
                elif had:
                    windows[window] = before
                else:
                    windows.pop(window, None)
                    tctx.scope.current.clear()
                tctx.release()
            return self._record_failed(ctx, value, exc)
        tctx.bind(ctx, window).release()
        self.register_cleanup(ctx, window)
        return True

    def _record_failed(self, ctx: KeyedRuntime, value: dict[str, Any], error: UserFunctionError) -> bool:
        """``value`` to the dead-letter output (False) — or, without one, the step fails with ``error``."""
        if self.spec.dead_letter is None:
            raise error
        ctx.dead_letter(self.spec.dead_letter, value, str(error))
        return False

    def _combine(self, a: Any, b: Any) -> Any:
        spec = self.spec
        if spec.keeps_elements:
            return sorted([*a, *b], key=lambda e: e.timestamp)
        if spec.aggregate is not None:
            return self.call("merge", spec.aggregate.merge, (a, b))
        return self.call("reduce", spec.reduce, (a, b))

    def _before_merge(self, ctx: KeyedRuntime, new: TimeWindow) -> dict[str, Any] | None:
        """With a dead-letter output, when ``new`` merges with the key's sessions: a copy of the
        key's window state, to go back to should the merge's user code raise (else None)."""
        if self.spec.dead_letter is None or not any(w.intersects(new) for w in ctx.current.get(WINDOWS, {})):
            return None
        return copy.deepcopy({part: ctx.current[part] for part in _WINDOW_STATE if part in ctx.current})

    def _merge(self, ctx: KeyedRuntime, new: TimeWindow) -> TimeWindow | None:
        """Session windows: merge ``new`` with the key's windows it touches.
        Returns the window the element belongs to, or None when that is late."""
        windows = ctx.current.get(WINDOWS, {})
        touching = sorted(w for w in windows if w.intersects(new))
        merged = new
        for w in touching:
            merged = merged.cover(w)
        if self.is_late(merged, ctx):
            return None
        if touching == [merged]:
            return merged
        contents = None
        for w in touching:
            c = windows.pop(w)
            contents = c if contents is None else self._combine(contents, c)
        if contents is not None:
            windows[merged] = contents
        trigger, tctx = self.spec.trigger, self.trigger_ctx
        if touching:
            states = ctx.current.get(TRIGGER_STATE, {})
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
            return WINDOW_PROC_TIMERS, window.max_timestamp
        return WINDOW_EVENT_TIMERS, window.max_timestamp + self.spec.allowed_lateness_ms

    def register_cleanup(self, ctx: KeyedRuntime, window: TimeWindow) -> None:
        self._cleanup_timer(ctx, window, register=True)

    def _delete_cleanup(self, ctx: KeyedRuntime, window: TimeWindow) -> None:
        self._cleanup_timer(ctx, window, register=False)

    def _cleanup_timer(self, ctx: KeyedRuntime, window: TimeWindow, *, register: bool) -> None:
        when = self._cleanup_time(window)
        if when is None:
            return
        kind, at = when
        tctx = self.trigger_ctx.bind(ctx, window)
        if kind == WINDOW_PROC_TIMERS:
            (tctx.register_processing_time_timer if register else tctx.delete_processing_time_timer)(at)
        else:
            (tctx.register_event_time_timer if register else tctx.delete_event_time_timer)(at)
        tctx.release()

    def on_timer(self, timestamp: int, ctx: KeyedRuntime) -> list[Any]:  # type: ignore[override]
        out: list[Any] = []
        kind = WINDOW_PROC_TIMERS if ctx.time_domain == "processing_time" else WINDOW_EVENT_TIMERS
        timers = ctx.current.get(kind, {})
        due = timers.pop(timestamp, set())
        if not timers:
            ctx.current.pop(kind, None)
        trigger = self.spec.trigger
        for window in sorted(due):
            tctx = self.trigger_ctx.bind(ctx, window)
            hook = trigger.on_processing_time if kind == WINDOW_PROC_TIMERS else trigger.on_event_time
            try:
                result = self._call_trigger(hook.__name__, hook, (timestamp, window, tctx))
                self.apply_result(ctx, window, result, out)
            except UserFunctionError as exc:  # with a dead-letter output: the timer's window, not fired
                self._window_failed(ctx, window, exc)
            tctx.bind(ctx, window).release()
            if self._cleanup_time(window) == (kind, timestamp):
                self._clear_window(ctx, window)
        self.tidy(ctx)
        return out

    def _clear_window(self, ctx: KeyedRuntime, window: TimeWindow) -> None:
        windows = ctx.current.get(WINDOWS)
        if windows is not None:
            windows.pop(window, None)
        tctx = self.trigger_ctx.bind(ctx, window)
        try:
            self._call_trigger("clear", self.spec.trigger.clear, (window, tctx))
        except UserFunctionError as exc:  # with a dead-letter output: reported; the window goes all the same
            self._window_failed(ctx, window, exc)
        tctx.scope.current.clear()
        tctx.release()

    def _window_failed(self, ctx: KeyedRuntime, window: TimeWindow, error: UserFunctionError, sides: int | None = None) -> None:
        """``window`` of the current key to the dead-letter output (``raw``: key and bounds) —
        or, without one, the job fails with ``error``. ``sides``: the side outputs from there on
        are the failed call's, discarded."""
        spec = self.spec
        if spec.dead_letter is None:
            raise error
        start, end = (None, None) if window.is_global else (window.start, window.end)
        failed = {"key": ctx.current_key, "window_start": start, "window_end": end}
        ctx.dead_letter(spec.dead_letter, failed, str(error), discard_from=sides)

    @staticmethod
    def tidy(ctx: KeyedRuntime) -> None:
        if not ctx.current.get(WINDOWS, True):
            del ctx.current[WINDOWS]

    # -- firing ---------------------------------------------------------------------

    def apply_result(self, ctx: KeyedRuntime, window: TimeWindow, result: TriggerResult, out: list[Any]) -> None:
        if not isinstance(result, TriggerResult):
            raise UserFunctionError(
                f"step '{self.spec.step}': trigger {self.spec.trigger.describe()} returned {result!r}; "
                "return a TriggerResult (CONTINUE, FIRE, PURGE or FIRE_AND_PURGE)"
            )
        windows = ctx.current.get(WINDOWS, {})
        if result.is_fire and window in windows:
            self.emit(ctx, window, windows, out)
        if result.is_purge:
            windows.pop(window, None)

    def emit(self, ctx: KeyedRuntime, window: TimeWindow, windows: dict[TimeWindow, Any], out: list[Any]) -> None:
        """Fire ``window``: its result rows into ``out`` (or the call's output, marked with the
        window's Flink timestamp). With a dead-letter output, a window whose functions raise
        (``get_result``, the window function, an evictor) emits nothing and becomes a dead letter
        (``raw``: its key and bounds); the side outputs that call emitted are discarded."""
        spec = self.spec
        sides = len(ctx.side)
        try:
            rows = self._results(ctx, window, windows)
        except Exception as exc:
            error = exc if isinstance(exc, UserFunctionError) else UserFunctionError(
                f"step '{spec.step}': process raised {type(exc).__name__}: {exc}")
            if spec.dead_letter is None and error is not exc:
                raise error from exc
            self._window_failed(ctx, window, error, sides)
            return
        if ctx.out is not None:  # straight into the call's output, marked with Flink's timestamp
            out = ctx.out
            ctx.emitting(out, window.max_timestamp)
        out.extend(rows)

    def _results(self, ctx: KeyedRuntime, window: TimeWindow, windows: dict[TimeWindow, Any]) -> list[Any]:
        """``window``'s output rows (a window function's run to the end)."""
        spec = self.spec
        contents = windows[window]
        if spec.keeps_elements:
            elements = contents
            if spec.evictor is not None:
                elements = self.call("evict_before", spec.evictor.evict_before, (list(elements), window))
            values = [e.value for e in elements]
            if spec.aggregate is not None:
                acc = self.call("create_accumulator", spec.aggregate.create_accumulator, ())
                for v in values:
                    acc = self.call("add", spec.aggregate.add, (v, acc))
                results = [self.call("get_result", spec.aggregate.get_result, (acc,))]
            elif spec.reduce is not None:
                reduced = values[0] if values else None
                for v in values[1:]:
                    reduced = self.call("reduce", spec.reduce, (reduced, v))
                results = [reduced] if values else []
            else:
                results = values
            if spec.evictor is not None:
                kept = self.call("evict_after", spec.evictor.evict_after, (list(elements), window))
                windows[window] = list(kept)
        elif spec.aggregate is not None:
            results = [self.call("get_result", spec.aggregate.get_result, (contents,))]
        else:
            results = [contents]
        if spec.window_function is not None:
            wctx = WindowFunctionContext(ctx, window)
            emitted = self.call("process", spec.window_function.process, (ctx.current_key, wctx, results))
            return [] if emitted is None else list(emitted)
        if spec.aggregate is not None:
            return [self._row(ctx.current_key, window, r) for r in results]
        start, end = (None, None) if window.is_global else (window.start, window.end)  # the reduced record, with its window
        return [{**r, "window_start": start, "window_end": end} for r in results]

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

    def call(self, what: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        try:
            return fn(*args)
        except UserFunctionError:
            raise
        except Exception as exc:
            raise UserFunctionError(
                f"step '{self.spec.step}': {what} raised {type(exc).__name__}: {exc}"
            ) from exc

    def _call_trigger(self, what: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        return self.call(f"trigger {self.spec.trigger.describe()}.{what}", fn, args)
