"""Every ``ember bench`` workload, at a tiny size, against its plain-PySpark baseline:
both must process events and verify their results, so no benchmark rots unnoticed."""

import json

import pytest

from ember.bench import workloads  # noqa: F401 - fills WORKLOADS
from ember.bench.harness import WORKLOADS, BenchConfig, run_benchmark

pytestmark = pytest.mark.spark

# Small batches, except where a verifiable result needs more events per run
# (count windows of 1,000 views for each of 100 campaigns).
PER_BATCH = {"countwindow": 400_000}
OPTIONS = {"grouping-keyed": {"keys": 5_000}}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_benchmark_runs_and_verifies_at_a_tiny_size(spark, name):
    cfg = BenchConfig(
        duration_s=3, rounds=1, warmup_s=0, verbose=False, master="local[2]",
        max_events_per_batch=PER_BATCH.get(name, 40_000), options=OPTIONS.get(name, {}),
    )
    report = run_benchmark(name, cfg, f"smoke {name}")
    for key in ("workload", "events", "seconds", "events_per_second", "cores", "verified", "peak_rss_mb", "checkpoint_mb"):
        assert key in report, key
    assert report["events"] > 0 and report["events_per_second"] > 0 and report["cores"] == 2
    assert report["verified"] is True, report
    assert report["peak_rss_mb"] > 0
    if WORKLOADS[name][1] is not None:
        assert report["baseline_events_per_second"] > 0 and report["ratio_to_baseline"] > 0, report
        assert report.get("baseline_verified") in (True, None), report
    if name == "grouping":
        assert set(report["latency_ms"]) == {"p50", "p90", "p95", "p99"}
    if name.startswith("statemachine"):
        assert report["alerts"] == report["injected"]
    if name.endswith("window") or name == "yahoo":
        assert report["windows"] > 0
    json.dumps(report)  # the --json output is serialisable


def test_knob_sweep_measures_every_setting_and_bigger_batches_raise_throughput(spark):
    from ember.bench.sweep import run_sweep

    report = run_sweep(rate=50_000, duration_s=3, master="local[2]", triggers_ms=(0, 500),
                       batch_bounds=(5_000, 400_000), verbose=False)
    assert [p["trigger_interval_ms"] for p in report["fixed_rate"]] == [0, 500]
    assert [p["max_events_per_batch"] for p in report["max_rate"]] == [5_000, 400_000]
    assert report["verified"] is True
    assert all(p["latency_ms"] and p["latency_ms"]["p50"] > 0 for p in report["fixed_rate"])
    small, large = report["max_rate"]
    assert large["events_per_second"] > 3 * small["events_per_second"]
