"""Every ``ember bench`` workload, at a tiny size, against its plain-PySpark baseline:
both must process events and verify their results, so no benchmark rots unnoticed."""

import json

import pytest

from ember.bench import workloads  # noqa: F401 - fills WORKLOADS
from ember.bench.harness import BenchConfig
from ember.bench.suite import WORKLOADS, run_benchmark

pytestmark = pytest.mark.spark

# Small batches, except where a verifiable result needs more events per run
# (count windows of 1,000 views for each of 100 campaigns), and smaller ones where
# the baseline (transformWithStateInPandas, ~20 k events/s here) must finish a
# batch within the 3 s run, or it reports no events.
PER_BATCH = {"countwindow": 400_000, "statemachine": 10_000, "statemachine-vectorized": 10_000}
OPTIONS = {"grouping-keyed": {"keys": 5_000}, "yahoo-redis": {"window_ms": 1_000},
           # (a per-record process function with a timer per key, on the delta layout: issue 18's timer queues)
           "grouping-keyed:process": {"keys": 5_000, "step": "process", "state_layout": "delta"},
           "yahoo-json": {"to_json_baseline": False}}  # the same-texts baseline is enough to keep it from rotting
# Each side runs at least its duration and until enough batches ended to measure and verify
# (BenchConfig.min_batches, the baselines' min_batches), however slow the machine: 2 on Ember's side
# where every record's result is checked as it comes (no window must close first), else 4.
PER_RECORD = {"grep", "grouping", "grouping-keyed", "rolling", "statemachine", "statemachine-vectorized", "connect"}
# yahoo-redis runs open loop (here 20 k events/s) with event time = generation time: its 1 s
# windows must close (the watermark trails by 1 s) after a first batch that starts the job.
DURATION = {"yahoo-redis": 10}
RATE = {"yahoo-redis": 20_000}


# pipeline-unchained is pipeline's job re-keyed between its steps, which test_chains.py runs at small sizes
@pytest.mark.parametrize("variant", [pytest.param(w, marks=pytest.mark.slow) if w == "pipeline-unchained" else w
                                     for w in sorted(WORKLOADS)] + ["grouping-keyed:process"])
def test_benchmark_runs_and_verifies_at_a_tiny_size(spark, variant):
    name = variant.partition(":")[0]
    cfg = BenchConfig(
        duration_s=DURATION.get(name, 1.5), rounds=1, warmup_s=0, verbose=False, master="local[2]",
        min_batches=2 if name in PER_RECORD else 4, max_events_per_batch=PER_BATCH.get(name, 40_000),
        options=OPTIONS.get(variant, {}), rate=RATE.get(name),
    )
    report = run_benchmark(name, cfg, f"smoke {name}")
    for key in ("workload", "events", "seconds", "events_per_second", "cores", "verified", "peak_rss_mb", "checkpoint_mb"):
        assert key in report, key
    assert report["events"] > 0 and report["events_per_second"] > 0 and report["cores"] == 2
    scalars = {k: v for k, v in report.items() if not isinstance(v, (list, dict))}
    assert report["verified"] is True, json.dumps(scalars, default=str)  # (as text: pytest cuts a long dict's repr)
    assert report["peak_rss_mb"] > 0
    if WORKLOADS[name][1] is not None:
        assert report["baseline_events_per_second"] > 0 and report["ratio_to_baseline"] > 0, report
        assert report.get("baseline_verified") in (True, None), report
    if name == "grouping":
        assert set(report["latency_ms"]) == {"p50", "p90", "p95", "p99"}
    if name.startswith("statemachine"):
        assert report["alerts"] == report["injected"]
    if name == "connect":
        assert report["alerts"] == report["expected_alerts"] and report["unruled"] == 0, report
    if name == "interval-join":
        assert report["pairs"] == report["expected_pairs"] > 0
    if name.endswith("window") or name.startswith("yahoo") or name == "pipeline":
        assert report["windows"] > 0
    json.dumps(report)  # the --json output is serialisable


def test_knob_sweep_measures_every_setting_and_bigger_batches_raise_throughput(spark):
    from ember.bench.sweep import run_sweep

    report = run_sweep(rate=50_000, duration_s=3, master="local[2]", triggers_ms=(0, 500),
                       batch_bounds=(5_000, 400_000), verbose=False, warmup_s=0)
    assert [p["trigger_interval_ms"] for p in report["fixed_rate"]] == [0, 500]
    assert [p["max_events_per_batch"] for p in report["max_rate"]] == [5_000, 400_000]
    assert report["verified"] is True
    assert all(p["latency_ms"] and p["latency_ms"]["p50"] > 0 for p in report["fixed_rate"])
    small, large = report["max_rate"]
    assert large["events_per_second"] > 3 * small["events_per_second"]
    for point in report["max_rate"]:  # the hand-written PySpark job at the same bound, same run
        assert point["baseline_events_per_second"] > 0 and point["baseline_latency_ms"]["p50"] > 0, point


def test_generator_lag_is_reported_and_decides_whether_a_rate_is_sustained(spark, tmp_path):
    from ember.bench.sustainable import sustained

    def grouping_at(rate, per_batch):
        cfg = BenchConfig(duration_s=4, rate=rate, max_events_per_batch=per_batch, master="local[2]", verbose=False)
        return WORKLOADS["grouping"][0](spark, cfg, str(tmp_path / f"{rate}-{per_batch}"))

    easy = grouping_at(20_000, 1_000_000)
    lags = [r["lag"] for r in easy.progress if r["numInputRows"]]
    assert lags and all(0 <= lag <= 20_000 for lag in lags)
    assert sustained(easy, 20_000, 2.0)[0] and easy.verified
    # Admission control caps each batch at 2,000 events: the job cannot keep up with
    # 50,000 events/s, so the backlog grows and the rate is not sustained.
    capped = grouping_at(50_000, 2_000)
    ok, worst = sustained(capped, 50_000, 0.5)
    assert not ok and worst > 25_000 and capped.verified


def test_max_rate_search_probes_below_the_drain_rate_and_verifies_every_run(spark):
    from ember.bench.sustainable import find_max_rate

    cfg = BenchConfig(duration_s=4, max_events_per_batch=100_000, master="local[2]", verbose=False)
    report = find_max_rate("grouping", WORKLOADS["grouping"][0], spark, cfg, steps=1)
    assert report["drain_events_per_second"] > 0 and report["verified"] is True
    (trial,) = report["trials"]
    assert trial["rate"] == round(0.6 * report["drain_events_per_second"])
    assert report["max_sustainable_events_per_second"] == (trial["rate"] if trial["sustained"] else 0)
