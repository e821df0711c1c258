"""A bucket function on ``transformWithStateInPandas`` instead of ``applyInPandasWithState``.

Spark runs one ``applyInPandasWithState`` per query but chains any number of
``transformWithStateInPandas`` operators, each with its own watermark. This
adapter runs Ember's bucket functions (bucket.py, vectorized.py) unchanged on
that operator: the grouping key is still the state bucket, the bucket's blob is
one ``ValueState``, and the one timeout Spark's ``GroupState`` offers becomes
one registered timer. Per bucket and batch that is a handful of socket round
trips to the JVM (state get/update, timer register/delete), never one per key
or record.

Timers: ``applyInPandasWithState`` calls a group once Spark's watermark is
*past* its timeout; ``transformWithState`` fires a timer once the watermark
*reaches* it. An event-time timeout ``t`` is therefore registered as ``t + 1``.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Iterator

import pandas as pd
from pyspark.sql.streaming.stateful_processor import ExpiredTimerInfo, StatefulProcessor, StatefulProcessorHandle, TimerValues

__all__ = ["BucketProcessor", "DeltaBucketProcessor", "DeltaSlotProcessor", "SlotBlob"]

BucketCall = Callable[[Any, Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]


class _State:
    """The ``GroupState`` surface a bucket function uses (contracts.GroupState), on TWS state."""

    def __init__(self, proc: BucketProcessor, timer_values: TimerValues, fired: int | None) -> None:
        self._proc, self._tv = proc, timer_values
        self._value: tuple[Any, ...] | None = None
        self._loaded = False
        self._timeout: int | None = None
        self._fired = fired

    def _load(self) -> tuple[Any, ...] | None:
        if not self._loaded:
            self._value, self._loaded = self._proc.blob.get(), True
        return self._value

    @property
    def exists(self) -> bool:
        return self._load() is not None

    @property
    def get(self) -> tuple[Any, ...]:
        value = self._load()
        if value is None:
            raise ValueError("no state")
        return value

    def update(self, value: tuple[Any, ...]) -> None:
        self._proc.blob.update(value)
        self._value, self._loaded = value, True

    def remove(self) -> None:
        self._proc.blob.clear()
        self._value, self._loaded = None, True

    def getCurrentWatermarkMs(self) -> int:  # noqa: N802 - Spark's names
        return max(self._tv.getCurrentWatermarkInMs(), 0)

    def getCurrentProcessingTimeMs(self) -> int:  # noqa: N802
        return self._tv.getCurrentProcessingTimeInMs()

    def setTimeoutTimestamp(self, timestamp_ms: int) -> None:  # noqa: N802
        self._timeout = timestamp_ms + 1  # TWS fires at the watermark, APWS once past it

    def setTimeoutDuration(self, duration_ms: int) -> None:  # noqa: N802
        self._timeout = self.getCurrentProcessingTimeMs() + duration_ms + 1

    def finish(self) -> None:
        """Leave exactly one registered timer: the timeout asked for, if any."""
        registered = self._proc.timer.get()
        old = registered[0] if registered is not None else None
        if old is not None and old == self._fired:
            old = None  # Spark removed it when it fired
        if old is not None and old == self._timeout:
            return
        handle = self._proc.handle
        if old is not None:
            handle.deleteTimer(old)
        if self._timeout is None:
            if registered is not None:
                self._proc.timer.clear()
        else:
            handle.registerTimer(self._timeout)
            self._proc.timer.update((self._timeout,))


class BucketProcessor(StatefulProcessor):
    """``transformWithStateInPandas`` processor running ``call(bucket, frames, state)``."""

    def __init__(self, call: BucketCall, columns: list[str], anchor: str | None = None) -> None:
        # Spark 4.3 hands this operator its rows as tuples rebuilt into frames, losing the
        # column names (``_0``, ``_1``...): ``columns`` names them again, in input order.
        self.call, self.columns = call, columns
        self.anchor = anchor  # a null timestamp column added to every output

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.blob = handle.getValueState("blob", "blob binary")
        self.timer = handle.getValueState("timer", "at long")

    def _run(self, key: Any, frames: Iterator[pd.DataFrame], timer_values: TimerValues, fired: int | None) -> Iterator[pd.DataFrame]:
        state = _State(self, timer_values, fired)
        yield from self._outputs(key[0], frames, state)
        state.finish()

    def _outputs(self, bucket: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        """The bucket function's output frames, each with the null anchor column if asked."""
        for pdf in self.call(bucket, self._named(frames), state):
            if self.anchor is not None:
                nulls = pd.Series([None] * len(pdf), dtype="datetime64[us, UTC]", index=pdf.index)
                if self.anchor in pdf.columns:
                    pdf[self.anchor] = nulls
                else:  # (insert: a frame sliced from another takes the column without pandas' copy warning)
                    pdf.insert(len(pdf.columns), self.anchor, nulls)
            yield pdf

    def _named(self, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for pdf in frames:
            pdf.columns = self.columns
            yield pdf

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues) -> Iterator[pd.DataFrame]:  # noqa: N802,N803
        return self._run(key, rows, timerValues, None)

    def handleExpiredTimer(  # noqa: N802
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo  # noqa: N803
    ) -> Iterator[pd.DataFrame]:
        return self._run(key, iter(()), timerValues, expiredTimerInfo.getExpiryTimeInMs())

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: TimerValues) -> None:  # noqa: N802,N803
        """The first micro-batch of a checkpoint converted from a savepoint of another state
        layout (savepoints/convert.py): the bucket's state as the savepoint held it — the
        blob layout's dict, pickled by Ember into the job's own checkpoint — written as this
        operator keeps it, with its earliest timer registered. Spark calls this before any
        record or timer of the batch."""
        self.seed(key, initialState, timerValues, self.anchor is not None)

    def seed(self, key: Any, initial: pd.DataFrame, timer_values: TimerValues, event_time: bool) -> None:
        """:meth:`handleInitialState` for the bucket ``key``; ``event_time``: the operator runs on
        event time (a fan-out's lane processor has no anchor of its own: keyed/lanes.py)."""
        for payload in initial.iloc[:, -1]:  # (one row per bucket; columns unnamed, as input rows')
            self._seed(key, pickle.loads(payload), timer_values, event_time)

    def _seed(self, key: Any, blob: Any, timer_values: TimerValues, event_time: bool) -> None:
        """``blob``: a process function's or window's dict, or a vectorised step's table."""
        state = _State(self, timer_values, None)
        state.update((pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL),))
        _seed_timeout(state, blob, event_time)
        state.finish()

    def close(self) -> None:
        pass


def _seed_timeout(state: _State, blob: Any, event_time: bool) -> None:
    """A bucket's Spark timer after its state was handed in: its earliest timer, as a bucket
    call leaves it (bucket.py)."""
    from ember.runner.spark.keyed.runtime import EVENT_TIMERS, PROCESSING_TIMERS

    if not isinstance(blob, dict):  # a vectorised step's table: no timers
        return
    if event_time and blob.get(EVENT_TIMERS):
        state.setTimeoutTimestamp(max(int(blob[EVENT_TIMERS][0][0]), state.getCurrentWatermarkMs(), 1))
    elif not event_time and blob.get(PROCESSING_TIMERS):
        state.setTimeoutDuration(max(1, int(blob[PROCESSING_TIMERS][0][0]) - 1 - state.getCurrentProcessingTimeMs()))


class _DeltaState(_State):
    """The ``GroupState`` time surface plus the bucket's design-B table (``table``), which
    a vectorised bucket function uses instead of the pickled blob (vectorized.py)."""

    def __init__(self, proc: BucketProcessor, timer_values: TimerValues, table: Any) -> None:
        super().__init__(proc, timer_values, None)
        self.table = table


class DeltaBucketProcessor(BucketProcessor):
    """``transformWithStateInPandas`` processor of a vectorised step on design B
    (keyed/delta.py): per bucket a log of changed rows (``ListState``) and its version
    (``ValueState``) in Spark's state store, the table itself on the executor's disk.

    ``directory``: where this step's working copies live on every executor (one
    subdirectory per bucket); ``counters``: Spark accumulators of what the step
    changed, appended, compacted and rebuilt (benchmarks, the dashboard)."""

    def __init__(self, call: BucketCall, columns: list[str], anchor: str | None, directory: str, key: str,
                 fields: list[str], types: list[Any], step: str, counters: dict[str, Any]) -> None:
        super().__init__(call, columns, anchor)
        self.directory, self.key, self.fields, self.types, self.step = directory, key, fields, types, step
        self.counters = counters

    def init(self, handle: StatefulProcessorHandle) -> None:
        from ember.runner.spark.keyed.delta import Version

        self.handle = handle
        self.parts = handle.getListState("parts", "part binary")
        self.version = handle.getValueState("version", Version.SCHEMA)

    def _log(self, bucket: int) -> Any:
        """The bucket's delta log over its working copy on this executor."""
        import os

        from ember.runner.spark.keyed.delta import DeltaLog, LocalTable, local_state_root

        where = os.path.join(local_state_root(), self.directory, str(bucket))
        return DeltaLog(self.parts, self.version, LocalTable(where, self.types), bucket, self.fields)

    def _run(self, key: Any, frames: Iterator[pd.DataFrame], timer_values: TimerValues, fired: int | None) -> Iterator[pd.DataFrame]:
        from ember.runner.spark.keyed.vectorized import DeltaTable

        bucket = int(key[0])
        log = self._log(bucket)
        try:
            log.open()
            yield from self._outputs(bucket, frames, _DeltaState(self, timer_values,
                                                                 DeltaTable(log, self.key, self.fields, self.types, self.step)))
        finally:
            log.close()
        _count(log, self.counters)

    def _seed(self, key: Any, blob: Any, timer_values: TimerValues, event_time: bool) -> None:
        """The bucket's handed-in table (handleInitialState: a DataFrame indexed by key, the
        step's state fields as columns) written into its log and working copy."""
        from ember.runner.spark.keyed.vectorized import DeltaTable

        log = self._log(int(key[0]))
        try:
            log.open()
            if len(blob):
                DeltaTable(log, self.key, self.fields, self.types, self.step).update(blob[self.fields])
        finally:
            log.close()
        _count(log, self.counters)


def _count(log: Any, counters: dict[str, Any]) -> None:
    """Add what a call's delta log did to the job's counters (keyed/delta.py: DELTA_COUNTERS)."""
    for name, n in (("state_changed_keys", log.changed_keys), ("state_appended_bytes", log.appended_bytes),
                    ("state_compacted_bytes", log.compacted_bytes), ("state_rebuilt_rows", max(log.rebuilt_rows, 0))):
        if n and name in counters:
            counters[name].add(n)


class SlotBlob:
    """A process function's bucket on design B, the half beside Spark's ``GroupState``
    surface: the bucket's ``blob`` value holding the overflow of collided keys and the log's
    version — read once and written once per call — beside its keys' slots in a delta log
    with a working copy (``load_blob`` / ``store_blob``, bucket.py). The timer queues are not
    in the blob: each key's slot holds its timers, and the queues live beside the working copy
    (``SlotTable.timers``), rebuilt from the slots when the copy has none at its version.
    Mixed into a class that gives ``get``, ``exists`` and ``update`` (the blob's value) and
    sets ``log`` (a DeltaLog) after :meth:`start_slots`."""

    # (the host's: _State, or the test driver's fake group state, comes first in the MRO)
    @property
    def exists(self) -> bool:
        raise NotImplementedError

    @property
    def get(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def update(self, value: tuple[Any, ...]) -> None:
        raise NotImplementedError

    def start_slots(self) -> None:
        self.log: Any = None
        self._meta: dict[str, Any] | None = None
        self.blob: dict[str, Any] | None = None
        self.timers_kept = True  # whether the working copy holds the queues the call began with
        self._queues_at: tuple[tuple[int, int, int], str] = ((0, 0, 0), "")  # (their mark, the tag) when last kept

    def meta(self) -> dict[str, Any]:
        if self._meta is None:
            import pickle

            from ember.runner.spark.keyed.runtime import empty_bucket_state

            self._meta = pickle.loads(self.get[0]) if self.exists else empty_bucket_state()
        return self._meta

    def load_blob(self) -> dict[str, Any]:
        from ember.runner.spark.keyed.delta import OVERFLOW, DeltaKeys
        from ember.runner.spark.keyed.runtime import EVENT_TIMERS, PROCESSING_TIMERS

        blob = self.blob = self.meta()
        blob["keys"] = DeltaKeys(self.log, blob.setdefault(OVERFLOW, {}))
        # (a blob written before 2026-11-28 holds queues too: the slots say the same)
        queues = self.log.local.timers(self.log.version.tag, self._rebuild_timers) if self.log.rebuilt_rows < 0 else None
        blob[EVENT_TIMERS], blob[PROCESSING_TIMERS] = queues if queues is not None else self._rebuild_timers()
        self._queues_at = self._queues_mark(blob), self.log.version.tag
        return blob

    def _rebuild_timers(self) -> tuple[list, list]:
        """The queues from the slots as the working copy holds them (at the call's start: the
        call writes its changes to the copy when it ends); kept anew when the call ends."""
        from ember.runner.spark.keyed.delta import OVERFLOW

        assert self.blob is not None
        event, processing, self.blob["n"] = self.log.local.rebuild_timers(self.blob[OVERFLOW], self.blob.get("n", 0))
        self.timers_kept = False
        return event, processing

    @staticmethod
    def _queues_mark(blob: dict[str, Any]) -> tuple[int, int, int]:
        """What changes with the queues: a timer pushed draws the next sequence number, a
        popped one leaves its queue shorter (runtime._register, bucket.py _fire)."""
        from ember.runner.spark.keyed.runtime import EVENT_TIMERS, PROCESSING_TIMERS

        return blob["n"], len(blob[EVENT_TIMERS]), len(blob[PROCESSING_TIMERS])

    def store_blob(self, blob: dict[str, Any]) -> None:
        import pickle

        from ember.runner.spark.keyed.runtime import EVENT_TIMERS, PROCESSING_TIMERS

        blob["keys"].flush()  # (moves the version, in this same blob)
        self.keep_timers()
        self.update((pickle.dumps({**blob, "keys": {}, EVENT_TIMERS: [], PROCESSING_TIMERS: []},
                                  protocol=pickle.HIGHEST_PROTOCOL),))

    def keep_timers(self) -> None:
        """Write the queues beside the working copy, for its version now."""
        from ember.runner.spark.keyed.runtime import EVENT_TIMERS, PROCESSING_TIMERS

        if self.blob is None:
            return
        changed = not self.timers_kept or self._queues_mark(self.blob) != self._queues_at[0]
        if changed or self.log.version.tag != self._queues_at[1]:
            self.log.local.store_timers(self.log.version.tag, self.blob[EVENT_TIMERS], self.blob[PROCESSING_TIMERS], changed)
            self._queues_at = self._queues_mark(self.blob), self.log.version.tag
        self.timers_kept = True


class _SlotState(_State, SlotBlob):
    """A process function's bucket on design B: the ``GroupState`` surface (timeouts as
    one timer, as :class:`_State`) and :class:`SlotBlob`."""

    def __init__(self, proc: BucketProcessor, timer_values: TimerValues, fired: int | None) -> None:
        super().__init__(proc, timer_values, fired)
        self.start_slots()


class _MetaVersion:
    """The log's version kept in the bucket's blob (one state read and write per call
    instead of three): the ``ValueState`` surface DeltaLog uses."""

    def __init__(self, state: _SlotState) -> None:
        self.state = state

    def get(self) -> tuple[Any, ...] | None:
        return self.state.meta().get(VERSION)

    def update(self, row: tuple[Any, ...]) -> None:
        self.state.meta()[VERSION] = row


VERSION = "version"


class DeltaSlotProcessor(BucketProcessor):
    """``transformWithStateInPandas`` processor of a process function on design B: its
    keys' slots in a delta log (``ListState``) with a working copy on the executor's disk
    (keyed/delta.py ``SlotTable``), its timer queues beside that copy (never in the log)."""

    def __init__(self, call: BucketCall, columns: list[str], anchor: str | None, directory: str,
                 counters: dict[str, Any]) -> None:
        super().__init__(call, columns, anchor)
        self.directory, self.counters = directory, counters

    def init(self, handle: StatefulProcessorHandle) -> None:
        super().init(handle)
        self.parts = handle.getListState("parts", "part binary")

    def _state(self, bucket: int, timer_values: TimerValues, fired: int | None) -> _SlotState:
        """The bucket's state surface, its delta log (``.log``) over its working copy on this executor."""
        import os

        from ember.runner.spark.keyed.delta import DeltaLog, SlotTable, local_state_root

        state = _SlotState(self, timer_values, fired)
        state.log = DeltaLog(self.parts, _MetaVersion(state),
                             SlotTable(os.path.join(local_state_root(), self.directory, str(bucket))), bucket, ["slot"])
        return state

    def _run(self, key: Any, frames: Iterator[pd.DataFrame], timer_values: TimerValues, fired: int | None) -> Iterator[pd.DataFrame]:
        bucket = int(key[0])
        state = self._state(bucket, timer_values, fired)
        log = state.log
        try:
            log.open()
            yield from self._outputs(bucket, frames, state)
            if not state.timers_kept:  # rebuilt, and the call changed nothing: kept for the next call
                state.keep_timers()
            state.finish()
        finally:
            log.close()
        _count(log, self.counters)

    def _seed(self, key: Any, blob: dict[str, Any], timer_values: TimerValues, event_time: bool) -> None:
        """The bucket's handed-in state (handleInitialState) written into its log and working
        copy, as a call that set every key's slot would."""
        from ember.runner.spark.keyed.delta import OVERFLOW

        state = self._state(int(key[0]), timer_values, None)
        log = state.log
        try:
            log.open()
            target = state.load_blob()
            slots = blob["keys"]
            target["keys"].prefetch(list(slots))
            for k, slot in slots.items():
                target["keys"][k] = slot
            for name, value in blob.items():  # the timer queues and their sequence, broadcast state, TTL sweep
                if name not in ("keys", VERSION, OVERFLOW):
                    target[name] = value
            state.store_blob(target)
            _seed_timeout(state, target, event_time)
            state.finish()
        finally:
            log.close()
        _count(log, self.counters)
