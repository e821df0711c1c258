"""``ember bench``: run a workload with Ember, then the plain-PySpark baseline, alternately.

Throughput of a run is its input events divided by the processing time of its
micro-batches (Spark's ``triggerExecution``), after ``WARMUP_BATCHES``; with a
target rate it is input events per wall-clock second. Rounds alternate Ember
and baseline in one process and one SparkSession; medians are reported, and
the ratio is median(Ember) / median(baseline). Rounds alternate which side
goes first, so a drift during the run favours neither.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

from ember.bench.memory import RssSampler
from ember.runner.spark.checkpoint import disk_bytes

__all__ = ["BenchConfig", "RunOutcome", "WORKLOADS", "bench_session", "run_once", "throughput"]

WARMUP_BATCHES = 2


@dataclass(frozen=True)
class BenchConfig:
    duration_s: float = 20.0
    rate: float | None = None
    rounds: int = 1
    max_events_per_batch: int = 2_000_000
    master: str = "local[*]"
    baseline: bool = True
    verbose: bool = True
    warmup_s: float = 8.0
    options: dict[str, Any] = field(default_factory=dict)
    # A timed run goes on until this many batches took input (windows close a few
    # batches after they open; a slow machine must still leave results to verify).
    min_batches: int = 4


@dataclass
class RunOutcome:
    events: int
    processing_seconds: float
    events_per_second: float
    verified: bool | None = None
    latencies_ms: list[int] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)
    peak_rss_bytes: int = 0  # this process tree (driver, JVM, Python workers) during the run
    peak_anonymous_rss_bytes: int = 0  # the same without pages of mapped files (memory.tree_rss_bytes)
    checkpoint_bytes: int = 0  # the run's checkpoint (offsets, commits, state) on disk at its end
    progress: list[dict[str, Any]] = field(default_factory=list)  # Ember's runs: every batch's report


def throughput(reports: list[dict[str, Any]], rate: float | None = None, wall_s: float | None = None) -> tuple[int, float, float]:
    """``(events, processing seconds, events/s)`` of a run's progress reports."""
    steady = reports[WARMUP_BATCHES:] if len(reports) > WARMUP_BATCHES + 2 else reports
    events = sum(int(r.get("numInputRows") or 0) for r in steady)
    seconds = sum(int(r.get("durationMs", {}).get("triggerExecution", 0)) for r in steady) / 1000
    if rate is not None:
        # Open loop: a batch admits what fell due since the previous batch started, so
        # the input taken in between the first and the last steady batch's start is
        # that of the batches after the first, over the time between those starts.
        span = _starts_span_s(steady)
        if span > 0:
            admitted = sum(int(r.get("numInputRows") or 0) for r in steady[1:])
            return events, seconds, admitted / span
        total = sum(int(r.get("numInputRows") or 0) for r in reports)
        return total, seconds, total / wall_s if wall_s else 0.0
    return events, seconds, events / seconds if seconds > 0 else 0.0


def _starts_span_s(reports: list[dict[str, Any]]) -> float:
    """Seconds from the first batch's start to the last's (0 if unknown)."""
    if len(reports) < 2 or not all("timestamp" in r for r in (reports[0], reports[-1])):
        return 0.0
    first = dt.datetime.fromisoformat(reports[0]["timestamp"].replace("Z", "+00:00"))
    last = dt.datetime.fromisoformat(reports[-1]["timestamp"].replace("Z", "+00:00"))
    return max(0.0, (last - first).total_seconds())


Workload = tuple[Callable[[Any, BenchConfig, str], RunOutcome], Callable[[Any, BenchConfig], RunOutcome] | None]
WORKLOADS: dict[str, Workload] = {}


def workload(name: str, baseline: Callable[[Any, BenchConfig], RunOutcome] | None = None) -> Callable:
    def register(fn: Callable[[Any, BenchConfig, str], RunOutcome]) -> Callable:
        WORKLOADS[name] = (fn, baseline)
        return fn

    return register


def log(cfg: BenchConfig, msg: str) -> None:
    if cfg.verbose:
        print(f"[ember bench] {msg}", file=sys.stderr, flush=True)




def bench_session(master: str) -> Any:
    """The SparkSession benchmarks run on: one shuffle partition per core."""
    from ember.api.environment import StreamEnvironment

    spark = StreamEnvironment(master=master).spark
    spark.conf.set("spark.sql.shuffle.partitions", str(spark.sparkContext.defaultParallelism))
    return spark


def run_once(run: Callable[[Any, BenchConfig, str], RunOutcome], spark: Any, cfg: BenchConfig, prefix: str) -> RunOutcome:
    """One run of an Ember workload in a fresh checkpoint (removed afterwards), with
    the process tree's peak RSS and the checkpoint's size at the end."""
    ckpt = tempfile.mkdtemp(prefix=f"{prefix}-")
    try:
        with RssSampler() as rss:
            out = run(spark, cfg, ckpt)
        out.peak_rss_bytes = rss.peak_any
        out.peak_anonymous_rss_bytes = rss.peak_anonymous
        out.detail["peak_anonymous_rss_mb_by_process"] = {k: round(v / 2**20) for k, v in rss.peak_anonymous_by_kind.items()}
        out.checkpoint_bytes = disk_bytes(ckpt)
        return out
    finally:
        from ember.runner.spark.keyed.delta import drop_local_state

        for job in os.listdir(ckpt) if os.path.isdir(ckpt) else []:
            drop_local_state(os.path.join(ckpt, job))  # state_layout="delta": the working copies on this machine
        shutil.rmtree(ckpt, ignore_errors=True)


