"""Stopping a query between micro-batches (execution._stop_gracefully), with a simulated
Spark: a query that plans a batch for ``PLANNING_MS`` (sources asked for offsets), writes its
offset log entry, runs it for ``batch_ms`` and commits it — and a manual clock; no Spark."""

from __future__ import annotations

import os

from ember.runner.spark.execution import _stop_gracefully
from ember.runner.spark.progress import ProgressFollower
from ember.time.clock import ManualClock

PLANNING_MS = 30


class SpinningQuery:
    """A query running batches back to back (Spark's no-data batches for processing-time
    timeouts) — or, ``spins=False``, finishing the batch in flight and then idling."""

    def __init__(self, checkpoint: str, clock: ManualClock, batch_ms: int, spins: bool) -> None:
        self.checkpoint, self.clock, self.batch_ms, self.spins = checkpoint, clock, batch_ms, spins
        self.batch, self.started_ms = 0, clock.now_ms()
        self.stopped_at: int | None = None
        self.stopped_mid_batch = False
        for log in ("offsets", "commits"):
            os.makedirs(os.path.join(checkpoint, log), exist_ok=True)
        self._write("offsets", 0)

    def _write(self, log: str, batch: int) -> None:
        open(os.path.join(self.checkpoint, log, str(batch)), "w").close()

    def _advance(self) -> None:
        while self.batch is not None and self.clock.now_ms() - self.started_ms >= self.batch_ms:
            self._write("commits", self.batch)
            if not self.spins:
                self.batch = None
                return
            self.batch += 1  # planned from here, logged PLANNING_MS later
            self.started_ms += self.batch_ms + PLANNING_MS
            if self.clock.now_ms() < self.started_ms:
                return
        if self.batch is not None and self.clock.now_ms() >= self.started_ms:
            self._write("offsets", self.batch)

    @property
    def isActive(self) -> bool:  # noqa: N802 - Spark's name
        self._advance()
        return self.stopped_at is None

    @property
    def status(self) -> dict:
        self._advance()
        return {"isTriggerActive": self.batch is not None, "isDataAvailable": False}

    def exception(self) -> None:
        return None

    def stop(self) -> None:
        self._advance()
        self.stopped_at = self.clock.now_ms()
        last_offsets = max(int(f) for f in os.listdir(os.path.join(self.checkpoint, "offsets")))
        self.stopped_mid_batch = not os.path.exists(os.path.join(self.checkpoint, "commits", str(last_offsets)))


def _follower(clock: ManualClock, first_batch_ms: int) -> ProgressFollower:
    follower = ProgressFollower(False, "job", clock)
    follower.progress.append({"batchId": 0, "numInputRows": 10, "durationMs": {"triggerExecution": first_batch_ms}})
    return follower


def test_a_query_running_no_data_batches_stops_after_one_of_them_not_after_the_grace(tmp_path):
    clock = ManualClock(1_000_000)
    query = SpinningQuery(str(tmp_path), clock, batch_ms=700, spins=True)
    start = clock.now_ms()
    _stop_gracefully(query, str(tmp_path / "stop"), _follower(clock, 18_000), clock, str(tmp_path))
    # the batch in flight (700 ms) and one no-data batch after it commit; it stops between two.
    # Before: it waited for an idle query that never came, for the whole grace (30 s here).
    assert query.stopped_at is not None and query.stopped_at - start <= 3 * (700 + PLANNING_MS)
    assert not query.stopped_mid_batch
    assert os.path.exists(tmp_path / "stop")


def test_a_query_that_goes_idle_stops_once_idle(tmp_path):
    clock = ManualClock(1_000_000)
    query = SpinningQuery(str(tmp_path), clock, batch_ms=700, spins=False)
    start = clock.now_ms()
    _stop_gracefully(query, str(tmp_path / "stop"), _follower(clock, 700), clock, str(tmp_path))
    assert not query.stopped_mid_batch
    assert 700 <= query.stopped_at - start <= 800
