"""Reference jobs shared by the examples and the benchmarks."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pandas as pd

from ember.connectors.generators import STATE_NAMES, TRANSITIONS
from ember.functions import (
    AggregateFunction,
    BatchContext,
    Context,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    RuntimeContext,
    VectorizedKeyedFunction,
)
from ember.state.descriptors import MapStateDescriptor, StateTtlConfig, ValueStateDescriptor

__all__ = [
    "StateMachine", "StateMachineVectorized", "ALERT_SCHEMA", "CountAggregate", "KeyedCount", "KEYED_COUNT_SCHEMA",
    "Dedupe", "AlertsInWindow", "ALERT_WINDOW_SCHEMA", "RuledStateMachine", "RULES", "UNRULED", "FlowByHand",
    "KeyedCountWithTimer", "KEYED_TIMER_SCHEMA",
]

TERMINAL = 5
ALERT_SCHEMA = "address int, state string, type int"


class StateMachine(KeyedProcessFunction):
    """Flink's state-machine example (WORKLOADS.md E4): one state per address,
    an alert ``(address, state, type)`` for every invalid transition."""

    def open(self, ctx: RuntimeContext) -> None:
        self.state = ctx.get_state(ValueStateDescriptor("state", default=0))

    def process_element(self, event: dict[str, Any], ctx: Context) -> Iterator[tuple]:
        current = self.state.value()
        following = TRANSITIONS.get(current, {}).get(event["type"])
        if following is None:
            yield (event["address"], STATE_NAMES[current], event["type"])
        elif following == TERMINAL:
            self.state.clear()
        else:
            self.state.update(following)


RULES = MapStateDescriptor("rules")  # absolute second -> mask of the event types reported then
UNRULED = "no rule"  # an alert's state when no rule covered its second (a benchmark failure)


class RuledStateMachine(KeyedBroadcastProcessFunction):
    """E4's state machine whose alerts pass through rules changing every second (broadcast
    state, a RuleSource): an invalid transition is reported when the rule of its event's
    second has the event type's bit set. Rules are kept ``retain_s`` seconds."""

    def __init__(self, retain_s: int = 30) -> None:
        self.retain_s = retain_s

    def open(self, ctx: RuntimeContext) -> None:
        self.state = ctx.get_state(ValueStateDescriptor("state", default=0))

    def process_broadcast_element(self, rule: dict[str, Any], ctx: Any) -> None:
        rules = ctx.get_broadcast_state(RULES)
        rules.put(rule["second"], rule["mask"])
        if rules.contains(rule["second"] - self.retain_s):
            rules.remove(rule["second"] - self.retain_s)

    def process_element(self, event: dict[str, Any], ctx: Any) -> Iterator[tuple]:
        current = self.state.value()
        following = TRANSITIONS.get(current, {}).get(event["type"])
        if following is None:
            mask = ctx.get_broadcast_state(RULES).get(event["ts"] // 1000)
            if mask is None:
                yield (event["address"], UNRULED, event["type"])
            elif (mask >> event["type"]) & 1:
                yield (event["address"], STATE_NAMES[current], event["type"])
        elif following == TERMINAL:
            self.state.clear()
        else:
            self.state.update(following)


LAST_EVENT_TYPE = 7  # "g" ends every valid E4 sequence


class Dedupe(KeyedProcessFunction):
    """Drops a re-sent event: one not newer than the last event seen for its address.
    The last timestamp is a ``ValueState`` with a processing-time TTL of ``ttl_ms``
    (an address whose sequence never ends is forgotten then), cleared at the event
    that ends the address's sequence. The generator sends no duplicates: every event
    passes, so the benchmark can check every alert downstream."""

    def __init__(self, ttl_ms: int = 60_000) -> None:
        self.ttl_ms = ttl_ms

    def open(self, ctx: RuntimeContext) -> None:
        self.last = ctx.get_state(ValueStateDescriptor("last-ts", ttl=StateTtlConfig.of(self.ttl_ms)))

    def process_element(self, event: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        last = self.last.value()
        if last is not None and event["ts"] <= last:
            return
        if event["type"] == LAST_EVENT_TYPE:
            self.last.clear()
        else:
            self.last.update(event["ts"])
        yield event


ALERT_WINDOW_SCHEMA = "alerts bigint, detail string"


class AlertsInWindow(AggregateFunction):
    """Counts a window's alerts and lists them (``address:type``, sorted), so a benchmark
    can check every alert, not only the counts."""

    def create_accumulator(self) -> list[str]:
        return []

    def add(self, value: dict[str, Any], acc: list[str]) -> list[str]:
        acc.append(f"{value['address']}:{value['type']}")
        return acc

    def merge(self, a: list[str], b: list[str]) -> list[str]:
        return a + b

    def get_result(self, acc: list[str]) -> dict[str, Any]:
        return {"alerts": len(acc), "detail": " ".join(sorted(acc))}


class CountAggregate(AggregateFunction):
    """Counts records: the Python AggregateFunction of ``ember bench window``."""

    def create_accumulator(self) -> int:
        return 0

    def add(self, value: dict[str, Any], acc: int) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def get_result(self, acc: int) -> int:
        return acc


class StateMachineVectorized(VectorizedKeyedFunction):
    """The E4 state machine as a vectorised keyed function: a batch's events of many
    addresses at once, stepped through the transition table with numpy (step j
    advances every address by its j-th event of the batch)."""

    state_schema = "state int"

    def open(self) -> None:
        self.table = np.full((len(STATE_NAMES), 8), -1, dtype=np.int64)
        for state, moves in TRANSITIONS.items():
            for event_type, following in moves.items():
                self.table[state, event_type] = following
        self.names = np.array(STATE_NAMES, dtype=object)

    def process_batch(self, events: pd.DataFrame, state: pd.DataFrame, ctx: BatchContext) -> tuple[Any, Any]:
        address = events["address"].to_numpy()
        types = events["type"].to_numpy().astype(np.int64)
        starts = np.flatnonzero(np.r_[True, address[1:] != address[:-1]])
        lengths = np.diff(np.r_[starts, len(address)])
        keys = address[starts]
        current = np.zeros(len(keys), dtype=np.int64)
        if len(state):
            current = state["state"].reindex(keys).fillna(0).to_numpy().astype(np.int64)
        bad_at: list[np.ndarray] = []
        bad_state: list[np.ndarray] = []
        for j in range(int(lengths.max())):
            active = np.flatnonzero(lengths > j)
            at = starts[active] + j
            s = current[active]
            following = self.table[s, types[at]]
            bad = following < 0
            if bad.any():
                bad_at.append(at[bad])
                bad_state.append(s[bad])
            current[active] = np.where(bad, s, np.where(following == TERMINAL, 0, following))
        alerts = None
        if bad_at:
            at, s = np.concatenate(bad_at), np.concatenate(bad_state)
            alerts = pd.DataFrame({"address": address[at], "state": self.names[s], "type": types[at]})
        updates = pd.DataFrame({"state": np.where(current == 0, np.nan, current)}, index=keys)
        return alerts, updates


KEYED_COUNT_SCHEMA = "events bigint, new_keys bigint, keys bigint"


class KeyedCount(VectorizedKeyedFunction):
    """A running count per key (E2 with a keyed state step), vectorised. Per call it
    outputs how many events it counted, how many of their keys had no state yet (so a
    run can be checked: the events sum to the input, the new keys to the number of
    distinct keys) and how many keys it changed."""

    state_schema = "count bigint"

    def __init__(self, key: str) -> None:
        self.key = key

    def process_batch(self, events: pd.DataFrame, state: pd.DataFrame, ctx: BatchContext) -> tuple[Any, Any]:
        keys = events[self.key].to_numpy()  # sorted by key
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        unique, counts = keys[starts], np.diff(np.r_[starts, len(keys)])
        prior = state["count"].reindex(unique) if len(state) else pd.Series(np.nan, index=unique)
        new_keys = int(prior.isna().sum())
        updates = pd.DataFrame({"count": prior.fillna(0).to_numpy(np.int64) + counts}, index=unique)
        return pd.DataFrame({"events": [len(keys)], "new_keys": [new_keys], "keys": [len(unique)]}), updates


KEYED_TIMER_SCHEMA = "new int"
IDLE_MS = 3_600_000


class KeyedCountWithTimer(KeyedProcessFunction):
    """A running count per key with an idle timer (processing time, an hour after the key's
    first record: it does not fire within a benchmark's run) — per-record state and one
    waiting timer per key, what ``ember bench grouping-keyed --step process`` measures the
    timer queues with. One row per record: ``new`` is 1 for a key's first record, else 0."""

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count"))

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        n = self.count.value()
        if n is None:
            ctx.register_processing_time_timer(ctx.current_processing_time + IDLE_MS)
            self.count.update(1)
            return iter(({"new": 1},))
        self.count.update(n + 1)
        return iter(({"new": 0},))


class FlowByHand(KeyedProcessFunction):
    """``ember bench cep``'s baseline, written by hand: per address, a flow opened by a or c
    and closed by g within ``window_ms`` (the first open since the last close; an open
    older than the window is replaced) — what the benchmark's pattern matches."""

    OPENS, CLOSE = (1, 3), 7

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms

    def open(self, ctx: RuntimeContext) -> None:
        self.opened = ctx.get_state(ValueStateDescriptor("opened"))

    def process_element(self, event: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        kind, ts = event["type"], event["ts"]
        opened = self.opened.value()
        if kind in self.OPENS:
            if opened is None or ts - opened >= self.window_ms:
                self.opened.update(ts)
        elif kind == self.CLOSE and opened is not None:
            self.opened.clear()
            if ts - opened < self.window_ms:
                yield {"address": event["address"], "opened": opened, "closed": ts}
