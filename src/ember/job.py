"""What a job is configured with and what it reports: plain data, no Spark.

:class:`EnvironmentConfig` is the validated form of ``StreamEnvironment``'s
arguments that the runner compiles and runs a pipeline with; :class:`JobResult`
is what ``execute`` returns. Both live below the user API and the runner so
that either can use them without importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["EnvironmentConfig", "JobResult", "RunListener", "spark_time_ms", "DASHBOARD_PORT", "DEFAULT_MAX_PARALLELISM",
           "MAX_STATE_BUCKETS", "default_max_parallelism"]

DASHBOARD_PORT = 8081  # a watched job's dashboard (ember.ui), as Flink's web UI
DEFAULT_MAX_PARALLELISM = 128  # state buckets a job's keys are spread over unless it says (Flink's default floor)
MAX_STATE_BUCKETS = 32_768  # as Flink's upper bound on max parallelism


def default_max_parallelism(parallelism: int) -> int:
    """The state buckets of a new job that does not give ``max_parallelism``, by Flink's rule:
    1.5x its parallelism rounded up to a power of two, at least 128 and at most 32,768 — room
    to rescale to half as many partitions again."""
    wanted = parallelism + parallelism // 2
    return min(max(1 << max(wanted - 1, 0).bit_length(), DEFAULT_MAX_PARALLELISM), MAX_STATE_BUCKETS)


def spark_time_ms(stamp: Any) -> int | None:
    """A time in Spark's progress reports ("2026-11-25T00:09:38.397Z") as epoch ms; None if it is not one."""
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


@dataclass(frozen=True)
class EnvironmentConfig:
    """Validated environment settings (see :class:`ember.StreamEnvironment`)."""

    master: str = "local[*]"
    checkpoint_dir: str = "ember-checkpoints"
    parallelism: int | None = None
    trigger_interval_ms: int = 0
    max_events_per_batch: int = 2_000_000
    state_backend: str = "rocksdb"
    changelog_checkpointing: bool = True
    spark_conf: tuple[tuple[str, str], ...] = field(default=())
    combine_windows: bool = True
    fuse_sources: bool = True
    keyed_operator: str = "auto"  # Spark's operator under keyed steps: auto, or always transformWithState
    state_layout: str = "blob"  # keyed state per bucket: one blob (design A) or a delta log (design B, keyed/delta.py)
    latency_target_ms: int | None = None  # adapt the per-batch bound at run time to keep latency under this (latency.py)
    max_parallelism: int = DEFAULT_MAX_PARALLELISM  # state buckets (Flink's key groups): the most state partitions; fixed by a job's first run
    max_parallelism_given: bool = False  # else a run takes its checkpoint's count, or default_max_parallelism(partitions)


@dataclass
class JobResult:
    """What a finished ``execute`` reports."""

    name: str
    checkpoint_dir: str
    batches: int
    events: int
    seconds: float
    processing_seconds: float
    progress: list[dict[str, Any]]
    stopped_because: str
    late_dropped: int = 0  # late records every window dropped (Flink's rule; records, not aggregated rows; reported, never silent)
    start_ms: dict[str, int] = field(default_factory=dict)  # each source's event-time origin
    counters: dict[str, int] = field(default_factory=dict)  # Ember's job-wide counters (late records, state written, ...)
    # batches committed as the query stopped, before Spark reported them: in ``events`` (where
    # their sources' offsets say how many) and in the sinks, not in ``progress``
    unreported_batches: list[int] = field(default_factory=list)
    # with a latency target: per batch the bound in force when its report came, its events and ms
    # (runner/spark/latency.py; Spark plans a batch before the driver sees the previous report, so
    # a batch ran under this bound or the one before it)
    batch_bounds: list[dict[str, Any]] = field(default_factory=list)

    @property
    def final_watermark_ms(self) -> int | None:
        """The last watermark Spark reported, as epoch ms (None without event time)."""
        for report in reversed(self.progress):
            wm = report.get("eventTime", {}).get("watermark")
            if wm:
                return spark_time_ms(wm)
        return None

    @property
    def events_per_second(self) -> float:
        """Input events per second of wall time, start to stop."""
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        return (
            f"job '{self.name}': {self.events:,} events in {self.batches} batches, "
            f"{self.seconds:.1f} s ({self.events_per_second:,.0f} events/s); stopped: {self.stopped_because}"
            + (f"; {self.late_dropped:,} late records dropped" if self.late_dropped else "")
        )


class RunListener:
    """What a running job tells an observer (the dashboard, ember.ui): override what you
    need. Called on the driver's thread that follows the query; keep each call short."""

    def job_started(self, info: dict[str, Any]) -> None:
        """The query started: ``info`` has ``job``, ``checkpoint``, ``max_events_per_batch``,
        ``trigger_interval_ms``, ``spark_ui`` (Spark's UI address or None) and ``stateful_steps``."""

    def batch_reported(self, report: dict[str, Any]) -> None:
        """One micro-batch's progress report (Spark's, with Ember's event count and lag)."""

    def branch_counts(self, batch_id: int, rows: dict[str, int]) -> None:
        """Rows each step after the job's split (written per micro-batch) emitted in one batch."""

    def job_ended(self, stopped_because: str, error: str | None) -> None:
        """The query stopped; ``error`` is the failure's message, naming the step where known."""
