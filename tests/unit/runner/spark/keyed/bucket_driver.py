"""Drives a keyed step's bucket function without Spark: one bucket, scripted
micro-batches, a controllable watermark and processing time. Spark's side of
the contract (state blob, timeouts) is played by :class:`FakeGroupState` — or, with
``LAYOUT = ("delta", directory)`` (the ``state_layout`` fixture of conftest.py), by
:class:`FakeDeltaGroupState`: the keys' slots in a delta log and a working copy on disk
(keyed/delta.py), so the same tests check both state layouts."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ember.functions import AggregateFunction
from ember.runner.spark.keyed import delta
from ember.runner.spark.keyed.bucket import BucketFunction
from ember.runner.spark.keyed.runtime import TAG, side_column
from ember.runner.spark.keyed.tws import SlotBlob


class FakeGroupState:
    def __init__(self, blob: bytes | None, watermark: int | None, now: int) -> None:
        self._blob, self._wm, self._now = blob, watermark, now
        self.timeout_at: int | None = None
        self.updates = 0

    @property
    def exists(self) -> bool:
        return self._blob is not None

    @property
    def get(self) -> tuple[bytes]:
        return (self._blob,)

    def update(self, value: tuple[bytes]) -> None:
        self._blob = value[0]
        self.updates += 1

    def getCurrentWatermarkMs(self) -> int:  # noqa: N802 - Spark's name
        return self._wm if self._wm is not None else 0

    def getCurrentProcessingTimeMs(self) -> int:  # noqa: N802
        return self._now

    def setTimeoutTimestamp(self, ts: int) -> None:  # noqa: N802
        self.timeout_at = ts

    def setTimeoutDuration(self, ms: int) -> None:  # noqa: N802
        self.timeout_at = self._now + ms


LAYOUT: tuple[str, str] = ("blob", "")  # (state layout, a directory for delta working copies)


class ListState:
    """Spark's ListState as a delta log uses it."""

    def __init__(self) -> None:
        self.items: list[tuple[bytes]] = []
        self.appends: list[int] = []  # bytes of each appendList
        self.puts: list[int] = []

    def get(self):
        return iter(list(self.items))

    def appendList(self, values):  # noqa: N802 - Spark's name
        self.items += values
        self.appends.append(sum(len(v[0]) for v in values))

    def put(self, values):
        self.items = list(values)
        self.puts.append(sum(len(v[0]) for v in values))


class ValueState:
    """Spark's ValueState (also the transformWithState adapter's, test_tws.py)."""

    def __init__(self) -> None:
        self.value = None

    def get(self):
        return self.value

    def update(self, value):
        self.value = value

    def clear(self):
        self.value = None


class FakeDeltaGroupState(FakeGroupState, SlotBlob):
    """FakeGroupState whose keys' slots live in a delta log, with the blob and timer queues
    handled as the transformWithState adapter handles them (keyed/tws.py ``SlotBlob``)."""

    def __init__(self, blob: bytes | None, watermark: int | None, now: int, parts: ListState, version: ValueState,
                 directory: str) -> None:
        super().__init__(blob, watermark, now)
        self.start_slots()
        self.log = delta.DeltaLog(parts, version, delta.SlotTable(directory), 0, ["slot"])
        self.log.open()


class BucketDriver:
    """``batch(rows, watermark=, now=)`` runs one micro-batch; returns (main rows, {tag: rows})."""

    def __init__(self, fn: Any, fields: list[str], out_fields: list[str], *, keys: tuple[str, ...] = ("k",),
                 event_time: bool = True, time_field: str = "ts", side_outputs: dict[str, list[str]] | None = None,
                 counters: dict[str, Any] | None = None, every_batch: bool = False, advance_ms: int | None = None,
                 dead_letter: str | None = None, dtype: Any = None) -> None:
        """``every_batch``: call the bucket in every batch, as Spark does when other keys of
        the bucket have records in each; by default only when Spark would call it. ``dtype``:
        of the frames' columns (``object`` keeps ints beside nulls ints, as Arrow's do)."""
        self.dtype = dtype
        self.fields, self.time_field, self.event_time = fields, time_field, event_time
        self.every_batch = every_batch
        self.side_outputs = side_outputs or {}
        self.out_fields = out_fields
        self.fn = BucketFunction(
            fn, "test", list(keys), fields, out_fields, "__time" if event_time else None, event_time,
            side_outputs=self.side_outputs, counters=counters, advance_ms=advance_ms, dead_letter=dead_letter,
        )
        self.blob: bytes | None = None
        self.timeout_at: int | None = None
        self.updates = 0  # state writes of the last call
        self.layout, self.directory = LAYOUT
        self.parts, self.version = ListState(), ValueState()

    @property
    def state(self) -> tuple:
        """Everything Spark keeps for the bucket (to continue in another driver)."""
        return self.blob, self.parts, self.version, self.directory

    @state.setter
    def state(self, value: tuple | None) -> None:
        if value is None:
            self.blob, self.parts, self.version = None, ListState(), ValueState()
        else:
            self.blob, self.parts, self.version, self.directory = value

    def batch(self, rows: list[tuple], *, watermark: int | None = None, now: int = 0,
              latest: int | None = None) -> tuple[list[dict], dict[str, list[dict]]]:
        """As Spark does: the bucket is called when it has records, or when its clock (Spark's
        watermark with event time, else the batch time) is past the timeout it asked for.

        ``watermark`` is Ember's (Flink's) watermark, the one the operator's rules read; Spark
        hands the bucket its own, one ms ahead (``watermark + 1``; 0 for None: no watermark yet).
        ``latest``: the batch's latest event time as the packing step tells every bucket (a
        bucket is then called even without records, as Spark does for its packed rows)."""
        spark_watermark = 0 if watermark is None else watermark + 1
        clock = spark_watermark if self.event_time else now
        due = self.timeout_at is not None and clock > self.timeout_at
        if not rows and not due and not self.every_batch and latest is None:
            return [], {t: [] for t in self.side_outputs}
        state = (FakeDeltaGroupState(self.blob, spark_watermark, now, self.parts, self.version, self.directory)
                 if self.layout == "delta" else FakeGroupState(self.blob, spark_watermark, now))
        frames = []
        if rows:
            pdf = pd.DataFrame(rows, columns=self.fields, dtype=self.dtype)
            if self.event_time:
                pdf["__time"] = pd.to_datetime(pdf[self.time_field], unit="ms")
            frames = [pdf]
        self.updates = 0
        out = list(self.fn((0,), iter(frames), state, latest))
        self.blob, self.timeout_at = state._blob, state.timeout_at  # a call without a timeout set clears it
        if isinstance(state, FakeDeltaGroupState):
            if not state.timers_kept:  # (as DeltaSlotProcessor: queues rebuilt by a call that changed nothing)
                state.keep_timers()
            state.log.close()
        self.updates = state.updates
        main: list[dict] = []
        sides: dict[str, list[dict]] = {t: [] for t in self.side_outputs}
        for frame in out:
            for rec in frame.to_dict("records"):
                tag = rec.get(TAG)
                if tag is None:
                    main.append({f: rec[f] for f in self.out_fields})
                else:
                    sides[tag].append({f: rec[side_column(tag, f)] for f in self.side_outputs[tag]})
        return main, sides


class SumX(AggregateFunction):
    """A window aggregate the operator tests share: the sum of the records' ``x``."""

    def create_accumulator(self):
        return 0

    def add(self, value, acc):
        return acc + value["x"]

    def merge(self, a, b):
        return a + b

    def get_result(self, acc):
        return acc
