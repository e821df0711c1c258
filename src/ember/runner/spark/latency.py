"""The latency-target knob (issue 19, item 4): Ember's buffer timeout.

Flink trades latency for throughput with its network buffer timeout; in a micro-batch
engine the lever is the batch's size. A record waits at most one batch before its own
starts (the batches run back to back) and is done when its batch commits, so its latency
is at most about two batch durations. With ``StreamEnvironment(latency_target=...)`` the
driver keeps the batches' duration under half the target: after every micro-batch that
took input it scales the per-batch bound by the ratio of that goal to the recent batch
durations (the median of the last three; at most halving or doubling per batch; raised only
while the bound is what limits a batch), between :data:`MIN_BOUND` and the job's
``max_events_per_batch``. A run's first batch is not taken into account: it also starts
Spark's Python workers and loads state.
Ember's sources read the bound from a file in the checkpoint when they plan the next batch
(``checkpoint.admission_bound``).

A target below what the job can do fails clearly: once the bound is at its floor and the
batches still take longer than the goal for :data:`FLOOR_BATCHES` batches in a row, the
job stops and ``execute`` raises :class:`~ember.errors.LatencyTargetError` with the
batch time it measured.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from ember.runner.spark.stopping import RunView, StopCondition

__all__ = ["BoundController", "MIN_BOUND", "FLOOR_BATCHES", "BELOW_FLOOR", "GOAL_SHARE"]

MIN_BOUND = 1_000  # events per batch: below this a batch's fixed cost is all there is
FLOOR_BATCHES = 6
GOAL_SHARE = 0.45  # of the target, per batch: a record waits up to one batch, then its own runs
BELOW_FLOOR = "latency target below the job's floor"


class BoundController(StopCondition):
    """Adapts the per-batch bound after each batch (see the module's docstring); a stop
    condition only when the target cannot be kept."""

    def __init__(self, target_ms: int, max_bound: int, path: str, start_bound: int | None = None) -> None:
        self.target_ms, self.max_bound, self.path = target_ms, max_bound, path
        self.goal_ms = GOAL_SHARE * target_ms
        self.bound = max(MIN_BOUND, min(max_bound, start_bound or 20_000))
        self.previous = self.bound  # the bound before the last change
        self.recent: list[float] = []  # the last batches' ms
        self.seen = 0  # progress reports looked at
        self.at_floor: list[float] = []  # batch ms while the bound sat at its floor, over the goal
        self.history: list[dict[str, Any]] = []  # per batch: the bound when its report came, its events and ms
        self.write()

    def write(self) -> None:
        tmp = f"{self.path}.tmp"
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(tmp, "w") as f:
            f.write(str(self.bound))
        os.replace(tmp, self.path)

    def observe(self, report: dict[str, Any]) -> None:
        """One batch's progress report."""
        events = int(report.get("numInputRows") or 0)
        ms = float(report.get("durationMs", {}).get("triggerExecution", 0))
        if events <= 0 or ms <= 0:
            return
        ran_with = self.bound
        self.history.append({"batch": int(report.get("batchId", -1)), "bound": ran_with, "events": events, "ms": ms})
        if len(self.history) == 1:
            return  # the run's first batch: start-up costs, not the bound's
        self.recent = (self.recent + [ms])[-3:]
        ratio = self.goal_ms / statistics.median(self.recent)
        # Spark plans the next batch as soon as one ends, before the driver sees this one's
        # report: a batch ran under the bound in force or the one before it.
        limit = min(self.bound, self.previous)
        new = self.bound
        if ratio < 1.0:
            new = max(MIN_BOUND, int(self.bound * max(0.5, ratio)))
        elif ratio > 1.15 and events >= 0.9 * limit:  # the bound limited this batch: let more in
            new = min(self.max_bound, int(self.bound * min(2.0, ratio)))
        if new != self.bound:
            self.previous, self.bound = self.bound, new
        if limit == MIN_BOUND and ms > self.goal_ms:
            self.at_floor.append(ms)
        else:
            self.at_floor.clear()
        if self.bound != ran_with:
            self.write()

    def check(self, run: RunView) -> str | None:
        progress = run.follower.progress
        while self.seen < len(progress):
            self.observe(progress[self.seen])
            self.seen += 1
        return BELOW_FLOOR if len(self.at_floor) >= FLOOR_BATCHES else None

    def floor_message(self) -> str:
        floor = statistics.median(self.at_floor) if self.at_floor else 0.0
        return (
            f"latency target {self.target_ms} ms is below this job's floor: with {MIN_BOUND:,} events per batch its "
            f"batches took {floor:,.0f} ms (median of the last {len(self.at_floor)}), and a record waits up to one "
            f"batch before its own runs — the lowest target it can keep here is about {floor / GOAL_SHARE:,.0f} ms"
        )
