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
  reverse — the curve the seeds draw for Flink's buffer timeout;
- with ``targets_ms`` (``--targets``): at unbounded input rate, across latency targets
  (``StreamEnvironment(latency_target=...)``, Ember's buffer timeout, which adapts the
  bound at run time): per target the throughput and the latency achieved, over the
  batches after the knob's first ``TARGET_SETTLE_BATCHES``. At unbounded speed a
  record's latency is its batch's duration (it is generated when its batch starts),
  and the knob keeps batches under ~half the target — the other half is for the wait
  an open-loop record has before its batch starts.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from ember.bench import workloads
from ember.bench.harness import BenchConfig, RunOutcome, bench_session, run_once
from ember.bench.stats import percentiles

__all__ = ["run_sweep", "TRIGGERS_MS", "BATCH_BOUNDS", "TARGETS_MS", "FLINK_BUFFER_TIMEOUT"]

TRIGGERS_MS = (0, 100, 250, 500, 1000, 2000)
BATCH_BOUNDS = (5_000, 20_000, 100_000, 500_000, 2_000_000, 4_000_000)
TARGETS_MS = (100, 250, 500, 1000)
TARGET_SETTLE_BATCHES = 8
# Flink's published buffer-timeout curve (WORKLOADS.md E3): timeout ms -> (events/s per core, p99 ms)
FLINK_BUFFER_TIMEOUT = {0: (24_500, 20), 50: (750_000, 50)}


def run_sweep(
    rate: float = 500_000,
    duration_s: float = 15.0,
    master: str = "local[*]",
    triggers_ms: tuple[int, ...] = TRIGGERS_MS,
    batch_bounds: tuple[int, ...] = BATCH_BOUNDS,
    verbose: bool = True,
    warmup_s: float = 8.0,
    baseline: bool = True,
    targets_ms: tuple[int, ...] = (),
    target_cap: int = 4_000_000,
) -> dict[str, Any]:
    """Both sweeps; returns ``{"fixed_rate": [...], "max_rate": [...], ...}``, one
    point per setting with events/s, latency percentiles and ``verified`` (each
    ``max_rate`` point also the hand-written PySpark job's ``baseline_events_per_second``
    and ``baseline_latency_ms`` at the same bound, unless ``baseline`` is False); a
    discarded run of ``warmup_s`` first (the JVM's JIT), none if 0."""
    spark = bench_session(master)
    settings: list[tuple[str, float | None, int, int]] = [("fixed_rate", rate, t, max(batch_bounds)) for t in triggers_ms]
    settings += [("max_rate", None, 0, b) for b in batch_bounds]
    settings += [("latency_targets", None, t, target_cap) for t in targets_ms]  # (the target in the trigger's place)
    if warmup_s > 0:
        if verbose:
            print(f"[ember sweep] warm-up: {warmup_s:g} s, not recorded", file=sys.stderr, flush=True)
        _point(spark, BenchConfig(duration_s=warmup_s, rate=rate, master=master, verbose=False))
    report: dict[str, Any] = {"workload": "grouping", "rate": rate, "duration_s": duration_s,
                              "cores": spark.sparkContext.defaultParallelism, "fixed_rate": [], "max_rate": [],
                              "latency_targets": []}
    for i, (sweep, point_rate, trigger_ms, bound) in enumerate(settings):
        if sweep == "latency_targets":
            started = time.monotonic()
            report[sweep].append(_target_point(spark, trigger_ms, duration_s, bound, master))
            if verbose:
                p = report[sweep][-1]
                lat = p["latency_ms"] or {}
                print(f"[ember sweep] {i + 1}/{len(settings)} latency target {trigger_ms} ms: {p['events_per_second']:,} events/s, "
                      f"p50 {lat.get('p50', 0):,.0f} ms, p99 {lat.get('p99', 0):,.0f} ms, bound ~{p['median_bound']:,}, "
                      f"verified={p['verified']} ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
            continue
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
    rates = [p["events_per_second"] for p in report["max_rate"] if p["events_per_second"]]  # (none: --targets alone)
    report["max_rate_throughput_range"] = round(max(rates) / min(rates), 1) if rates else None

    report["verified"] = all(p["verified"] for s in ("fixed_rate", "max_rate", "latency_targets") for p in report[s])
    if targets_ms:
        report["flink_buffer_timeout"] = [{"timeout_ms": t, "events_per_second_per_core": e, "p99_ms": p}
                                          for t, (e, p) in FLINK_BUFFER_TIMEOUT.items()]
    return report


def _target_point(spark: Any, target_ms: int, duration_s: float, max_bound: int, master: str) -> dict[str, Any]:
    """The grouping job at unbounded rate under ``latency_target=target_ms``: throughput and
    latency over the batches after the knob settled; each batch's bound from the run."""
    import shutil
    import tempfile

    from ember import CountSink, GroupingSource, StreamEnvironment
    from ember.bench.harness import throughput
    from ember.errors import LatencyTargetError

    ckpt = tempfile.mkdtemp(prefix="ember-sweep-target-")
    try:
        env = StreamEnvironment(master=master, checkpoint_dir=ckpt, spark=spark, max_events_per_batch=max_bound,
                                latency_target=target_ms)
        sink = CountSink(latency_field="ts")
        env.from_source(GroupingSource(partitions=spark.sparkContext.defaultParallelism), name="records") \
            .key_by("seq_id").sink_to(sink)
        try:
            result = env.execute("sweep-target", duration_s=duration_s, progress=False, min_batches=TARGET_SETTLE_BATCHES + 5)
        except LatencyTargetError as refused:
            return {"target_ms": target_ms, "events_per_second": 0, "latency_ms": None, "verified": True,
                    "below_floor": str(refused), "median_bound": 0}
        steady = result.progress[TARGET_SETTLE_BATCHES:]
        _, _, eps = throughput(steady)
        first = int(steady[0]["batchId"]) if steady else 0
        bounds = sorted(b["bound"] for b in result.batch_bounds if b["batch"] >= first) or [0]
        return {
            "target_ms": target_ms, "events_per_second": round(eps),
            "latency_ms": percentiles(sink.latencies_after(first - 1)),
            "median_bound": bounds[len(bounds) // 2], "batches": len(steady),
            "verified": sink.count == result.events > 0,
        }
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)


def _point(spark: Any, cfg: BenchConfig) -> RunOutcome:
    return run_once(workloads.grouping, spark, cfg, "ember-sweep")
