"""The window operator's whole-batch paths (spec.WindowPath), and the combiner that
pre-aggregates before the shuffle.

Each path gives exactly the per-element path's output and leaves the same state
(a job may switch paths across a restart; tests/unit/runner/spark/keyed checks
both), vectorising around the user's function: records are grouped with numpy
and pandas, the user's ``add`` / ``reduce`` runs once per record, the trigger
once per new window instead of once per record.
"""

from __future__ import annotations

import pickle
from itertools import islice
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import pandas as pd

from ember.errors import UserFunctionError
from ember.runner.spark.keyed.contracts import RecordsBuilder
from ember.runner.spark.keyed.reach import Reach
from ember.runner.spark.keyed.runtime import KeyedRuntime, records_builder
from ember.runner.spark.keyed.windows.contexts import WindowTriggerContext
from ember.runner.spark.keyed.windows.spec import (
    LATE_COUNTER,
    MARKER,
    PARTIAL_ACC,
    PARTIAL_COUNT,
    PARTIAL_START,
    WINDOWS,
    WindowPath,
    WindowSpec,
)
from ember.windowing.assigners import GLOBAL_WINDOW, TimeWindow, TumblingWindows, WindowAssigner
from ember.windowing.triggers import CountTrigger, PurgingTrigger, TriggerResult, count_window_size

__all__ = ["BatchPath", "WindowHooks", "batch_path", "make_combiner", "window_starts"]


class WindowHooks(Protocol):
    """What the paths use of the operator (operator.WindowOperator): its step, the trigger
    context, and the per-element path's firing, cleanup and lateness rules."""

    spec: WindowSpec
    trigger_ctx: WindowTriggerContext

    def process_element(self, value: dict[str, Any], ctx: KeyedRuntime) -> list[Any]: ...

    def emit(self, ctx: KeyedRuntime, window: TimeWindow, windows: dict[TimeWindow, Any], out: list[Any]) -> None: ...

    def apply_result(self, ctx: KeyedRuntime, window: TimeWindow, result: TriggerResult, out: list[Any]) -> None: ...

    def register_cleanup(self, ctx: KeyedRuntime, window: TimeWindow) -> None: ...

    def is_late(self, window: TimeWindow, ctx: KeyedRuntime) -> bool: ...

    def call(self, what: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any: ...

    def tidy(self, ctx: KeyedRuntime) -> None: ...


def last_window_start(assigner: WindowAssigner, ts: np.ndarray) -> np.ndarray:
    """The start of each record's last window (tumbling or sliding): the one that ends last,
    so a record is late exactly when that window is."""
    slide = assigner.size_ms if isinstance(assigner, TumblingWindows) else assigner.slide_ms  # type: ignore[attr-defined]
    return ts - (ts - assigner.offset_ms) % slide  # type: ignore[attr-defined]


def window_starts(assigner: WindowAssigner, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(record index, window start) for every window of every record (tumbling or sliding)."""
    size = assigner.size_ms  # type: ignore[attr-defined]
    slide = size if isinstance(assigner, TumblingWindows) else assigner.slide_ms  # type: ignore[attr-defined]
    last = last_window_start(assigner, ts)
    idx, starts = [], []
    for j in range(-(-size // slide)):
        start = last - j * slide
        ok = start > ts - size
        idx.append(np.nonzero(ok)[0])
        starts.append(start[ok])
    return np.concatenate(idx), np.concatenate(starts)


def _edges(*columns: np.ndarray) -> list[int]:
    """Boundaries of the runs of equal values in sorted ``columns`` (first 0, last the length)."""
    n = len(columns[0])
    if not n:
        return [0]
    change = np.zeros(n - 1, dtype=bool)
    for c in columns:
        change |= np.diff(c) != 0
    return [0, *(np.flatnonzero(change) + 1).tolist(), n]


class BatchPath:
    """One whole-batch path of an operator: ``run`` returns True when it took the batch."""

    def __init__(self, op: WindowHooks) -> None:
        self.op, self.spec = op, op.spec

    def run(self, rt: KeyedRuntime, build: RecordsBuilder, keys: list[Any], columns: list[list[Any]],
            times: list[int] | None, out: list[Any]) -> bool:
        raise NotImplementedError


def batch_path(op: WindowHooks) -> BatchPath | None:
    """The whole-batch path of ``op``'s step (None: per element)."""
    path = op.spec.path
    if path is WindowPath.PARTIALS:
        return PartialsPath(op)
    if path is WindowPath.COUNT:
        return CountPath(op)
    if path is WindowPath.TIME_BATCH:
        return TimeBatchPath(op)
    return None


class CountPath(BatchPath):
    """Tumbling count windows a key at a time: the same state as the per-element path
    (the count trigger's counter and the window's accumulator), one pass over its records."""

    def __init__(self, op: WindowHooks) -> None:
        super().__init__(op)
        trigger = self.spec.trigger
        assert isinstance(trigger, PurgingTrigger) and isinstance(trigger.trigger, CountTrigger)  # spec.path says so
        size = count_window_size(trigger)
        assert size is not None
        self.size = size
        self.counter = trigger.trigger.counter

    def run(self, rt: KeyedRuntime, build: RecordsBuilder, keys: list[Any], columns: list[list[Any]],
            times: list[int] | None, out: list[Any]) -> bool:
        op, spec, size = self.op, self.spec, self.size
        records = build(columns)
        agg, reduce_fn = spec.aggregate, spec.reduce
        codes, uniques = pd.factorize(pd.Series(keys, dtype=object), sort=False)
        order = np.argsort(codes, kind="stable")
        sorted_codes = codes[order]
        edges = _edges(sorted_codes)
        order_l = order.tolist()
        for a, b in zip(edges, edges[1:]):
            key = uniques[sorted_codes[a]]
            found = rt.enter(key)
            tctx = op.trigger_ctx.bind(rt, GLOBAL_WINDOW)
            seen_state = tctx.get_partitioned_state(self.counter)
            seen = seen_state.get() or 0
            contents = rt.current.setdefault(WINDOWS, {})
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
                        op.emit(rt, GLOBAL_WINDOW, contents, out)
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
            op.tidy(rt)
            rt.leave(key, found)
        return True


class TimeBatchPath(BatchPath):
    """Fixed time windows whose trigger depends on time only, with an incremental function:
    per element, such triggers only (re)register timers that depend on the window (and
    the batch's time), never on the element, so a batch is grouped by (key, window)
    first and the trigger runs once per new window. Elements behind the watermark (a
    late firing or a late record) go one by one through the per-element path."""

    def run(self, rt: KeyedRuntime, build: RecordsBuilder, keys: list[Any], columns: list[list[Any]],
            times: list[int] | None, out: list[Any]) -> bool:
        op, spec, n = self.op, self.spec, len(keys)
        assigner = spec.assigner
        size = assigner.size_ms  # type: ignore[attr-defined]
        processing = assigner.processing_time
        ts = np.full(n, rt.now, dtype=np.int64) if processing else np.asarray(times, dtype=np.int64)
        wm = None if processing else rt.watermark
        slow = np.zeros(n, dtype=bool)
        if wm is not None:
            rec, starts = window_starts(assigner, ts)
            slow[rec[starts + size - 1 <= wm]] = True
        fast = np.flatnonzero(~slow)
        records = build(columns)
        recs_a, starts_l, group_keys, edges = self._groups([keys[i] for i in fast.tolist()], ts[fast])
        recs = fast[recs_a].tolist() if len(recs_a) else []
        agg, reduce_fn = spec.aggregate, spec.reduce
        add = agg.add if agg is not None else None
        for g, (a, b) in enumerate(zip(edges, edges[1:])):
            key = group_keys[g]
            found = rt.enter(key)
            window = TimeWindow(starts_l[a], starts_l[a] + size)
            contents = rt.current.setdefault(WINDOWS, {})
            acc = contents.get(window)
            new = acc is None
            try:
                if add is not None:
                    if new:
                        acc = agg.create_accumulator()  # type: ignore[union-attr]
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
                tctx = op.trigger_ctx.bind(rt, window)
                op.apply_result(rt, window, spec.trigger.on_element(first, rt.timestamp, window, tctx), out)
                tctx.release()
                op.register_cleanup(rt, window)
            rt.leave(key, found)
        for i in np.flatnonzero(slow).tolist():
            key = keys[i]
            found = rt.enter(key)
            rt.timestamp = int(ts[i])
            out.extend(op.process_element(records[i], rt))
            rt.leave(key, found)
        return True

    def _groups(self, keys: list[Any], ts: np.ndarray) -> tuple[np.ndarray, list[int], list[Any], list[int]]:
        """Each record's windows grouped by (key, window): record indices, window starts,
        each group's key, and group boundaries; time order kept within a group."""
        rec, starts = window_starts(self.spec.assigner, ts)
        codes, uniques = pd.factorize(pd.Series(keys, dtype=object), sort=False)
        order = np.lexsort((starts, codes[rec]))
        rec, starts = rec[order], starts[order]
        group_codes = codes[rec]
        edges = _edges(group_codes, starts)
        return rec, starts.tolist(), [uniques[c] for c in group_codes[edges[:-1]].tolist()], edges


class PartialsPath(BatchPath):
    """Partial aggregates from the combiner: a window past its end drops the whole
    partial; otherwise the partial is merged in, and a new window gets its trigger timer
    and cleanup. A dropped partial counts the records whose *last* window it is as late
    (Flink counts a record dropped when all its windows are late, i.e. its last one is;
    a sliding window's other records still reach their later windows)."""

    def run(self, rt: KeyedRuntime, build: RecordsBuilder, keys: list[Any], columns: list[list[Any]],
            times: list[int] | None, out: list[Any]) -> bool:
        op, spec = self.op, self.spec
        size, agg = spec.assigner.size_ms, spec.aggregate  # type: ignore[attr-defined]
        assert agg is not None  # only an AggregateFunction's windows are combined (WindowSpec.combinable)
        for key, partial in zip(keys, build(columns)):
            if partial[PARTIAL_ACC] is None:
                continue  # a marker: only the batch's latest time, which the runtime read
            start = partial[PARTIAL_START]
            window = TimeWindow(start, start + size)
            if op.is_late(window, rt):
                rt.count(LATE_COUNTER, partial[PARTIAL_COUNT])
                continue
            found = rt.enter(key)
            contents = rt.current.setdefault(WINDOWS, {})
            acc = pickle.loads(partial[PARTIAL_ACC])
            prev = contents.get(window)
            contents[window] = acc if prev is None else op.call("merge", agg.merge, (prev, acc))
            if prev is None:
                rt.timestamp = start
                tctx = op.trigger_ctx.bind(rt, window)
                op.apply_result(rt, window, spec.trigger.on_element(partial, start, window, tctx), out)
                tctx.release()
                op.register_cleanup(rt, window)
            rt.leave(key, found)
        return True


def make_combiner(spec: WindowSpec, fields: list[str], keys: tuple[str, ...], time_column: str,
                  reach: Reach | None = None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function that pre-aggregates a partition's records per
    (key, window) with the user's ``add``; the window step ``merge`` s the partials
    (:class:`PartialsPath`). Records of a (key, window) are added in timestamp order.
    With ``reach`` the output also has one marker row per bucket it names (``MARKER`` = the
    bucket, no partial) with the partition's latest event time, so those buckets' calls learn
    it (the step's in-batch watermark, bucket.py; keyed/reach.py)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    build, agg = records_builder(fields), spec.aggregate
    assert agg is not None and spec.combinable

    def key_codes(batch: Any) -> tuple[np.ndarray, list[Any]]:
        if not keys:  # a non-keyed window (window_all): one key, ()
            return np.zeros(batch.num_rows, dtype=np.int64), [()]
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
            rec, starts = window_starts(spec.assigner, ts)
            order = np.lexsort((ts[rec], starts, codes[rec]))
            rec, starts = rec[order], starts[order]
            rec_ts = ts[rec].tolist()  # ascending within each group
            # running count of pairs that are their record's last window: a group's share is a difference
            ends_here = np.concatenate(([0], np.cumsum(starts == last_window_start(spec.assigner, ts)[rec]))).tolist()
            group_codes = codes[rec]
            edges = _edges(group_codes, starts)
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
                latest = rec_ts[b - 1] if slot is None else max(slot[2], rec_ts[b - 1])
                partials[slot_key] = [acc, (slot[1] if slot else 0) + ends_here[b] - ends_here[a], latest]
        if not partials:
            return
        columns: list[list[Any]] = [[] for _ in keys]
        starts_out: list[Any] = []
        accs: list[Any] = []
        counts: list[int] = []
        latest_out: list[int] = []
        for (key, start), (acc, n, latest) in partials.items():
            for col, part in zip(columns, key if len(keys) > 1 else (key,)):
                col.append(part)
            starts_out.append(start)
            accs.append(pickle.dumps(acc, protocol=pickle.HIGHEST_PROTOCOL))
            counts.append(n)
            latest_out.append(latest)
        # A partial's time: its latest record's, so the window step's in-batch watermark
        # (bucket.py) advances as far as the records would have moved it.
        names = [*keys, PARTIAL_START, PARTIAL_ACC, PARTIAL_COUNT, time_column]
        markers: list[Any] = []
        if reach is not None:  # one marker row per bucket reached: no key, no partial, the partition's latest time
            reached = list(reach.targets())
            markers = [None] * len(starts_out) + reached
            columns = [c + [None] * len(reached) for c in columns]
            starts_out += [None] * len(reached)
            accs += [None] * len(reached)
            counts += [0] * len(reached)
            latest_out += [max(latest_out)] * len(reached)
        times = pc.multiply(pa.array(latest_out, pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC"))
        arrays = [*columns, starts_out, accs, counts, times]
        if reach is not None:
            names.append(MARKER)
            arrays.append(pa.array(markers, pa.int32()))
        yield pa.RecordBatch.from_pydict(dict(zip(names, arrays)))

    return combine
