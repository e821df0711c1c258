"""``/metrics``: the dashboard's numbers in Prometheus' text format (prometheus-client).

Names follow Prometheus' conventions: counters end in ``_total``, units are base units
(seconds, bytes), every series carries the ``job`` label. A number the job has not
measured (e.g. a source's lag when it does not report one) is left out, not zero.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ember.ui.model import JobMonitor

__all__ = ["metrics_text", "registry_for", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _JobCollector(Collector):
    def __init__(self, monitor: JobMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        snap = self.monitor.snapshot()
        job = snap["job"]
        rec_in = CounterMetricFamily("ember_records_in", "Records a step received", labels=["job", "step"])
        rec_out = CounterMetricFamily("ember_records_out", "Records a step emitted", labels=["job", "step"])
        state_rows = GaugeMetricFamily("ember_state_rows", "Rows in a stateful step's Spark state store", labels=["job", "step"])
        state_bytes = GaugeMetricFamily("ember_state_bytes", "Memory a stateful step's state store uses", labels=["job", "step"])
        wm_lag = GaugeMetricFamily("ember_watermark_lag_seconds", "Wall clock minus the watermark", labels=["job", "step"])
        for name, step in snap["steps"].items():
            if step["records_in_total"] is not None:
                rec_in.add_metric([job, name], step["records_in_total"])
            if step["records_out_total"] is not None:
                rec_out.add_metric([job, name], step["records_out_total"])
            if step["state"]:
                state_rows.add_metric([job, name], step["state"]["rows"])
                state_bytes.add_metric([job, name], step["state"]["bytes"])
            if step["watermark_lag_s"] is not None:
                wm_lag.add_metric([job, name], step["watermark_lag_s"])
        lag = GaugeMetricFamily("ember_source_lag_records", "Records waiting in a source after the last batch", labels=["job", "source"])
        sat = GaugeMetricFamily("ember_source_saturation_ratio", "Last batch's records over the per-batch bound (admission control)",
                                labels=["job", "source"])
        rate = GaugeMetricFamily("ember_source_records_per_second", "A source's input rate over the last seconds", labels=["job", "source"])
        for name, src in snap["sources"].items():
            if src["lag_records"] is not None:
                lag.add_metric([job, name], src["lag_records"])
            if src["saturation"] is not None:
                sat.add_metric([job, name], src["saturation"])
            if src["records_per_s"] is not None:
                rate.add_metric([job, name], src["records_per_s"])
            if src["watermark_lag_s"] is not None:
                wm_lag.add_metric([job, name], src["watermark_lag_s"])
        yield from (rec_in, rec_out, state_rows, state_bytes, wm_lag, lag, sat, rate)

        events = CounterMetricFamily("ember_events", "Input events processed", labels=["job"])
        events.add_metric([job], snap["events_total"])
        late = CounterMetricFamily("ember_late_records", "Late records dropped behind the watermark", labels=["job"])
        late.add_metric([job], snap["late_records_total"])
        dead = CounterMetricFamily("ember_dead_letters", "Records sent to a dead-letter side output", labels=["job", "tag"])
        for tag, n in snap["dead_letters"].items():
            dead.add_metric([job, tag], n)
        yield from (events, late, dead)

        hist = snap["batches"]["histogram"]
        duration = HistogramMetricFamily("ember_batch_duration_seconds", "Micro-batch durations", labels=["job"])
        duration.add_metric([job], _buckets(hist), sum_value=hist["sum_s"])
        yield duration
        latency = HistogramMetricFamily("ember_latency_seconds", "End-to-end latency a sink measured (arrival - the record's field)",
                                        labels=["job", "sink"])
        for sink, measured in snap["latency"].items():
            latency.add_metric([job, sink], _buckets(measured["histogram"]), sum_value=measured["histogram"]["sum_s"])
        yield latency
        size = snap["checkpoints"]["size_bytes"]
        if size is not None:
            ckpt = GaugeMetricFamily("ember_checkpoint_bytes", "The job's checkpoint directory on disk", labels=["job"])
            ckpt.add_metric([job], size)
            yield ckpt
        runs = CounterMetricFamily("ember_job_starts", "Times the job started on its checkpoint (restarts + 1)", labels=["job"])
        runs.add_metric([job], len(snap["runs"]))
        yield runs


def _buckets(hist: dict[str, Any]) -> list[tuple[str, float]]:
    """Cumulative (upper bound, count) pairs of a histogram kept per bucket."""
    cumulative, buckets = 0, []
    for bound, count in zip([*hist["bounds_s"], float("inf")], hist["counts"]):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
    return buckets


def registry_for(monitor: JobMonitor) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_JobCollector(monitor))
    return registry


def metrics_text(registry: Any) -> bytes:
    return generate_latest(registry)
