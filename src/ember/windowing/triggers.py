"""Triggers: when a window's contents are emitted (FIRE) and/or dropped (PURGE).

A trigger is called for every element added to a window and for every timer
it registered, and answers with a :class:`TriggerResult`. Its per-window state
(``ctx.get_partitioned_state``) and timers are part of the job's checkpoint.
Write your own by subclassing :class:`Trigger`; the built-ins cover Flink's.
"""

from __future__ import annotations

import enum
from datetime import timedelta
from typing import Any

from ember.errors import ConfigError
from ember.state.descriptors import ReducingStateDescriptor, StateDescriptor, ValueStateDescriptor
from ember.time.durations import to_ms
from ember.time.timers import TimerService
from ember.windowing.assigners import TimeWindow

__all__ = [
    "TriggerResult",
    "Trigger",
    "TriggerContext",
    "EventTimeTrigger",
    "ProcessingTimeTrigger",
    "CountTrigger",
    "ContinuousProcessingTimeTrigger",
    "ContinuousEventTimeTrigger",
    "PurgingTrigger",
    "NeverTrigger",
    "fires_on_time_only",
    "count_window_size",
]


class TriggerResult(enum.Enum):
    CONTINUE = (False, False)
    FIRE = (True, False)
    PURGE = (False, True)
    FIRE_AND_PURGE = (True, True)

    @property
    def is_fire(self) -> bool:
        return self.value[0]

    @property
    def is_purge(self) -> bool:
        return self.value[1]


class TriggerContext(TimerService):
    """What a trigger can see and do for the current key and window: time, timers
    (a due timer calls ``on_event_time`` / ``on_processing_time``) and state."""

    def get_partitioned_state(self, descriptor: StateDescriptor) -> Any:
        """State of the current key *and window* (value, list, map, reducing, aggregating)."""
        raise NotImplementedError

    def merge_partitioned_state(self, descriptor: StateDescriptor) -> None:
        """On a session merge: combine the merged windows' ``descriptor`` state into
        the new window's (a reducing state reduces, other kinds keep the newest)."""
        raise NotImplementedError


class Trigger:
    """Base class. Every hook returns CONTINUE unless overridden."""

    def on_element(self, element: Any, timestamp: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        """Whether the trigger works with merging (session) windows."""
        return False

    def on_merge(self, window: TimeWindow, ctx: TriggerContext) -> None:  # noqa: B027 - optional hook
        """Called for the window that merged sessions became."""

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:  # noqa: B027 - optional hook
        """Called when the window is removed: delete its timers and state."""

    def describe(self) -> str:
        return type(self).__name__


class EventTimeTrigger(Trigger):
    """Fires once the watermark passes the window's end (the default of event-time
    windows); an element arriving later, within the allowed lateness, fires the
    window again at once."""

    @staticmethod
    def create() -> "EventTimeTrigger":
        return EventTimeTrigger()

    def on_element(self, element: Any, timestamp: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        wm = ctx.current_watermark
        if wm is not None and window.max_timestamp <= wm:
            return TriggerResult.FIRE
        ctx.register_event_time_timer(window.max_timestamp)
        return TriggerResult.CONTINUE

    def on_event_time(self, time: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if time == window.max_timestamp else TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: TimeWindow, ctx: TriggerContext) -> None:
        wm = ctx.current_watermark
        if wm is None or window.max_timestamp > wm:
            ctx.register_event_time_timer(window.max_timestamp)

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        ctx.delete_event_time_timer(window.max_timestamp)


class ProcessingTimeTrigger(Trigger):
    """Fires when processing time (the micro-batch time) passes the window's end."""

    @staticmethod
    def create() -> "ProcessingTimeTrigger":
        return ProcessingTimeTrigger()

    def on_element(self, element: Any, timestamp: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        ctx.register_processing_time_timer(window.max_timestamp)
        return TriggerResult.CONTINUE

    def on_processing_time(self, time: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: TimeWindow, ctx: TriggerContext) -> None:
        ctx.register_processing_time_timer(window.max_timestamp)

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        ctx.delete_processing_time_timer(window.max_timestamp)


def _add(a: int, b: int) -> int:
    return a + b


class CountTrigger(Trigger):
    """Fires every ``count`` elements of a window (the count restarts after each firing)."""

    def __init__(self, count: int) -> None:
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            raise ConfigError(f"CountTrigger: count must be a positive int, got {count!r}")
        self.count = count
        self._state = ReducingStateDescriptor("count", reduce_fn=_add)

    @staticmethod
    def of(count: int) -> "CountTrigger":
        return CountTrigger(count)

    @property
    def counter(self) -> ReducingStateDescriptor:
        """The per-window count this trigger keeps (a runner may advance it in bulk)."""
        return self._state

    def on_element(self, element: Any, timestamp: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        seen = ctx.get_partitioned_state(self._state)
        seen.add(1)
        if seen.get() >= self.count:
            seen.clear()
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def can_merge(self) -> bool:
        return True

    def on_merge(self, window: TimeWindow, ctx: TriggerContext) -> None:
        ctx.merge_partitioned_state(self._state)

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        ctx.get_partitioned_state(self._state).clear()

    def describe(self) -> str:
        return f"CountTrigger({self.count})"


class _Continuous(Trigger):
    """Shared by the continuous triggers: fire every ``interval`` while the window is
    open and, when ``fire_at_end``, once more when the watermark passes its end."""

    processing = False
    fire_at_end = True  # the event-time trigger always does; the processing-time one when asked

    def __init__(self, interval: timedelta | int) -> None:
        self.interval_ms = to_ms(interval, "trigger interval")
        self._next = ValueStateDescriptor("next-fire")

    def _now(self, ctx: TriggerContext) -> int | None:
        return ctx.current_processing_time if self.processing else ctx.current_watermark

    def _register(self, ctx: TriggerContext, at: int) -> None:
        (ctx.register_processing_time_timer if self.processing else ctx.register_event_time_timer)(at)

    def _delete(self, ctx: TriggerContext, at: int) -> None:
        (ctx.delete_processing_time_timer if self.processing else ctx.delete_event_time_timer)(at)

    def on_element(self, element: Any, timestamp: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        if self.fire_at_end:
            wm = ctx.current_watermark
            if wm is not None and window.max_timestamp <= wm:
                return TriggerResult.FIRE  # late element within the allowed lateness
            ctx.register_event_time_timer(window.max_timestamp)
        nxt = ctx.get_partitioned_state(self._next)
        if nxt.value() is None:
            now = timestamp if not self.processing else ctx.current_processing_time
            at = now - now % self.interval_ms + self.interval_ms
            nxt.update(at)
            self._register(ctx, at)
        return TriggerResult.CONTINUE

    def _on_time(self, time: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        nxt = ctx.get_partitioned_state(self._next)
        if nxt.value() == time:
            at = time + self.interval_ms
            nxt.update(at)
            self._register(ctx, at)
            return TriggerResult.FIRE
        return TriggerResult.CONTINUE

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        nxt = ctx.get_partitioned_state(self._next)
        if nxt.value() is not None:
            self._delete(ctx, nxt.value())
            nxt.clear()
        if self.fire_at_end:
            ctx.delete_event_time_timer(window.max_timestamp)

    def describe(self) -> str:
        return f"{type(self).__name__}({self.interval_ms} ms)"


class ContinuousProcessingTimeTrigger(_Continuous):
    """Fires every ``interval`` of processing time (micro-batch time) while the
    window has elements. By default the window is removed at its end plus the
    allowed lateness without a final firing, as in Flink; ``fire_at_end=True``
    also fires once the watermark passes the window's end — "update every
    second, final result at the end", the Yahoo benchmark's output."""

    processing = True

    def __init__(self, interval: timedelta | int, fire_at_end: bool = False) -> None:
        super().__init__(interval)
        self.fire_at_end = bool(fire_at_end)

    @staticmethod
    def of(interval: timedelta | int, fire_at_end: bool = False) -> "ContinuousProcessingTimeTrigger":
        return ContinuousProcessingTimeTrigger(interval, fire_at_end)

    def on_processing_time(self, time: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        return self._on_time(time, window, ctx)

    def on_event_time(self, time: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        return TriggerResult.FIRE if self.fire_at_end and time == window.max_timestamp else TriggerResult.CONTINUE

    def describe(self) -> str:
        return super().describe() + (" + at the window's end" if self.fire_at_end else "")


class ContinuousEventTimeTrigger(_Continuous):
    """Fires every ``interval`` of event time (as the watermark advances) and at the window's end."""

    @staticmethod
    def of(interval: timedelta | int) -> "ContinuousEventTimeTrigger":
        return ContinuousEventTimeTrigger(interval)

    def on_event_time(self, time: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        if time == window.max_timestamp:
            return TriggerResult.FIRE
        return self._on_time(time, window, ctx)


class PurgingTrigger(Trigger):
    """Turns every FIRE of ``trigger`` into FIRE_AND_PURGE."""

    def __init__(self, trigger: Trigger) -> None:
        if not isinstance(trigger, Trigger):
            raise ConfigError(f"PurgingTrigger wraps a Trigger, got {trigger!r}")
        self.trigger = trigger

    @staticmethod
    def of(trigger: Trigger) -> "PurgingTrigger":
        return PurgingTrigger(trigger)

    @staticmethod
    def _purging(result: TriggerResult) -> TriggerResult:
        return TriggerResult.FIRE_AND_PURGE if result.is_fire else result

    def on_element(self, element: Any, timestamp: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.trigger.on_element(element, timestamp, window, ctx))

    def on_event_time(self, time: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.trigger.on_event_time(time, window, ctx))

    def on_processing_time(self, time: int, window: TimeWindow, ctx: TriggerContext) -> TriggerResult:
        return self._purging(self.trigger.on_processing_time(time, window, ctx))

    def can_merge(self) -> bool:
        return self.trigger.can_merge()

    def on_merge(self, window: TimeWindow, ctx: TriggerContext) -> None:
        self.trigger.on_merge(window, ctx)

    def clear(self, window: TimeWindow, ctx: TriggerContext) -> None:
        self.trigger.clear(window, ctx)

    def describe(self) -> str:
        return f"PurgingTrigger({self.trigger.describe()})"


class NeverTrigger(Trigger):
    """Never fires (the default of :class:`~ember.windowing.GlobalWindows`)."""


def fires_on_time_only(trigger: Trigger) -> bool:
    """Whether ``trigger``'s ``on_element`` only (re)registers timers that depend on the
    window and the current time, never on the element — so a runner may group a batch
    by (key, window) and call it once per new window. True for the built-in time
    triggers themselves; a subclass may override ``on_element``, so it is not assumed."""
    return type(trigger) in (EventTimeTrigger, ProcessingTimeTrigger, ContinuousProcessingTimeTrigger)


def count_window_size(trigger: Trigger) -> int | None:
    """N when ``trigger`` is a tumbling count window's, ``PurgingTrigger(CountTrigger(N))``
    (exactly those classes), else None."""
    if type(trigger) is PurgingTrigger and type(trigger.trigger) is CountTrigger:
        return trigger.trigger.count
    return None
