"""When a running job stops: one small object per stop condition.

The run loop (execution.py) polls the query, then asks each condition in turn
whether the job should stop; the first that gives a reason ends the run. Time
comes from the injected clock, so a test drives a condition with a
``ManualClock`` and a scripted progress follower, no Spark needed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ember.runner.spark.checkpoint import last_batch, offset_log_entry
from ember.runner.spark.progress import ProgressFollower, all_done

__all__ = [
    "RunView",
    "StopCondition",
    "Duration",
    "MaxEvents",
    "Idle",
    "StopRequested",
    "EndOfInput",
    "SAVEPOINT_STOP",
    "MIN_BATCHES_GRACE_S",
]

SAVEPOINT_STOP = "stopped for a savepoint"
# How much longer than its duration a run may take to reach its ``min_batches``.
MIN_BATCHES_GRACE_S = 60.0


@dataclass
class RunView:
    """What the conditions see at one poll of the running query."""

    now: float  # the clock's monotonic seconds
    started: float
    follower: ProgressFollower
    query: Any  # Spark's StreamingQuery: ``status`` is read only when a condition needs it
    new_batch: bool  # this poll recorded a new progress report

    def data_available(self) -> bool:
        return bool(self.query.status["isDataAvailable"])


class StopCondition:
    """Say why the job should stop now (a short reason shown to the user), or None."""

    def check(self, run: RunView) -> str | None:
        raise NotImplementedError


class Duration(StopCondition):
    """``duration_s`` has passed — and, with ``min_batches``, that many batches took
    input (waiting at most :data:`MIN_BATCHES_GRACE_S` longer for them)."""

    def __init__(self, duration_s: float, min_batches: int = 0) -> None:
        self.duration_s, self.min_batches = duration_s, min_batches

    def check(self, run: RunView) -> str | None:
        ran = run.now - run.started
        if ran < self.duration_s:
            return None
        fed = sum(1 for report in run.follower.progress if report["numInputRows"])
        if fed >= self.min_batches or ran >= self.duration_s + MIN_BATCHES_GRACE_S:
            return f"duration {self.duration_s:g} s reached"
        return None


class MaxEvents(StopCondition):
    """At least ``max_events`` input events were processed."""

    def __init__(self, max_events: int) -> None:
        self.max_events = max_events

    def check(self, run: RunView) -> str | None:
        return f"{self.max_events:,} events processed" if run.follower.events >= self.max_events else None


class Idle(StopCondition):
    """No batch took input for ``idle_s`` and no source has data waiting (drain, then stop)."""

    def __init__(self, idle_s: float, now: float) -> None:
        self.idle_s, self.input_since = idle_s, now

    def check(self, run: RunView) -> str | None:
        if run.new_batch and run.follower.progress[-1]["numInputRows"] > 0:
            self.input_since = run.now
        if run.follower.progress and run.now - self.input_since >= self.idle_s and not run.data_available():
            return f"no input for {self.idle_s:g} s"
        return None


class StopRequested(StopCondition):
    """``ember savepoint create --stop`` asked the job to stop at a clean cut."""

    def __init__(self, request_file: str) -> None:
        self.request_file = request_file

    def check(self, run: RunView) -> str | None:
        return SAVEPOINT_STOP if os.path.exists(self.request_file) else None


class EndOfInput(StopCondition):
    """Every source is bounded and has ended: stop — after the final watermark flushed
    the open windows when the job has any (``marker`` lets the end-of-input row pass) —
    or when the sources have been idle for ``idle_limit_s`` with nothing waiting."""

    def __init__(self, sources: int, marker: str, needs_flush: bool, idle_limit_s: float, now: float,
                 replayed: int | None = None, checkpoint: str | None = None) -> None:
        self.sources, self.marker, self.needs_flush = sources, marker, needs_flush
        self.idle_limit_s, self.report_since = idle_limit_s, now
        self.flushing = False  # end of input marked; waiting for the batch after the end-of-input row
        # A batch planned by an earlier run and replayed now carries that run's offsets: its
        # "done" may predate input added since (a restarted job must read that first).
        self.replayed = replayed
        self.checkpoint = checkpoint  # where Spark logs each batch's offsets as it plans it

    def check(self, run: RunView) -> str | None:
        follower = run.follower
        if run.new_batch:
            self.report_since = run.now
        fresh = self.replayed is None or follower.last_batch > self.replayed
        if follower.ended_earlier and fresh and follower.sources_done(self.sources):
            # Input added after the job ended once has nothing to flush: the watermark has been
            # at the end of time since, so what a batch makes due fires in that batch; waiting
            # for an end-of-input row that does not come again would stop the job one batch
            # early (the row's batch would be taken for the first of this run).
            return "sources ended"
        if not self.flushing and self.needs_flush and self._planned_to_the_end():
            open(self.marker, "a").close()
            self.flushing = True
        elif not self.flushing and fresh and follower.sources_done(self.sources):
            if not self.needs_flush:
                return "sources ended"
            open(self.marker, "a").close()
            self.flushing = True
        elif self.flushing and follower.end_of_input_seen_before(follower.last_batch):
            return "sources ended, windows flushed"
        if run.now - self.report_since > self.idle_limit_s:
            status = run.query.status
            # Only a query that is waiting for input is idle: one still initialising its sources
            # (a loaded machine can take longer than the limit before its first batch) is not.
            waiting = str(status.get("message", "")).startswith("Waiting for")
            if waiting and not status["isDataAvailable"] and not status["isTriggerActive"]:
                return "sources idle"
        return None

    def _planned_to_the_end(self) -> bool:
        """Whether the batch Spark planned last (its offset-log entry, written as it starts)
        reads every source to its end. Then the marker goes down while that batch runs and
        the end-of-input row comes with the very next batch: Spark plans that one as soon as
        this one ends — before its progress report reaches the driver, which would otherwise
        mark the end one batch later (~0.4-1 s per bounded event-time job)."""
        if self.checkpoint is None:
            return False
        batch = last_batch(self.checkpoint, "offsets")
        if batch < 0 or (self.replayed is not None and batch <= self.replayed):
            return False
        try:
            _, offsets = offset_log_entry(self.checkpoint, batch)
        except OSError:
            return False
        return all_done(offsets, self.sources)
