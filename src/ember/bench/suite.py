"""The benchmark suite: every registered workload (workloads.py) run by the
harness (harness.py), Ember and its plain-PySpark baseline alternately."""

from __future__ import annotations

import datetime as dt
import os
import platform
from typing import Any

from ember.bench import workloads  # noqa: F401 - fills WORKLOADS
from ember.bench.harness import WORKLOADS, BenchConfig, RunOutcome, bench_session, log, run_once
from ember.bench.stats import median, percentiles

__all__ = ["run_benchmark", "WORKLOADS"]


def run_benchmark(name: str, cfg: BenchConfig, command: str = "") -> dict[str, Any]:
    """Run workload ``name`` and return the JSON-able report."""
    if name not in WORKLOADS:
        raise SystemExit(f"unknown workload {name!r}; available: {', '.join(sorted(WORKLOADS))}")
    run, base = WORKLOADS[name]
    spark = bench_session(cfg.master)
    ember_runs: list[RunOutcome] = []
    base_runs: list[RunOutcome] = []
    if cfg.warmup_s > 0:
        # The JVM's JIT warms up on whichever pipeline runs first; give it a
        # discarded run of each so neither side pays for it in the figures.
        log(cfg, f"warm-up: {cfg.warmup_s:g} s each, not recorded")
        warm = BenchConfig(**{**cfg.__dict__, "duration_s": cfg.warmup_s, "verbose": False})
        run_once(run, spark, warm, f"ember-bench-{name}")
        if base is not None and cfg.baseline:
            base(spark, warm)

    def ember_round(i: int) -> None:
        log(cfg, f"round {i + 1}/{cfg.rounds}: Ember {name} for {cfg.duration_s:g} s")
        out = run_once(run, spark, cfg, f"ember-bench-{name}")
        log(cfg, f"  Ember: {out.events_per_second:,.0f} events/s, verified={out.verified}")
        ember_runs.append(out)

    def baseline_round(i: int) -> None:
        assert base is not None  # the rounds skip the baseline of a workload without one
        log(cfg, f"round {i + 1}/{cfg.rounds}: plain PySpark {name} for {cfg.duration_s:g} s")
        b = base(spark, cfg)
        log(cfg, f"  PySpark: {b.events_per_second:,.0f} events/s")
        base_runs.append(b)

    for i in range(cfg.rounds):
        # A-B, B-A, A-B...: a drift over the run (JIT, page cache) favours neither side.
        order = [ember_round, baseline_round] if i % 2 == 0 else [baseline_round, ember_round]
        for step in order:
            if step is baseline_round and (base is None or not cfg.baseline):
                continue
            step(i)
    eps = median(r.events_per_second for r in ember_runs)
    report: dict[str, Any] = {
        "workload": name,
        "events": sum(r.events for r in ember_runs),
        "seconds": round(sum(r.processing_seconds for r in ember_runs), 3),
        "events_per_second": round(eps),
        "cores": spark.sparkContext.defaultParallelism,
        "rate": cfg.rate,
        "max_events_per_batch": cfg.max_events_per_batch,
        "rounds": cfg.rounds,
        "round_events_per_second": [round(r.events_per_second) for r in ember_runs],
        "verified": all(r.verified for r in ember_runs) if all(r.verified is not None for r in ember_runs) else None,
    }
    lat = percentiles(x for r in ember_runs for x in r.latencies_ms)
    if lat is not None:
        report["latency_ms"] = lat
    if base_runs:
        beps = median(r.events_per_second for r in base_runs)
        report["baseline_events_per_second"] = round(beps)
        report["baseline_round_events_per_second"] = [round(r.events_per_second) for r in base_runs]
        report["ratio_to_baseline"] = round(eps / beps, 3) if beps else None
        if all(r.verified is not None for r in base_runs):
            report["baseline_verified"] = all(r.verified for r in base_runs)
        for r in base_runs[:1]:
            report.update(r.detail)
        blat = percentiles(x for r in base_runs for x in r.latencies_ms)
        if blat is not None:
            report["baseline_latency_ms"] = blat
    for option in ("state_layout", "max_parallelism"):
        if cfg.options.get(option):
            report[option] = cfg.options[option]
    report["peak_rss_mb"] = round(max(r.peak_rss_bytes for r in ember_runs) / 2**20)
    report["peak_anonymous_rss_mb"] = round(max(r.peak_anonymous_rss_bytes for r in ember_runs) / 2**20)
    report["checkpoint_mb"] = round(max(r.checkpoint_bytes for r in ember_runs) / 2**20, 1)
    for r in ember_runs[:1]:
        report.update(r.detail)
    report["command"] = command
    report["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    report["machine"] = f"{platform.node()} {os.cpu_count()} cpus {platform.machine()} Python {platform.python_version()}"
    return report
