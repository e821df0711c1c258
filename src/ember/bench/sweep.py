"""E3, the latency/throughput knob: the grouping job (E2) across Ember's settings.

Flink trades latency for throughput with its network buffer timeout; Ember's knob
is the micro-batch: ``trigger_interval`` (time between batch starts) and
``max_events_per_batch`` (admission control, the most a source admits into one
batch). Two sweeps of the same job, each point a fresh run, each verified (every
event reaches the sink exactly once):

- at a fixed open-loop input rate, across trigger intervals: the throughput (events
  over the wall time of the steady batches) is the input rate while it is
  sustained; latency (sink time minus the record's scheduled emission time, on
  every 1,000th record of the steady batches) grows with the interval;
- at unbounded input rate, across per-batch bounds: small batches give low latency
  and low throughput (each batch pays Spark's fixed per-batch cost), large ones the
  reverse — the curve the seeds draw for Flink's buffer timeout.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from ember.bench import workloads
from ember.bench.harness import BenchConfig, RunOutcome, bench_session, run_once
from ember.bench.stats import percentiles

__all__ = ["run_sweep", "TRIGGERS_MS", "BATCH_BOUNDS"]

TRIGGERS_MS = (0, 100, 250, 500, 1000, 2000)
BATCH_BOUNDS = (5_000, 20_000, 100_000, 500_000, 2_000_000, 4_000_000)


def run_sweep(
    rate: float = 500_000,
    duration_s: float = 15.0,
    master: str = "local[*]",
    triggers_ms: tuple[int, ...] = TRIGGERS_MS,
    batch_bounds: tuple[int, ...] = BATCH_BOUNDS,
    verbose: bool = True,
    warmup_s: float = 8.0,
    baseline: bool = True,
) -> dict[str, Any]:
    """Both sweeps; returns ``{"fixed_rate": [...], "max_rate": [...], ...}``, one
    point per setting with events/s, latency percentiles and ``verified`` (each
    ``max_rate`` point also the hand-written PySpark job's ``baseline_events_per_second``
    and ``baseline_latency_ms`` at the same bound, unless ``baseline`` is False); a
    discarded run of ``warmup_s`` first (the JVM's JIT), none if 0."""
    spark = bench_session(master)
    settings: list[tuple[str, float | None, int, int]] = [("fixed_rate", rate, t, max(batch_bounds)) for t in triggers_ms]
    settings += [("max_rate", None, 0, b) for b in batch_bounds]
    if warmup_s > 0:
        if verbose:
            print(f"[ember sweep] warm-up: {warmup_s:g} s, not recorded", file=sys.stderr, flush=True)
        _point(spark, BenchConfig(duration_s=warmup_s, rate=rate, master=master, verbose=False))
    report: dict[str, Any] = {"workload": "grouping", "rate": rate, "duration_s": duration_s,
                              "cores": spark.sparkContext.defaultParallelism, "fixed_rate": [], "max_rate": []}
    for i, (sweep, point_rate, trigger_ms, bound) in enumerate(settings):
        cfg = BenchConfig(duration_s=duration_s, rate=point_rate, max_events_per_batch=bound, master=master,
                          verbose=False, options={"trigger_interval_ms": trigger_ms})
        started = time.monotonic()
        out = _point(spark, cfg)
        point: dict[str, Any] = {
            "trigger_interval_ms": trigger_ms, "max_events_per_batch": bound,
            "events_per_second": round(out.events_per_second), "latency_ms": percentiles(out.latencies_ms),
            "verified": out.verified,
        }
        if sweep == "max_rate" and baseline:  # the same job hand-written in PySpark, same bound, same session
            base = workloads.grouping_baseline(spark, cfg)
            point["baseline_events_per_second"] = round(base.events_per_second)
            point["baseline_latency_ms"] = percentiles(base.latencies_ms)
        report[sweep].append(point)
        if verbose:
            lat = point["latency_ms"] or {}
            print(
                f"[ember sweep] {i + 1}/{len(settings)} {sweep}: trigger {trigger_ms} ms, <= {bound:,} events/batch: "
                f"{point['events_per_second']:,} events/s, p50 {lat.get('p50', 0):,.0f} ms, p99 {lat.get('p99', 0):,.0f} ms, "
                f"verified={out.verified} ({time.monotonic() - started:.0f} s)",
                file=sys.stderr, flush=True,
            )
    rates = [p["events_per_second"] for p in report["max_rate"] if p["events_per_second"]]
    report["max_rate_throughput_range"] = round(max(rates) / min(rates), 1) if rates else None
    report["verified"] = all(p["verified"] for s in ("fixed_rate", "max_rate") for p in report[s])
    return report


def _point(spark: Any, cfg: BenchConfig) -> RunOutcome:
    return run_once(workloads.grouping, spark, cfg, "ember-sweep")
