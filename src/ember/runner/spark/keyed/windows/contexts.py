"""The contexts the window operator hands to user code: a trigger's (window state and
timers of the current key's current window) and a process-window function's."""

from __future__ import annotations

from typing import Any, Callable

from ember.functions import OutputTag, WindowContext
from ember.runner.spark.keyed.cells import state_object
from ember.runner.spark.keyed.runtime import KeyedRuntime
from ember.runner.spark.keyed.windows.spec import TRIGGER_STATE, WINDOW_EVENT_TIMERS, WINDOW_PROC_TIMERS
from ember.state.descriptors import ReducingStateDescriptor, StateDescriptor
from ember.windowing.assigners import GLOBAL_WINDOW, TimeWindow
from ember.windowing.triggers import TriggerContext

__all__ = ["Scope", "WindowTriggerContext", "WindowFunctionContext"]


class Scope:
    """What trigger state objects read: the state of the current key's current window."""

    def __init__(self) -> None:
        self.current: dict[str, Any] = {}
        self.now = 0


class _RuntimeTime:
    """Time as the keyed runtime ``rt`` has it for the current call."""

    rt: KeyedRuntime

    @property
    def current_watermark(self) -> int | None:
        return self.rt.watermark

    @property
    def current_processing_time(self) -> int:
        return self.rt.now


class WindowTriggerContext(_RuntimeTime, TriggerContext):
    """What a trigger gets: the current key's current window, its state and its timers
    (each window timer is also a timer of the key in the runtime)."""

    def __init__(self) -> None:
        self.scope = Scope()
        self.window: TimeWindow = GLOBAL_WINDOW
        self.rt: KeyedRuntime = KeyedRuntime(event_time=False)
        self.merged: list[dict[str, Any]] = []
        self._states: dict[str, Any] = {}

    def bind(self, rt: KeyedRuntime, window: TimeWindow) -> "WindowTriggerContext":
        self.rt, self.window = rt, window
        self.scope.now = rt.now
        self.scope.current = rt.current.setdefault(TRIGGER_STATE, {}).setdefault(window, {})
        return self

    def release(self) -> None:
        """Drop an emptied window entry so state does not keep dead windows."""
        table = self.rt.current.get(TRIGGER_STATE)
        if table is not None and not self.scope.current:
            table.pop(self.window, None)
            if not table:
                del self.rt.current[TRIGGER_STATE]

    def _timers(self, kind: str) -> dict[int, set[TimeWindow]]:
        return self.rt.current.setdefault(kind, {})

    def register_event_time_timer(self, timestamp: int) -> None:
        self._timers(WINDOW_EVENT_TIMERS).setdefault(int(timestamp), set()).add(self.window)
        self.rt.register_event_time_timer(int(timestamp))

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._timers(WINDOW_PROC_TIMERS).setdefault(int(timestamp), set()).add(self.window)
        self.rt.register_processing_time_timer(int(timestamp))

    def _delete(self, kind: str, timestamp: int, delete: Callable[[int], None]) -> None:
        timers = self.rt.current.get(kind)
        waiting = timers.get(timestamp) if timers else None
        if timers is None or waiting is None:
            return
        waiting.discard(self.window)
        if not waiting:
            del timers[timestamp]
            delete(timestamp)
            if not timers:
                del self.rt.current[kind]

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._delete(WINDOW_EVENT_TIMERS, int(timestamp), self.rt.delete_event_time_timer)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._delete(WINDOW_PROC_TIMERS, int(timestamp), self.rt.delete_processing_time_timer)

    def get_partitioned_state(self, descriptor: StateDescriptor) -> Any:
        state = self._states.get(descriptor.name)
        if state is None:
            state = self._states[descriptor.name] = state_object(self.scope, descriptor)
        return state

    def merge_partitioned_state(self, descriptor: StateDescriptor) -> None:
        values = [m[descriptor.name] for m in self.merged if descriptor.name in m]
        if not values:
            return
        if isinstance(descriptor, ReducingStateDescriptor) and descriptor.reduce_fn is not None:
            merged = values[0]
            for v in values[1:]:
                merged = descriptor.reduce_fn(merged, v)
        else:
            merged = values[-1]
        self.scope.current[descriptor.name] = merged


class WindowFunctionContext(_RuntimeTime, WindowContext):
    """What a ProcessWindowFunction gets: the window, time, side outputs."""

    def __init__(self, rt: KeyedRuntime, window: TimeWindow) -> None:
        self.rt, self.window = rt, window

    def output(self, tag: OutputTag, record: Any) -> None:
        self.rt.output(tag, record)
