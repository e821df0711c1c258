"""The benchmark workloads: each an Ember pipeline, its verification and its baseline."""

from __future__ import annotations

import time
from typing import Any

from pyspark.sql import functions as F

from ember.api.environment import StreamEnvironment
from ember.bench import baselines
from ember.bench.harness import BenchConfig, RunOutcome, throughput, workload
from ember.connectors.generators import GrepSource, GroupingSource
from ember.connectors.sinks import CountSink

GREP_PATTERN = r"[A-Z]{3}\."  # WORKLOADS.md E1: a full-string match that matches nothing


def _env(spark: Any, cfg: BenchConfig, ckpt: str) -> StreamEnvironment:
    return StreamEnvironment(
        master=cfg.master, checkpoint_dir=ckpt, spark=spark, max_events_per_batch=cfg.max_events_per_batch
    )


def _grep_source(spark: Any, cfg: BenchConfig) -> GrepSource:
    return GrepSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism)


def _pattern(cfg: BenchConfig) -> str:
    return cfg.options.get("pattern") or GREP_PATTERN


def _grep_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    src = _grep_source(spark, cfg)
    reports, _ = baselines.grep_baseline(
        spark, src.all_sentences(), src.partitions, cfg.max_events_per_batch, f"^{_pattern(cfg)}$", cfg.duration_s
    )
    events, seconds, eps = throughput(reports)
    return RunOutcome(events, seconds, eps)


@workload("grep", baseline=_grep_baseline)
def grep(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E1: sentences -> full-string regex match -> count matches."""
    env = _env(spark, cfg, ckpt)
    src = _grep_source(spark, cfg)
    sink = CountSink()
    pattern = _pattern(cfg)
    env.from_source(src, name="sentences").filter(F.col("sentence").rlike(f"^{pattern}$"), name="grep").sink_to(sink)
    started = time.monotonic()
    result = env.execute("bench-grep", duration=cfg.duration_s, progress=cfg.verbose)
    wall = time.monotonic() - started
    events, seconds, eps = throughput(result.progress, cfg.rate, wall)
    expected = src.expected_matches(pattern, 0, result.events)
    return RunOutcome(
        events, seconds, eps, verified=sink.count == expected,
        detail={"matches": sink.count, "expected_matches": expected, "pattern": pattern},
    )


def _grouping_baseline(spark: Any, cfg: BenchConfig) -> RunOutcome:
    src = GroupingSource()
    reports, lat = baselines.grouping_baseline(
        spark, spark.sparkContext.defaultParallelism, cfg.max_events_per_batch, src.hosts, src.sample_every, cfg.duration_s
    )
    events, seconds, eps = throughput(reports)
    return RunOutcome(events, seconds, eps, latencies_ms=lat)


@workload("grouping", baseline=_grouping_baseline)
def grouping(spark: Any, cfg: BenchConfig, ckpt: str) -> RunOutcome:
    """E2: records -> key_by(seq_id) (a hash shuffle) -> counting sink with sampled latency."""
    env = _env(spark, cfg, ckpt)
    src = GroupingSource(rate=cfg.rate, partitions=spark.sparkContext.defaultParallelism)
    sink = CountSink(latency_field="ts")
    env.from_source(src, name="records").key_by("seq_id").sink_to(sink)
    started = time.monotonic()
    result = env.execute("bench-grouping", duration=cfg.duration_s, progress=cfg.verbose)
    wall = time.monotonic() - started
    events, seconds, eps = throughput(result.progress, cfg.rate, wall)
    return RunOutcome(
        events, seconds, eps, verified=sink.count == result.events, latencies_ms=sink.latencies_ms,
        detail={"sink_count": sink.count, "source_events": result.events},
    )
