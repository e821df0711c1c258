"""The keyed-state runtime inside Spark's Python workers (design A of docs/design/keyed-state.md).

Records are grouped by a hash bucket of their key (``max_parallelism`` buckets, 128 by default,
fixed: the bucket is part of the checkpoint's state layout). Spark calls a
:class:`~ember.runner.spark.keyed.bucket.BucketFunction` once per bucket and
micro-batch with all of that bucket's records; the bucket's keyed state is one
pickled dict ``{"keys": {key: {state name: value}}, timer queues}`` held in
Spark's state store (RocksDB), so it is checkpointed with the batch and
restored on restart or replay.

This module holds that layout and :class:`KeyedRuntime`: the context a keyed
function sees (the current key, its slot, time, timers, side outputs). State
cells live in cells.py, the per-call driver in bucket.py.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable

import numpy as np
import pandas as pd

from ember.errors import UserFunctionError
from ember.functions import Context, RuntimeContext, record_text
from ember.job import DEFAULT_MAX_PARALLELISM
from ember.runner.spark.keyed.cells import read_only, state_object
from ember.state.descriptors import StateDescriptor
from ember.state.interfaces import State

__all__ = [
    "STATE_BUCKETS", "TAG", "SIDE_PREFIX", "EVENT_TIMERS", "PROCESSING_TIMERS", "PRE", "TIME_OUT", "output_times",
    "KeyedRuntime", "empty_bucket_state", "side_column", "records_builder", "ember_watermark", "BROADCAST", "NO_KEY",
]

STATE_BUCKETS = DEFAULT_MAX_PARALLELISM  # the default number of state buckets (a job's max_parallelism)
TAG = "__ember_tag"  # which output a row belongs to: null = the main output, else a side output's name
SIDE_PREFIX = "__ember_side_"
# On the output of a keyed step read by another: whether a row was emitted before the step's
# watermark advanced to the batch's (by a timer the advance fired), i.e. ahead of that watermark.
PRE = "__ember_pre"
TIME_OUT = "__ember_time"  # a keyed step's output rows' event time (ms), read by the next step
ANCHOR = "__ember_watermark_anchor"  # a null timestamp column Spark's watermark rides on between steps
# Columns a keyed step's output carries to the next keyed step; never shown to user
# functions, dropped before anything else reads the rows.
HIDDEN = (TIME_OUT, PRE, ANCHOR)
EVENT_TIMERS, PROCESSING_TIMERS = "\x00event_timers", "\x00processing_timers"  # reserved slot names: a key's timers
BROADCAST = "broadcast"  # a bucket's copy of a broadcast step's broadcast state: {state name: dict}


def without_hidden(struct: Any) -> Any:
    """``struct`` (a Spark ``StructType``) without the HIDDEN columns: the fields user functions see."""
    from pyspark.sql.types import StructType

    return StructType([f for f in struct.fields if f.name not in HIDDEN])


def ember_watermark(spark_watermark_ms: int) -> int | None:
    """Ember's (Flink's) watermark from Spark's: one millisecond behind it, None before Spark has one.

    Spark's watermark is ``max event time - bound``, Flink's bounded-out-of-orderness
    watermark ``max - bound - 1``: "every event at or before it has arrived". Ember's
    lateness, timer and trigger rules are Flink's (an element is late when ``timestamp <=
    watermark``; a timer fires when ``watermark >= timer``), so they need Flink's watermark,
    else a record exactly ``bound`` behind the maximum would be late in one batching of the
    stream and on time in another. Spark's watermark is 0 until a batch moved it (it never
    goes below 0): no watermark yet, and no non-negative timestamp is behind it.
    """
    return spark_watermark_ms - 1 if spark_watermark_ms > 0 else None


def output_times(marks: list[tuple[int, int]], n: int) -> Any:
    """Each of ``n`` output rows' timestamp from a call's marks (KeyedRuntime.marks)."""
    if not marks:
        return np.zeros(n, dtype=np.int64)
    positions = np.fromiter((p for p, _ in marks), dtype=np.int64, count=len(marks))
    stamps = np.fromiter((t for _, t in marks), dtype=np.int64, count=len(marks))
    index = np.searchsorted(positions, np.arange(n), side="right") - 1
    return stamps[np.maximum(index, 0)]


def empty_bucket_state() -> dict[str, Any]:
    """A bucket's state: each key's slot, and the bucket's timer queues (heaps of
    ``(timestamp, sequence, key)``; an entry whose timer was deleted is skipped)."""
    return {"keys": {}, EVENT_TIMERS: [], PROCESSING_TIMERS: [], "n": 0}


def side_column(tag: str, field: str) -> str:
    """The column carrying ``field`` of side output ``tag`` in a step's combined output."""
    return f"{SIDE_PREFIX}{tag}__{field}"


def records_builder(fields: list[str]) -> Callable[[list[list[Any]]], list[dict[str, Any]]]:
    """A function turning columns (lists) into record dicts. Generated for the
    field names: a dict display is about twice as fast as ``dict(zip(...))``."""
    values = [f"v{i}" for i in range(len(fields))]
    body = ", ".join(f"{f!r}: {v}" for f, v in zip(fields, values))
    return eval(f"lambda columns: [{{{body}}} for {', '.join(values)}{',' if len(values) == 1 else ''} in zip(*columns)]")  # noqa: S307 - names are repr()-quoted


def _column(values: list[Any] | tuple[Any, ...]) -> Any:
    """``values`` as a numpy column when numpy types it as numbers or booleans (numpy
    infers that several times faster than pandas); else as they are, for pandas to type
    (numpy would turn ``[1, "a"]`` into strings and nested lists into a matrix)."""
    try:
        column = np.array(values)
    except ValueError:
        return values
    return column if column.ndim == 1 and column.dtype.kind in "iufb" else values


def rows_frame(rows: list[Any], fields: list[str]) -> Any:
    """A pandas frame of a call's output ``rows`` (dicts, or tuples in ``fields``
    order; a missing field is null), built column by column. Rows of mixed shapes
    take pandas' from-records path; the result is the same."""
    columns: Any = None
    if rows and type(rows[0]) is dict:
        try:
            columns = [[r[f] for r in rows] for f in fields]
        except (KeyError, TypeError, IndexError):  # a dict without some field, or a tuple among dicts
            columns = None
    elif rows and all(type(r) in (tuple, list) for r in rows) and set(map(len, rows)) == {len(fields)}:
        columns = list(zip(*rows))
    if columns is None:
        records = [r if type(r) is dict else dict(zip(fields, r)) for r in rows]
        return pd.DataFrame(records, columns=fields)
    return pd.DataFrame({f: _column(c) for f, c in zip(fields, columns)}, columns=fields)


class _NoKey(dict):
    """The current slot while ``process_broadcast_element`` runs: there is no current key."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise UserFunctionError(
            "process_broadcast_element has no current key: keyed state and timers belong to process_element and "
            "on_timer (ctx.apply_to_keyed_state(descriptor, fn) reaches every key's state)"
        )

    get = __getitem__ = __setitem__ = __delitem__ = __contains__ = setdefault = pop = _refuse


NO_KEY = _NoKey()


class _BroadcastSlot:
    """What a broadcast state cell reads: the bucket's broadcast state (blob[BROADCAST])."""

    __slots__ = ("rt",)

    def __init__(self, rt: "KeyedRuntime") -> None:
        self.rt = rt

    @property
    def current(self) -> dict[str, Any]:
        return self.rt.blob.setdefault(BROADCAST, {})

    @property
    def now(self) -> int:
        return self.rt.now


class KeyedRuntime(RuntimeContext, Context):
    """Both the open() context and the per-element context of a keyed function, for
    one task: state cells read ``current`` (the current key's slot) and ``now``."""

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
        # Side outputs of the call: (tag, record, event time, emitted ahead of the step's
        # watermark advance) — the time and flag read only by a keyed step chained after one.
        self.side: list[tuple[str, Any, int | None, bool]] = []
        self.ahead = False  # whether the call is before its watermark advance (bucket.py)
        self.counts: dict[str, int] = {}
        # The call's output list, and, when a downstream step needs the outputs' event time,
        # (position in it, timestamp) marks: row i has the timestamp of the last mark at or
        # before it (Flink's output timestamps: the record's, the timer's, a window's end - 1).
        self.out: list[Any] | None = None
        self.marks: list[tuple[int, int]] | None = None
        # Where the step advances its watermark within the batch (bucket.py, advance_ms), during
        # the batch's records: the watermark it will have after them, given the latest event time
        # among the records seen (it takes the batch's latest others told it, if later); else None.
        self.in_batch_watermark: Callable[[int], int | None] | None = None
        # A broadcast step's broadcast states: name -> (read-write cell, read-only view); which
        # one get_broadcast_state returns (process_broadcast_element: writable); the keyed state
        # cells open() declared, by name.
        self.broadcast: dict[str, tuple[State, State]] = {}
        self.broadcast_writable = False
        self.cells: dict[str, State] = {}

    def emitting(self, out: list[Any], timestamp: int) -> None:
        """Note that the rows appended to ``out`` from here on carry ``timestamp``."""
        if self.marks is not None and out is self.out:
            self.marks.append((len(out), timestamp))

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
            self.side.append((name, record, self.timestamp, self.ahead))

    def dead_letter(self, tag: str, failed: Any, error: str, discard_from: int | None = None) -> None:
        """``failed`` (a record, or what names a failed call: a timer, a window) to the
        dead-letter output ``tag``: ``raw`` its JSON text, ``error`` why; with
        ``discard_from``, the side outputs the failed call emitted (from that index) go first."""
        if discard_from is not None:
            del self.side[discard_from:]
        self.side.append((tag, {"raw": record_text(failed), "error": error}, self.timestamp, self.ahead))

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
            queue, entry = self.timer_queue(kind), (int(timestamp), self.blob["n"], self.current_key)
            heapq.heappush(queue, entry)
            pushed = getattr(queue, "pushed", None)  # a delta-layout queue notes it for its log (keyed/delta.py)
            if pushed is not None:
                pushed.append(entry)

    def timer_queue(self, kind: str) -> list:
        """The bucket's timer queue ``kind`` as a heap to push to or pop from — a delta-layout
        queue not read yet (keyed/delta.py ``StoredQueue``) is read now."""
        queue = self.blob[kind]
        if not isinstance(queue, list):  # (a LoggedQueue is a list)
            queue = self.blob[kind] = queue.load()
        return queue

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

    def get_state(self, descriptor: StateDescriptor) -> State:
        state = state_object(self, descriptor)
        if descriptor.name in self.cells:
            raise UserFunctionError(f"state '{descriptor.name}' is declared twice")
        self.cells[descriptor.name] = state
        if descriptor.ttl is not None:
            self.ttl_ms[descriptor.name] = descriptor.ttl.ttl_ms
        return state

    def declare_broadcast(self, descriptors: tuple[StateDescriptor, ...]) -> None:
        """Make the broadcast states of ``descriptors`` (MapStateDescriptors) reachable."""
        holder = _BroadcastSlot(self)
        for d in descriptors:
            cell = state_object(holder, d)
            self.broadcast[d.name] = (cell, read_only(cell, d.name))

    def get_broadcast_state(self, descriptor: StateDescriptor) -> State:
        """The broadcast MapState of ``descriptor``: writable in process_broadcast_element, else read-only."""
        found = self.broadcast.get(getattr(descriptor, "name", None))  # type: ignore[arg-type]
        if found is None:
            raise UserFunctionError(
                f"no broadcast state {getattr(descriptor, 'name', descriptor)!r} here: "
                f"the broadcast stream declares {sorted(self.broadcast) or 'none'}"
            )
        return found[0] if self.broadcast_writable else found[1]

    def apply_to_keyed_state(self, descriptor: StateDescriptor, fn: Callable[[Any, State], None]) -> None:
        """``fn(key, state)`` for every key of the bucket holding ``descriptor``'s keyed state
        (from process_broadcast_element: every bucket runs it, so every key is reached once)."""
        if not self.broadcast_writable:
            raise UserFunctionError("apply_to_keyed_state is for process_broadcast_element")
        cell = self.cells.get(descriptor.name)
        if cell is None:
            raise UserFunctionError(f"apply_to_keyed_state: state '{descriptor.name}' is not declared in open()")
        table, saved = self.blob["keys"], (self.current, self.current_key)
        load_all = getattr(table, "load_all", None)  # design B: the table holds the keys loaded so far
        if load_all is not None:
            load_all()
        try:
            for key in list(table):
                slot = table[key]
                if descriptor.name not in slot:
                    continue
                self.current, self.current_key = slot, key
                fn(key, cell)
                if not slot:
                    del table[key]
        finally:
            self.current, self.current_key = saved

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
