"""The dashboard's model and its Prometheus output, fed with what a real run reported.

``data/dashboard_progress.json`` is the listener's calls of one run of tests/dashboard_job.py
(Spark's progress reports with Ember's row counts, the branch counts after the split),
recorded with ``ui=0``. Expected numbers are computed here from the raw reports, not by
the model's code paths."""

from __future__ import annotations

import copy
import json
import pathlib
from datetime import datetime

import dashboard_job
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ember import StreamEnvironment
from ember.ui.model import BATCH_BUCKETS_S, RATE_WINDOW_S, JobMonitor
from ember.ui.prometheus import metrics_text, registry_for

LOG = json.loads((pathlib.Path(__file__).parent / "data" / "dashboard_progress.json").read_text())
REPORTS = [e[1] for e in LOG if e[0] == "batch"]
BRANCHES = {e[1]: e[2] for e in LOG if e[0] == "branch"}


def _graph():
    env = StreamEnvironment()
    dashboard_job.build(env)
    return env.graph()


def _ms(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)


def _observed(step: str) -> list[int]:
    return [int(r["observedMetrics"][f"ember_rows:{step}"]["rows"]) for r in REPORTS]


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _replay(log=LOG, checkpoint=None, clock=None) -> JobMonitor:
    monitor = JobMonitor(_graph(), "dashboard-fixture", clock=clock or Clock(_ms(REPORTS[-1]["timestamp"]) / 1000 + 1))
    for event in copy.deepcopy(log):
        if event[0] == "started":
            monitor.job_started({**event[1], "checkpoint": checkpoint})
        elif event[0] == "batch":
            monitor.batch_reported(event[1])
        elif event[0] == "branch":
            monitor.branch_counts(event[1], event[2])
        else:
            monitor.job_ended(event[1], event[2])
    return monitor


def test_records_in_and_out_per_step_follow_the_reports():
    snap = _replay().snapshot()
    steps = snap["steps"]
    source = sum(_observed("ad-events"))
    keyed = sum(_observed("count-per-type"))
    labelled = sum(_observed("label"))
    even = sum(b["even-only"] for b in BRANCHES.values())
    dead = sum(b["unparsable_1"] for b in BRANCHES.values())
    assert source > 0 and labelled > 0 and dead > 0 and even > 0
    assert steps["ad-events"]["records_out_total"] == source
    assert steps["ad-events"]["records_in_total"] is None  # a source receives nothing
    assert steps["key_by_1"]["records_in_total"] == steps["key_by_1"]["records_out_total"] == source  # passes records on
    assert steps["count-per-type"]["records_in_total"] == source
    assert steps["count-per-type"]["records_out_total"] == keyed
    assert steps["label"]["records_out_total"] == labelled
    assert steps["label"]["records_out_total"] + dead == keyed  # every record labelled or a dead letter
    assert steps["counts"]["records_in_total"] == labelled and steps["counts"]["records_out_total"] is None
    assert steps["even-only"]["records_out_total"] == steps["even"]["records_in_total"] == even
    assert steps["unparsable_1"]["records_in_total"] == steps["unparsable_1"]["records_out_total"] == dead
    assert snap["dead_letters"] == {"unparsable": dead}
    assert snap["events_total"] == sum(int(r["numInputRows"]) for r in REPORTS)


def test_rates_average_the_batches_of_the_last_seconds():
    snap = _replay().snapshot()
    last = _ms(REPORTS[-1]["timestamp"])
    recent = [r for r in REPORTS if _ms(r["timestamp"]) >= last - RATE_WINDOW_S * 1000]
    span = (last + REPORTS[-1]["durationMs"]["triggerExecution"] - _ms(recent[0]["timestamp"])) / 1000
    rows = sum(int(r["observedMetrics"]["ember_rows:ad-events"]["rows"]) for r in recent)
    assert snap["sources"]["ad-events"]["records_per_s"] == pytest.approx(rows / span)
    assert snap["steps"]["count-per-type"]["records_in_per_s"] == pytest.approx(rows / span)
    assert snap["events_per_s"] == pytest.approx(sum(int(r["numInputRows"]) for r in recent) / span)


def test_sources_show_lag_saturation_and_their_own_watermark():
    snap = _replay().snapshot()
    src = snap["sources"]["ad-events"]
    bound = next(e[1] for e in LOG if e[0] == "started")["max_events_per_batch"]
    last_rows = _observed("ad-events")[-1]
    assert src["saturation"] == pytest.approx(last_rows / bound)
    assert src["lag_records"] == REPORTS[-1]["lag"]
    seen = max(r["observedMetrics"]["ember_rows:ad-events"]["max_event_time_ms"] or 0 for r in REPORTS)
    assert src["max_event_time_ms"] == seen
    assert src["watermark_ms"] == seen - 1000  # the source's out-of-orderness bound
    now_ms = _ms(REPORTS[-1]["timestamp"]) + 1000
    assert src["watermark_lag_s"] == pytest.approx((now_ms - (seen - 1000)) / 1000)
    # Spark's query watermark for the stateful step: the last one it reported
    marks = [_ms(r["eventTime"]["watermark"]) for r in REPORTS if r.get("eventTime", {}).get("watermark")]
    marks = [m for m in marks if m > 0]
    assert snap["steps"]["count-per-type"]["watermark_ms"] == marks[-1]


def test_batches_percentiles_histogram_and_checkpoints():
    snap = _replay().snapshot()
    durations = sorted(r["durationMs"]["triggerExecution"] for r in REPORTS)
    batches = snap["batches"]
    assert batches["count"] == len(REPORTS) and batches["last_id"] == REPORTS[-1]["batchId"]
    assert batches["duration_ms"]["max"] == durations[-1]
    assert durations[0] <= batches["duration_ms"]["p50"] <= batches["duration_ms"]["p99"] <= durations[-1]
    counts = batches["histogram"]["counts"]
    assert sum(counts) == len(REPORTS)
    for d in durations:  # each batch in the first bucket whose bound holds it
        assert counts[next((i for i, b in enumerate(BATCH_BUCKETS_S) if d / 1000 <= b), len(BATCH_BUCKETS_S))] > 0
    history = snap["checkpoints"]["history"]
    assert [c["batch_id"] for c in history] == [r["batchId"] for r in REPORTS]
    last = REPORTS[-1]
    op = last["stateOperators"][0]
    assert history[-1]["duration_ms"] == last["durationMs"]["walCommit"] + last["durationMs"]["commitOffsets"] + op["commitTimeMs"]
    assert snap["steps"]["count-per-type"]["state"]["rows"] == op["numRowsTotal"]
    assert snap["steps"]["count-per-type"]["state"]["operator"] == "applyInPandasWithState"


def test_state_operators_that_do_not_match_the_steps_are_listed_apart():
    log = copy.deepcopy(LOG)
    for event in log:
        if event[0] == "batch":  # a second Spark state operator the job has no step for
            event[1]["stateOperators"].append(dict(event[1]["stateOperators"][0], operatorName="dedupe"))
    snap = _replay(log).snapshot()
    assert snap["steps"]["count-per-type"]["state"] is None
    assert set(snap["other_state"]) == {"applyInPandasWithState #1", "dedupe #2"}


def test_late_records_and_errors_name_what_they_can():
    log = copy.deepcopy(LOG)
    batches = [e for e in log if e[0] == "batch"]
    batches[-2][1]["lateRecordsTotal"] = 7
    batches[-1][1]["lateRecordsTotal"] = 12
    log[-1] = ["ended", "failed", "step 'label': UserFunctionError: boom"]
    snap = _replay(log).snapshot()
    assert snap["late_records_total"] == 12
    assert snap["status"] == "failed"
    assert snap["last_error"]["step"] == "label" and "boom" in snap["last_error"]["message"]


def test_runs_survive_restarts_in_the_checkpoint(tmp_path):
    started = [e for e in LOG if e[0] != "ended"]  # the first run is killed: it never ends
    first = _replay(started, checkpoint=str(tmp_path), clock=Clock(1000.0))
    assert [r["attempt"] for r in first.snapshot()["runs"]] == [1]
    second = _replay(LOG, checkpoint=str(tmp_path), clock=Clock(2000.0))
    runs = second.snapshot()["runs"]
    assert [r["attempt"] for r in runs] == [1, 2]
    assert "without stopping" in runs[0]["ended"]
    assert runs[1]["ended"].startswith("stopped:") and runs[1]["ended_ms"] == 2_000_000


def _families(monitor: JobMonitor) -> dict[str, list]:
    text = metrics_text(registry_for(monitor)).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_prometheus_output_carries_the_snapshot():
    monitor = _replay()
    snap = monitor.snapshot()
    fams = _families(monitor)

    def value(family: str, sample: str, **labels: str) -> float:
        hits = [s.value for s in fams[family] if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(hits) == 1, (family, sample, labels, fams[family])
        return hits[0]

    assert value("ember_records_out", "ember_records_out_total", step="label", job="dashboard-fixture") == sum(_observed("label"))
    assert value("ember_records_in", "ember_records_in_total", step="counts") == sum(_observed("label"))
    assert value("ember_dead_letters", "ember_dead_letters_total", tag="unparsable") == snap["dead_letters"]["unparsable"]
    assert value("ember_events", "ember_events_total") == snap["events_total"]
    assert value("ember_late_records", "ember_late_records_total") == 0
    assert value("ember_state_rows", "ember_state_rows", step="count-per-type") == REPORTS[-1]["stateOperators"][0]["numRowsTotal"]
    assert value("ember_source_lag_records", "ember_source_lag_records", source="ad-events") == REPORTS[-1]["lag"]
    buckets = [s for s in fams["ember_batch_duration_seconds"] if s.name.endswith("_bucket")]
    assert [s.value for s in buckets] == sorted(s.value for s in buckets)  # cumulative
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == len(REPORTS)
    assert value("ember_batch_duration_seconds", "ember_batch_duration_seconds_count") == len(REPORTS)
    assert value("ember_batch_duration_seconds", "ember_batch_duration_seconds_sum") == pytest.approx(
        sum(r["durationMs"]["triggerExecution"] for r in REPORTS) / 1000)
    assert value("ember_watermark_lag_seconds", "ember_watermark_lag_seconds", step="ad-events") == pytest.approx(
        snap["sources"]["ad-events"]["watermark_lag_s"])
    assert "ember_checkpoint_bytes" not in fams  # not measured (no checkpoint directory here): left out, not 0


def test_unmeasured_numbers_are_absent_not_zero():
    monitor = JobMonitor(_graph(), "idle")
    snap = monitor.snapshot()
    assert snap["status"] == "starting" and snap["events_total"] == 0
    assert all(s["records_out_total"] is None for s in snap["steps"].values())
    fams = _families(monitor)
    assert fams["ember_records_out"] == [] and fams["ember_source_lag_records"] == []


def test_latency_where_a_sink_measures_it():
    from ember import CountSink

    env = StreamEnvironment()
    sink = CountSink(latency_field="t")
    env.from_collection([(1,)], "t long").sink_to(sink, name="timed")
    monitor = JobMonitor(env.graph(), "timed", clock=Clock(100.0))
    monitor.job_started({"job": "timed", "checkpoint": None, "max_events_per_batch": 10})
    samples = {0: [5, 30, 30, 700], 1: [12_000, 80], 2: []}
    for bid, batch in samples.items():
        sink.accept_batch(bid, len(batch), batch)  # as the sink's writer does inside the batch
        monitor.batch_reported({"batchId": bid, "timestamp": "2026-11-25T00:00:0%dZ" % bid, "numInputRows": len(batch),
                                "durationMs": {"triggerExecution": 100}})
    everything = sorted(x for b in samples.values() for x in b)
    lat = monitor.snapshot()["latency"]["timed"]
    assert lat["field"] == "t" and lat["samples"] == len(everything)
    assert lat["ms"]["max"] == 12_000 and lat["ms"]["p50"] == 30
    # 5 <= 10 ms, 30 30 <= 50 ms, 80 <= 100 ms, 700 <= 1 s, 12 s above the last bound
    assert lat["histogram"]["counts"] == [1, 0, 2, 1, 0, 0, 1, 0, 0, 0, 1]
    fams = _families(monitor)
    by_le = {s.labels["le"]: s.value for s in fams["ember_latency_seconds"] if s.name.endswith("_bucket")}
    assert by_le["0.05"] == 3 and by_le["1.0"] == 5 and by_le["+Inf"] == 6
    total = [s.value for s in fams["ember_latency_seconds"] if s.name.endswith("_sum")]
    assert total == [pytest.approx(sum(everything) / 1000)]


def test_a_single_source_not_counted_in_the_query_takes_sparks_numbers():
    log = copy.deepcopy(LOG)
    for event in log:
        if event[0] == "batch":
            event[1]["observedMetrics"].pop("ember_rows:ad-events")
    snap = _replay(log).snapshot()
    assert snap["steps"]["ad-events"]["records_out_total"] == sum(int(r["numInputRows"]) for r in REPORTS)
    latest = max(_ms(r["eventTime"]["max"]) for r in REPORTS if r.get("eventTime", {}).get("max"))
    assert snap["sources"]["ad-events"]["max_event_time_ms"] == latest
    assert snap["sources"]["ad-events"]["watermark_ms"] == latest - 1000


def test_savepoints_taken_and_the_one_restored_from_are_shown(tmp_path):
    from ember.runner.spark.checkpoint import CheckpointLayout, write_json

    layout = CheckpointLayout(str(tmp_path))
    write_json(layout.savepoints_taken, [{"path": "/sp/a", "batch_id": 3, "at_ms": 5, "stopped": False}])
    write_json(layout.restored_from, {"savepoint": "/sp/old", "batch_id": 9})
    monitor = _replay(checkpoint=str(tmp_path))
    points = monitor.snapshot()["checkpoints"]
    assert points["savepoints"] == [{"path": "/sp/a", "batch_id": 3, "at_ms": 5, "stopped": False}]
    assert points["restored_from"] == {"savepoint": "/sp/old", "batch_id": 9}
    assert points["size_bytes"] > 0  # the checkpoint directory measured: these files and the run history
