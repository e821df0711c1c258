"""The ``applyInPandasWithState`` function of a keyed step: one call per state
bucket and micro-batch (design A of docs/design/keyed-state.md).

Per call: load the bucket's state, fire the timers that are due, process the
bucket's records (per key in timestamp order; or hand the whole batch to an
operator that takes it, contracts.BatchHandler), fire timers that became due
meanwhile, store the bucket, and ask Spark to call again when the earliest
remaining timer is due. The user's function is called once per record; the
runtime adds no per-key or per-record call of its own. The call runs with Python's
cyclic garbage collector paused (:func:`collector_paused`).
"""

from __future__ import annotations

import gc
import heapq
import pickle
from contextlib import contextmanager
from itertools import repeat
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pandas as pd

from ember.errors import UserFunctionError
from ember.functions import KeyedProcessFunction
from ember.runner.spark.keyed.contracts import BatchHandler, GroupState, failed_call, user_name
from ember.runner.spark.keyed.reach import QuietMarks, TaskLatest
from ember.runner.spark.keyed.runtime import (
    EVENT_TIMERS,
    PRE,
    PROCESSING_TIMERS,
    TAG,
    TIME_OUT,
    KeyedRuntime,
    ember_watermark,
    empty_bucket_state,
    output_times,
    records_builder,
    rows_frame,
    side_column,
)

__all__ = ["BucketFunction"]

SWEEP = "sweep"  # design B: where a bucket's TTL sweep goes on (keyed/delta.py DeltaKeys.sweep)


class BucketFunction:
    """The function Spark calls as ``(bucket key, frames, group state) -> frames``.

    ``side_outputs`` maps each side output read downstream to its fields: the
    output then also has a ``__ember_tag`` column and one column per side field
    (see :func:`~ember.runner.spark.keyed.runtime.side_column`). ``counters`` maps
    counter names (e.g. late records dropped) to Spark accumulators.

    Pickled to the executors with the user's function; its runtime is made (and the
    function's ``open`` called) once per deserialised copy, i.e. once per task."""

    def __init__(
        self,
        fn: KeyedProcessFunction,
        step: str,
        keys: list[str],
        fields: list[str],
        out_fields: list[str],
        time_column: str | None,
        event_time: bool,
        side_outputs: dict[str, list[str]] | None = None,
        counters: dict[str, Any] | None = None,
        emit_time: bool = False,
        previous_watermark: Callable[[], int] | None = None,
        tie_break: str | None = None,
        advance_ms: int | None = None,
        dead_letter: str | None = None,
        quiet_marks: str | None = None,
    ) -> None:
        self.fn, self.step, self.keys, self.fields = fn, step, keys, fields
        self.out_fields, self.time_column, self.event_time = out_fields, time_column, event_time
        self.side_outputs = side_outputs or {}
        self.tie_break = tie_break  # a column ordering rows of equal time (no time: all rows)
        self.counters = counters or {}
        # Chained after another keyed step: rows it emitted ahead of its watermark advance
        # (PRE) come first, under the previous batch's watermark (``previous_watermark``).
        # Read by one: each output row's event time (TIME) and PRE flag, for the next step.
        self.emit_time, self.previous_watermark = emit_time, previous_watermark
        # The out-of-orderness bound when the step advances its watermark within the batch
        # (Flink's periodic watermark: after the batch's records, before Spark's end of batch),
        # so what the batch's records make due fires in the same batch; None: Spark's watermark
        # only. Set only where no other watermark holds Spark's back (translators/keyed.py).
        self.advance_ms = advance_ms
        # Whether Spark calls the bucket back at its earliest event-time timer (group timeout);
        # off for a step that fires in the batch and needs none (translators/keyed.py).
        self.group_timeout = True
        # An operator may take whole batches (contracts.BatchHandler); process_batch = None opts out.
        self.batches: BatchHandler | None = fn if callable(getattr(fn, "process_batch", None)) else None  # type: ignore[assignment]
        self.build_records = records_builder(fields)
        # A side output for the records process_element raises on, and the timers on_timer raises
        # on (``process(dead_letter=)``): such a record (the timer's key and time) becomes a dead
        # letter, what the call emitted is discarded, the job goes on.
        self.dead_letter = dead_letter
        # Where each call marks its bucket when it ends without timers (or unmarks it), so the
        # packing leaves quiet buckets without records out of the batch (keyed/reach.py); a
        # bucket's call then learns the batch's latest time from the task's first call.
        self.quiet_marks = quiet_marks
        self._quiet: QuietMarks | None = None
        self._task_latest: TaskLatest | None = None
        self.columns_out = list(out_fields)
        if self.side_outputs:
            self.columns_out += [TAG] + [side_column(t, f) for t, fs in self.side_outputs.items() for f in fs]
        if emit_time:
            self.columns_out += [TIME_OUT, PRE]
        self._rt: KeyedRuntime | None = None
        self.touched = False  # whether the current call changed the bucket's state (or may have)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_rt": None, "_quiet": None, "_task_latest": None}  # a task's own, never shipped

    def runtime(self) -> KeyedRuntime:
        if self._rt is None:
            self._rt = KeyedRuntime(self.event_time, frozenset(self.side_outputs))
            self.fn.open(self._rt)
            if self.quiet_marks is not None:
                self._quiet, self._task_latest = QuietMarks(self.quiet_marks), TaskLatest()
        return self._rt

    def __call__(self, bucket: Any, frames: Iterator[pd.DataFrame], state: GroupState,
                 latest: int | None = None) -> Iterator[pd.DataFrame]:
        """``latest``: the latest event time among the batch's records, as the packing step
        saw it (every partition tells every bucket, packing.py), when the step advances its
        watermark within the batch; else the bucket's own records tell it."""
        with collector_paused():
            rt, out, ahead = self._run(bucket, frames, state, latest)
        yield from self._frames_out(rt, out, ahead)
        rt.out = rt.marks = rt.in_batch_watermark = None

    def _run(self, bucket: Any, frames: Iterator[pd.DataFrame], state: GroupState,
              latest: int | None) -> tuple[KeyedRuntime, list[Any], int]:
        """The call up to its output: (the runtime, the rows out, how many came before the
        watermark reached the batch's)."""
        rt = self.runtime()
        if self._task_latest is not None:
            latest = self._task_latest(latest)
        rt.side, rt.counts = [], {}
        self.touched = False
        load = getattr(state, "load_blob", None)  # design B (keyed/delta.py): the batch's keys, loaded as needed
        rt.blob = load() if load is not None else pickle.loads(state.get[0]) if state.exists else empty_bucket_state()
        spark_watermark = state.getCurrentWatermarkMs() if self.event_time else 0
        watermark = ember_watermark(spark_watermark) if self.event_time else None
        rt.watermark = watermark
        rt.now = state.getCurrentProcessingTimeMs()
        out: list[Any] = []
        rt.out, rt.marks = out, ([] if self.emit_time else None)
        rt.ahead = True
        batches: Iterable[pd.DataFrame] = frames
        if self.previous_watermark is not None:
            batches, late_frames = self._split_pre(frames)
            if late_frames:  # emitted upstream before the watermark reached this batch's
                rt.watermark = ember_watermark(self.previous_watermark()) if self.event_time else None
                for pdf in late_frames:
                    self._process(rt, pdf, out)
                self.touched = True
                rt.watermark = watermark
        self._fire_due(rt, out)
        ahead = len(out)  # the rows emitted before this step's watermark reached the batch's
        rt.ahead = False
        if self.advance_ms is not None:  # what the watermark will be once the batch's records are in
            rt.in_batch_watermark = lambda seen: self.advanced(spark_watermark, seen if latest is None else max(latest, seen))
        if self.batches is not None and getattr(self.batches, "whole_batch", False):
            batches = _one_frame(batches)  # the bucket's records sorted together, not per Arrow frame
        for pdf in batches:
            seen = self._process(rt, pdf, out)
            self.touched = True
            if seen is not None and (latest is None or seen > latest):
                latest = seen
        if self.advance_ms is not None and latest is not None:
            rt.watermark = self.advanced(spark_watermark, latest)
        self._fire_due(rt, out)
        if self.touched:  # else nothing changed: a bucket told only of the batch's time
            sweep = getattr(rt.blob["keys"], "sweep", None)  # design B: a slice of the keys no record read
            if sweep is not None and rt.ttl_ms:
                rt.blob[SWEEP] = sweep(rt.blob.get(SWEEP, 0))
            rt.expire(rt.blob["keys"])
            store = getattr(state, "store_blob", None)
            if store is not None:
                store(rt.blob)
            else:
                state.update((pickle.dumps(rt.blob, protocol=pickle.HIGHEST_PROTOCOL),))
        # Spark calls a bucket back once its clock passes the timeout (Spark's watermark >
        # timeout, batch time > timeout), whether or not other keys of the bucket have records
        # then. An event-time timer is due when Ember's watermark (Spark's - 1) reaches it, i.e.
        # when Spark's passes it: the timeout is the timer itself. A processing-time timer is
        # due when the batch time reaches it: time out one ms before. Spark refuses a timeout
        # behind its watermark (equal is allowed) and one that is not positive.
        if self.event_time and rt.blob[EVENT_TIMERS] and self.group_timeout:
            state.setTimeoutTimestamp(max(rt.blob[EVENT_TIMERS][0][0], spark_watermark, 1))
        elif not self.event_time and rt.blob[PROCESSING_TIMERS]:
            state.setTimeoutDuration(max(1, rt.blob[PROCESSING_TIMERS][0][0] - 1 - rt.now))
        if self._quiet is not None:
            self._quiet.note(int(bucket[0]), not rt.blob[EVENT_TIMERS] and not rt.blob[PROCESSING_TIMERS])
        for name, n in rt.counts.items():
            if name in self.counters:
                self.counters[name].add(n)
        rt.counts = {}
        return rt, out, ahead

    def advanced(self, spark_watermark: int, latest: int) -> int | None:
        """Ember's watermark once the batch's records (the latest at ``latest`` ms) are in:
        what Spark will compute at the end of the batch from the same records — its rule
        (``max(watermark, max event time - bound)``) — one ms behind, as ember_watermark.
        Spark's watermark operator sees every record of the batch and this call only its
        bucket's, so this is never ahead of Spark's next watermark: a timer it fires would
        have fired first thing in the next batch, before any of that batch's records."""
        assert self.advance_ms is not None
        return ember_watermark(max(spark_watermark, latest - self.advance_ms))

    def _process(self, rt: KeyedRuntime, pdf: pd.DataFrame, out: list[Any]) -> int | None:
        """One frame of the bucket's records: to the operator's batch path, else one call per
        record. Returns the frame's latest event time (None without event time or rows)."""
        times = None
        tie = pdf[self.tie_break].to_numpy() if self.tie_break is not None else None
        if self.time_column is not None:  # a timestamp whatever the field's type: sort and report as epoch ms
            millis = pdf[self.time_column].to_numpy().astype("datetime64[ms]").astype(np.int64)
            order = np.argsort(millis, kind="stable") if tie is None else np.lexsort((tie, millis))
            pdf, times = pdf.iloc[order], millis[order].tolist()
        elif tie is not None:
            pdf = pdf.iloc[np.argsort(tie, kind="stable")]
        columns = [pdf[f].tolist() for f in self.fields]
        key_cols = [pdf[k].tolist() for k in self.keys]
        single = len(self.keys) == 1
        # Each record's key: a value for one key field, a tuple for several, () for a non-keyed step (window_all).
        row_keys = key_cols[0] if single else list(zip(*key_cols)) if key_cols else [()] * len(pdf)
        latest = times[-1] if times else None
        table = rt.blob["keys"]
        lookup = table.get
        prefetch = getattr(table, "prefetch", None)  # design B: the frame's keys loaded at once,
        if prefetch is not None:  # then read as a plain dict
            prefetch(pdf[self.keys[0]].to_numpy() if single else row_keys)
            lookup = dict.get.__get__(table)
        if self.batches is not None:  # the operator may handle the whole batch itself
            try:
                taken = self.batches.process_batch(rt, self.build_records, row_keys, columns, times, out)
            except UserFunctionError:
                raise
            except Exception as exc:
                raise UserFunctionError(
                    f"step '{self.step}': {type(self.fn).__name__} raised {type(exc).__name__}: {exc}"
                ) from exc
            if taken:
                return latest
        fn, step, marks = self.fn, self.step, rt.marks
        process, append = fn.process_element, out.extend
        if self.dead_letter is not None and not getattr(fn, "guards_itself", False):
            process = self._guarded(process, rt)
        # The hot loop: one user call per record and nothing else per record.
        stamps = times if times is not None else repeat(None)
        marking = marks is not None and times is not None
        for record, key, ts in zip(self.build_records(columns), row_keys, stamps):
            found = lookup(key)
            rt.current = slot = found if found is not None else {}
            rt.current_key = key
            rt.timestamp = ts
            try:
                result = process(record, rt)
                if result is not None:
                    if marking:
                        marks.append((len(out), ts))  # type: ignore[union-attr]
                    append(result)
            except UserFunctionError:
                raise  # named by an adapter (a chain names its own steps)
            except Exception as exc:
                what, seen, _ = failed_call(fn, record)
                raise UserFunctionError(
                    f"step '{step}': {what} raised {type(exc).__name__}: {exc} on record {seen!r}"
                ) from exc
            if slot:  # state objects change the slot in place
                if found is None:
                    table[key] = slot
            elif found is not None:
                del table[key]
        return latest

    def _guarded(self, process: Callable[..., Any], rt: KeyedRuntime) -> Callable[..., Any]:
        """``process`` with the record it raises on sent to the dead-letter side output (raw:
        the record as JSON, error: the step, the function and the exception): its outputs are
        materialised inside the call so a failing generator emits nothing, and the side
        outputs it emitted before raising are dropped. State and timers it changed before
        raising stay changed (docs/connectors.md)."""
        tag, step, fn = self.dead_letter, self.step, self.fn
        assert tag is not None

        def guarded(record: dict[str, Any], ctx: KeyedRuntime) -> list[Any] | None:
            emitted = len(rt.side)
            try:
                result = process(record, ctx)
                return None if result is None else list(result)
            except Exception as exc:  # noqa: BLE001 - the record becomes a dead letter
                what, seen, reported = failed_call(fn, record)
                if reported:
                    rt.dead_letter(tag, seen, f"step '{step}': {what} raised {type(exc).__name__}: {exc}",
                                   discard_from=emitted)
                else:
                    del rt.side[emitted:]
                return None

        return guarded

    def _fire_due(self, rt: KeyedRuntime, out: list[Any]) -> None:
        self._fire(rt, EVENT_TIMERS, rt.watermark, out)
        self._fire(rt, PROCESSING_TIMERS, rt.now, out)

    def _fire(self, rt: KeyedRuntime, kind: str, until: int | None, out: list[Any]) -> None:
        queue = rt.blob[kind]
        if until is None or not queue or queue[0][0] > until:
            return
        queue = rt.timer_queue(kind)
        popped = getattr(queue, "popped", None)  # a delta-layout queue notes it for its log (keyed/delta.py)
        while queue and queue[0][0] <= until:
            ts, seq, key = heapq.heappop(queue)
            if popped is not None:
                popped.append(seq)
            self.touched = True
            found = rt.enter(key)
            rt.time_domain = "event_time" if kind == EVENT_TIMERS else "processing_time"
            timers = rt.current.get(kind)
            if not timers or ts not in timers:
                continue  # deleted, or already fired
            timers.discard(ts)
            if not timers:
                del rt.current[kind]
            rt.timestamp = ts
            rt.emitting(out, ts)
            self._call("on_timer", {"key": key, "timestamp": ts}, self.fn.on_timer, (ts, rt), out, rt)
            rt.leave(key, found)

    def _call(self, what: str, record: Any, invoke: Callable[..., Any], args: tuple[Any, ...], out: list[Any],
              rt: KeyedRuntime) -> None:
        """``invoke(*args)`` (``fn.<what>``, e.g. on_timer) with its output appended to
        ``out``. With a dead-letter output, a call that raises emits nothing — its records and
        side outputs are discarded — and ``record`` (the timer: key and timestamp) becomes a
        dead letter; its state and timer changes before the raise stay, as for process_element."""
        emitted = len(rt.side)
        try:
            result = invoke(*args)
            if result is not None:
                out.extend(list(result) if self.dead_letter is not None else result)
        except UserFunctionError:
            raise
        except Exception as exc:
            error = f"step '{self.step}': {user_name(self.fn)}.{what} raised {type(exc).__name__}: {exc}"
            if self.dead_letter is None:
                raise UserFunctionError(f"{error} on {record!r}") from exc
            rt.dead_letter(self.dead_letter, record, error, discard_from=emitted)

    def _split_pre(self, frames: Iterator[pd.DataFrame]) -> tuple[list[pd.DataFrame], list[pd.DataFrame]]:
        """The frames' rows emitted upstream after, and before, its watermark advance."""
        after, before = [], []
        for pdf in frames:
            pre = pdf[PRE].to_numpy(dtype=bool, na_value=False)
            if pre.any():
                before.append(pdf[pre])
                after.append(pdf[~pre])
            else:
                after.append(pdf)
        return after, before

    def _frames_out(self, rt: KeyedRuntime, out: list[Any], ahead: int) -> Iterator[pd.DataFrame]:
        out_fields, columns_out = self.out_fields, self.columns_out
        if out:
            main = rows_frame(out, out_fields)
            extra = columns_out[len(out_fields):]
            if self.emit_time:
                extra = extra[:-2]
                main[columns_out[-2]] = output_times(rt.marks or [], len(out))
                main[PRE] = np.arange(len(out)) < ahead
            for c in extra:
                main[c] = None
            yield main[columns_out]
        if rt.side:
            by_tag: dict[str, list[tuple[Any, int | None, bool]]] = {}
            for tag, record, ts, pre in rt.side:
                by_tag.setdefault(tag, []).append((record, ts, pre))
            rt.side = []
            for tag, emitted in by_tag.items():
                fields = self.side_outputs[tag]
                given = rows_frame([r for r, _, _ in emitted], fields)
                empty = pd.Series([None] * len(emitted), dtype=object)
                data = {c: empty for c in columns_out}
                data.update({side_column(tag, f): given[f] for f in fields})
                data[TAG] = pd.Series([tag] * len(emitted), dtype=object)
                if self.emit_time:  # Flink: a side output carries the record's (or timer's) timestamp
                    data[columns_out[-2]] = pd.Series([t for _, t, _ in emitted], dtype="Int64")
                    data[PRE] = pd.Series([p for _, _, p in emitted], dtype=bool)
                yield pd.DataFrame(data, columns=columns_out)


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a bucket's call. A call allocates a
    container or more per record (the records' dicts, keys, partial matches, output rows)
    and holds many of them to its end; the collector would traverse them again and again as
    they age through its generations, though reference counting frees them. Measured on the
    CEP step: about a fifth of the call's time (docs/design/cep.md). What cyclic garbage a call
    makes (pandas', a user function's) waits for the collector's next run after it."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _one_frame(frames: Iterable[pd.DataFrame]) -> list[pd.DataFrame]:
    """A bucket's frames as one (Spark hands a bucket's rows over in Arrow batches of at most
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, each sorted apart)."""
    listed = list(frames)
    return listed if len(listed) <= 1 else [pd.concat(listed, ignore_index=True)]
