"""The keyed-state runtime inside Spark's Python workers (design A of docs/design/keyed-state.md).

Records are grouped by a hash bucket of their key (``STATE_BUCKETS`` buckets,
fixed: the bucket is part of the checkpoint's state layout). Spark calls
:func:`make_bucket_function`'s function once per bucket and micro-batch with
all of that bucket's records; the bucket's keyed state is one pickled dict
``{key: {state name: value}}`` held in Spark's state store (RocksDB), so it is
checkpointed with the batch and restored on restart or replay. The user's
function is called once per record; the runtime adds no per-key or
per-record call of its own.
"""

from __future__ import annotations

import heapq
import pickle
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd

from ember.errors import UserFunctionError
from ember.functions import Context, KeyedProcessFunction, RuntimeContext
from ember.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from ember.state.interfaces import AggregatingState, ListState, MapState, ReducingState, ValueState

__all__ = [
    "STATE_BUCKETS", "TAG", "SIDE_PREFIX", "EVENT_TIMERS", "PROCESSING_TIMERS",
    "empty_bucket_state", "make_bucket_function", "state_object", "side_column",
]

STATE_BUCKETS = 128
TAG = "__ember_tag"  # which output a row belongs to: null = the main output, else a side output's name
SIDE_PREFIX = "__ember_side_"
_ABSENT = object()
EVENT_TIMERS, PROCESSING_TIMERS = "\x00event_timers", "\x00processing_timers"  # reserved slot names: a key's timers


def empty_bucket_state() -> dict[str, Any]:
    """A bucket's state: each key's slot, and the bucket's timer queues (heaps of
    ``(timestamp, sequence, key)``; an entry whose timer was deleted is skipped)."""
    return {"keys": {}, EVENT_TIMERS: [], PROCESSING_TIMERS: [], "n": 0}


class _State:
    """One named state of the current key. With a TTL, the stored value is
    ``(value, last written or read ms)`` and expired values read as absent."""

    __slots__ = ("_rt", "_name", "_ttl_ms", "_touch_on_read")

    def __init__(self, rt: "_Runtime", d: StateDescriptor) -> None:
        self._rt, self._name = rt, d.name
        self._ttl_ms = d.ttl.ttl_ms if d.ttl else None
        self._touch_on_read = bool(d.ttl and d.ttl.update_on == "read_and_write")

    def _get(self) -> Any:
        slot = self._rt.current
        stored = slot.get(self._name, _ABSENT)
        if stored is _ABSENT or self._ttl_ms is None:
            return stored
        value, touched = stored
        if self._rt.now - touched >= self._ttl_ms:
            del slot[self._name]
            return _ABSENT
        if self._touch_on_read:
            slot[self._name] = (value, self._rt.now)
        return value

    def _set(self, value: Any) -> None:
        self._rt.current[self._name] = value if self._ttl_ms is None else (value, self._rt.now)

    def clear(self) -> None:
        self._rt.current.pop(self._name, None)


class _Value(_State, ValueState):
    __slots__ = ("_default",)

    def __init__(self, rt: "_Runtime", d: ValueStateDescriptor) -> None:
        super().__init__(rt, d)
        self._default = d.default

    def value(self) -> Any:
        v = self._get()
        return self._default if v is _ABSENT else v

    def update(self, value: Any) -> None:
        self._set(value)


class _List(_State, ListState):
    def get(self) -> list[Any]:
        v = self._get()
        return [] if v is _ABSENT else list(v)

    def add(self, value: Any) -> None:
        v = self._get()
        self._set([value] if v is _ABSENT else [*v, value])

    def add_all(self, values: Any) -> None:
        v = self._get()
        self._set(list(values) if v is _ABSENT else [*v, *values])

    def update(self, values: Any) -> None:
        values = list(values)
        self._set(values) if values else self.clear()


class _Map(_State, MapState):
    def _map(self) -> dict[Any, Any]:
        v = self._get()
        return {} if v is _ABSENT else v

    def get(self, key: Any, default: Any = None) -> Any:
        return self._map().get(key, default)

    def put(self, key: Any, value: Any) -> None:
        self._set({**self._map(), key: value})

    def put_all(self, entries: dict[Any, Any]) -> None:
        self._set({**self._map(), **entries})

    def remove(self, key: Any) -> None:
        m = {k: v for k, v in self._map().items() if k != key}
        self._set(m) if m else self.clear()

    def contains(self, key: Any) -> bool:
        return key in self._map()

    def keys(self) -> list[Any]:
        return list(self._map().keys())

    def values(self) -> list[Any]:
        return list(self._map().values())

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._map().items())

    def is_empty(self) -> bool:
        return not self._map()


class _Reducing(_State, ReducingState):
    __slots__ = ("_fn",)

    def __init__(self, rt: "_Runtime", d: ReducingStateDescriptor) -> None:
        super().__init__(rt, d)
        self._fn = d.reduce_fn

    def get(self) -> Any:
        v = self._get()
        return None if v is _ABSENT else v

    def add(self, value: Any) -> None:
        v = self._get()
        self._set(value if v is _ABSENT else self._fn(v, value))


class _Aggregating(_State, AggregatingState):
    __slots__ = ("_fn",)

    def __init__(self, rt: "_Runtime", d: AggregatingStateDescriptor) -> None:
        super().__init__(rt, d)
        self._fn = d.aggregate_fn

    def get(self) -> Any:
        v = self._get()
        return None if v is _ABSENT else self._fn.get_result(v)

    def add(self, value: Any) -> None:
        v = self._get()
        self._set(self._fn.add(value, self._fn.create_accumulator() if v is _ABSENT else v))


_STATE_KINDS: dict[type, type[_State]] = {
    ValueStateDescriptor: _Value,
    ListStateDescriptor: _List,
    MapStateDescriptor: _Map,
    ReducingStateDescriptor: _Reducing,
    AggregatingStateDescriptor: _Aggregating,
}


def side_column(tag: str, field: str) -> str:
    """The column carrying ``field`` of side output ``tag`` in a step's combined output."""
    return f"{SIDE_PREFIX}{tag}__{field}"


def records_builder(fields: list[str]) -> Callable[[list[list[Any]]], list[dict[str, Any]]]:
    """A function turning columns (lists) into record dicts. Generated for the
    field names: a dict display is about twice as fast as ``dict(zip(...))``."""
    values = [f"v{i}" for i in range(len(fields))]
    body = ", ".join(f"{f!r}: {v}" for f, v in zip(fields, values))
    return eval(f"lambda columns: [{{{body}}} for {', '.join(values)}{',' if len(values) == 1 else ''} in zip(*columns)]")  # noqa: S307 - names are repr()-quoted


def state_object(holder: Any, descriptor: StateDescriptor) -> Any:
    """The state object for ``descriptor`` reading ``holder.current`` / ``holder.now``."""
    kind = _STATE_KINDS.get(type(descriptor))
    if kind is None:
        raise UserFunctionError(f"get_state takes a state descriptor from ember.state, got {descriptor!r}")
    return kind(holder, descriptor)


class _Runtime(RuntimeContext, Context):
    """Both the open() context and the per-element context; state objects read ``current``."""

    def __init__(self, event_time: bool, side_tags: frozenset[str] = frozenset()) -> None:
        self.current: dict[str, Any] = {}
        self.current_key: Any = None
        self.timestamp: int | None = None
        self.now = 0
        self.watermark: int | None = None
        self.time_domain = "event_time"  # of the timer being fired
        self.event_time = event_time
        self.blob: dict[str, Any] = empty_bucket_state()
        self.ttl_ms: dict[str, int] = {}
        self.side_tags = side_tags
        self.side: list[tuple[str, Any]] = []
        self.counts: dict[str, int] = {}
        self._names: set[str] = set()

    def enter(self, key: Any) -> dict[str, Any] | None:
        """Make ``key`` current; returns its stored slot (None when it has no state yet)."""
        found = self.blob["keys"].get(key)
        self.current = found if found is not None else {}
        self.current_key = key
        return found

    def leave(self, key: Any, found: dict[str, Any] | None) -> None:
        """Store the current key's slot back (or drop it when it became empty)."""
        if self.current:
            if found is None:
                self.blob["keys"][key] = self.current
        elif found is not None:
            del self.blob["keys"][key]

    def output(self, tag: Any, record: Any) -> None:
        name = getattr(tag, "name", None)
        if name is None:
            raise UserFunctionError(f"output takes an OutputTag, got {tag!r}")
        if name in self.side_tags:
            self.side.append((name, record))

    def count(self, counter: str, n: int = 1) -> None:
        self.counts[counter] = self.counts.get(counter, 0) + n

    @property
    def current_processing_time(self) -> int:
        return self.now

    @property
    def current_watermark(self) -> int | None:
        return self.watermark

    def _register(self, kind: str, timestamp: int) -> None:
        timers = self.current.setdefault(kind, set())
        if timestamp not in timers:
            timers.add(timestamp)
            self.blob["n"] += 1
            heapq.heappush(self.blob[kind], (int(timestamp), self.blob["n"], self.current_key))

    def register_event_time_timer(self, timestamp: int) -> None:
        if not self.event_time:
            raise UserFunctionError(
                "event-time timers need event time: give the source a WatermarkStrategy.for_bounded_out_of_orderness(...)"
            )
        self._register(EVENT_TIMERS, timestamp)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._register(PROCESSING_TIMERS, timestamp)

    def _delete(self, kind: str, timestamp: int) -> None:
        timers = self.current.get(kind)
        if timers is not None:
            timers.discard(timestamp)  # its queue entry is skipped when due
            if not timers:
                del self.current[kind]  # a key left with no state and no timers is dropped

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._delete(EVENT_TIMERS, timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._delete(PROCESSING_TIMERS, timestamp)

    def get_state(self, descriptor: StateDescriptor) -> Any:
        state = state_object(self, descriptor)
        if descriptor.name in self._names:
            raise UserFunctionError(f"state '{descriptor.name}' is declared twice")
        self._names.add(descriptor.name)
        if descriptor.ttl is not None:
            self.ttl_ms[descriptor.name] = descriptor.ttl.ttl_ms
        return state

    def expire(self, table: dict[Any, dict[str, Any]]) -> None:
        """Drop expired entries of every key in ``table`` (before it is written)."""
        if not self.ttl_ms:
            return
        for key in list(table):
            slot = table[key]
            for name, ttl in self.ttl_ms.items():
                stored = slot.get(name)
                if stored is not None and self.now - stored[1] >= ttl:
                    del slot[name]
            if not slot:
                del table[key]


def make_bucket_function(
    fn: KeyedProcessFunction,
    step: str,
    keys: list[str],
    fields: list[str],
    out_fields: list[str],
    time_column: str | None,
    event_time: bool,
    side_outputs: dict[str, list[str]] | None = None,
    counters: dict[str, Any] | None = None,
) -> Callable[[Any, Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]:
    """The ``applyInPandasWithState`` function of one keyed process step.

    Per call (one bucket, one micro-batch): fire the timers that are due, process
    the bucket's records (per key in timestamp order), fire timers that became due
    meanwhile, store the bucket, and ask Spark to call again when the earliest
    remaining timer is due (``setTimeoutTimestamp`` / ``setTimeoutDuration``).

    ``side_outputs`` maps each side output read downstream to its fields: the
    output then also has a ``__ember_tag`` column and one column per side field
    (see :func:`side_column`). ``counters`` maps counter names (e.g. late records
    dropped) to Spark accumulators.
    """
    holder: dict[str, Any] = {}
    process_batch = getattr(fn, "process_batch", None)  # optional: (rt, build, keys, columns, times, out) -> handled
    build_records = records_builder(fields)
    side_outputs = side_outputs or {}
    counters = counters or {}
    columns_out = list(out_fields)
    if side_outputs:
        columns_out += [TAG] + [side_column(t, f) for t, fs in side_outputs.items() for f in fs]

    def runtime() -> _Runtime:
        rt = holder.get("rt")
        if rt is None:  # once per deserialised function, i.e. per task
            rt = holder["rt"] = _Runtime(event_time, frozenset(side_outputs))
            fn.open(rt)
        return rt

    def frames_out(rt: _Runtime, out: list[Any]) -> Iterator[pd.DataFrame]:
        if out:
            rows = [r if type(r) is dict else dict(zip(out_fields, r)) for r in out]
            main = pd.DataFrame(rows, columns=out_fields)
            for c in columns_out[len(out_fields):]:
                main[c] = None
            yield main
        if rt.side:
            by_tag: dict[str, list[Any]] = {}
            for tag, record in rt.side:
                by_tag.setdefault(tag, []).append(record)
            rt.side = []
            for tag, records in by_tag.items():
                fields_ = side_outputs[tag]
                rows = [r if type(r) is dict else dict(zip(fields_, r)) for r in records]
                given = pd.DataFrame(rows, columns=fields_)
                empty = pd.Series([None] * len(rows), dtype=object)
                data = {c: empty for c in columns_out}
                data.update({side_column(tag, f): given[f] for f in fields_})
                data[TAG] = pd.Series([tag] * len(rows), dtype=object)
                yield pd.DataFrame(data, columns=columns_out)

    def call(what: str, record: Any, invoke: Callable[..., Any], args: tuple[Any, ...], out: list[Any]) -> None:
        try:
            result = invoke(*args)
            if result is not None:
                out.extend(result)
        except UserFunctionError:
            raise
        except Exception as exc:
            raise UserFunctionError(
                f"step '{step}': {type(fn).__name__}.{what} raised {type(exc).__name__}: {exc} on {record!r}"
            ) from exc

    def fire(rt: _Runtime, kind: str, until: int | None, out: list[Any]) -> None:
        queue = rt.blob[kind]
        while until is not None and queue and queue[0][0] <= until:
            ts, _, key = heapq.heappop(queue)
            found = rt.enter(key)
            rt.time_domain = "event_time" if kind == EVENT_TIMERS else "processing_time"
            timers = rt.current.get(kind)
            if not timers or ts not in timers:
                continue  # deleted, or already fired
            timers.discard(ts)
            if not timers:
                del rt.current[kind]
            rt.timestamp = ts
            call("on_timer", {"key": key, "timestamp": ts}, fn.on_timer, (ts, rt), out)
            rt.leave(key, found)

    def fire_due(rt: _Runtime, out: list[Any]) -> None:
        fire(rt, EVENT_TIMERS, rt.watermark, out)
        fire(rt, PROCESSING_TIMERS, rt.now, out)

    def run(bucket: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        rt = runtime()
        rt.side, rt.counts = [], {}
        rt.blob = pickle.loads(state.get[0]) if state.exists else empty_bucket_state()
        rt.watermark = state.getCurrentWatermarkMs() if event_time else None
        rt.now = state.getCurrentProcessingTimeMs()
        out: list[Any] = []
        fire_due(rt, out)
        for pdf in frames:
            times = None
            if time_column is not None:  # a timestamp whatever the field's type: sort and report as epoch ms
                millis = pdf[time_column].to_numpy().astype("datetime64[ms]").astype(np.int64)
                order = np.argsort(millis, kind="stable")
                pdf, times = pdf.iloc[order], millis[order].tolist()
            columns = [pdf[f].tolist() for f in fields]
            key_cols = [pdf[k].tolist() for k in keys]
            single = len(keys) == 1
            if process_batch is not None:  # the operator handles the whole batch itself
                key_list = key_cols[0] if single else list(zip(*key_cols))
                if process_batch(rt, build_records, key_list, columns, times, out):
                    continue
            table, process, append = rt.blob["keys"], fn.process_element, out.extend
            # The hot loop: one user call per record and nothing else per record.
            for i, record in enumerate(build_records(columns)):
                key = key_cols[0][i] if single else tuple(c[i] for c in key_cols)
                found = table.get(key)
                rt.current = slot = found if found is not None else {}
                rt.current_key = key
                if times is not None:
                    rt.timestamp = times[i]
                try:
                    result = process(record, rt)
                    if result is not None:
                        append(result)
                except Exception as exc:
                    raise UserFunctionError(
                        f"step '{step}': {type(fn).__name__}.process_element raised {type(exc).__name__}: {exc} "
                        f"on record {record!r}"
                    ) from exc
                if slot:  # state objects change the slot in place
                    if found is None:
                        table[key] = slot
                elif found is not None:
                    del table[key]
        fire_due(rt, out)
        rt.expire(rt.blob["keys"])
        state.update((pickle.dumps(rt.blob, protocol=pickle.HIGHEST_PROTOCOL),))
        if event_time and rt.blob[EVENT_TIMERS]:
            state.setTimeoutTimestamp(max(rt.blob[EVENT_TIMERS][0][0], (rt.watermark or 0) + 1))
        elif not event_time and rt.blob[PROCESSING_TIMERS]:
            state.setTimeoutDuration(max(1, rt.blob[PROCESSING_TIMERS][0][0] - rt.now))
        for name, n in rt.counts.items():
            if name in counters:
                counters[name].add(n)
        rt.counts = {}
        yield from frames_out(rt, out)

    return run
