"""The dashboard's model of a running job: what Spark's progress reports and Ember's
row counts say about each step, source, batch and checkpoint, as plain JSON.

:class:`JobMonitor` is a :class:`ember.job.RunListener`: the runner calls it on the
thread that follows the query; the web server reads :meth:`JobMonitor.snapshot` from its
own thread (one lock). Every number is derived from what the runner reported — nothing
is estimated where it was not measured (a missing number is ``None``, shown as "—").
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from typing import Any, Callable

from ember.graph.graph import STATEFUL, Graph
from ember.graph.nodes import Node, SideOutputNode, SinkNode, SourceNode
from ember.job import RunListener, spark_time_ms
from ember.runner.spark.checkpoint import CheckpointLayout, disk_bytes, read_json, write_json
from ember.runner.spark.compilation import ROWS_METRIC

__all__ = ["JobMonitor", "graph_spec", "BATCH_BUCKETS_S", "LATENCY_BUCKETS_S", "RATE_WINDOW_S"]

RATE_WINDOW_S = 10.0  # rates are averaged over the batches of the last this many seconds
BATCH_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)  # batch duration histogram bounds
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # measured end-to-end latency bounds
LATENCY_SAMPLES = 20_000  # the latest samples the latency percentiles are computed over
RECENT_BATCHES = 300  # batches kept for rates, percentiles and the charts
CHECKPOINT_HISTORY = 100  # checkpoint rows kept
SIZE_EVERY_S = 2.0  # the checkpoint directory is measured at most this often
PASS_THROUGH = ("keyby",)  # steps that emit exactly the records they receive


def graph_spec(graph: Graph) -> list[dict[str, Any]]:
    """The steps users wrote, in topological order, for the page's graph."""
    steps = []
    for node in graph.nodes:
        role = "source" if isinstance(node, SourceNode) else "sink" if isinstance(node, SinkNode) else "step"
        spec: dict[str, Any] = {
            "name": node.name, "kind": node.kind, "describe": node.describe(), "role": role,
            "inputs": [p.name for p in node.inputs], "stateful": isinstance(node, STATEFUL),
        }
        tag = _dead_letter_tag(node)
        if tag is not None:
            spec["dead_letters"] = tag
        if isinstance(node, SourceNode) and node.watermark is not None and node.watermark.timestamp_field:
            spec["out_of_orderness_ms"] = node.watermark.max_out_of_orderness_ms
        steps.append(spec)
    return steps


def _dead_letter_tag(node: Node) -> str | None:
    """The tag's name when ``node`` is the side output a step sends its failed records to."""
    if not isinstance(node, SideOutputNode) or not node.inputs:
        return None
    dead = getattr(node.inputs[0], "dead_letter", None)
    return node.tag.name if dead is not None and dead.name == node.tag.name else None


class JobMonitor(RunListener):
    """Collects a job's progress and serves it as one JSON snapshot."""

    def __init__(self, graph: Graph, job: str, *, clock: Callable[[], float] = time.time) -> None:
        self.steps = graph_spec(graph)
        self.job = job
        self.clock = clock
        self._lock = threading.Lock()
        self._by_name = {s["name"]: s for s in self.steps}
        self._sources = [s["name"] for s in self.steps if s["role"] == "source"]
        self.info: dict[str, Any] = {}
        self.status = "starting"
        self.batches: deque[dict[str, Any]] = deque(maxlen=RECENT_BATCHES)
        self.rows_total: dict[str, int] = {}
        self.events_total = 0
        self.batches_total = 0
        self.late_total = 0
        self.max_event_time: dict[str, int] = {}  # source -> largest event time seen (epoch ms)
        self.histogram = [0] * (len(BATCH_BUCKETS_S) + 1)  # counts per bucket, the last +Inf
        self.duration_sum_s = 0.0
        self.state: dict[str, dict[str, Any]] = {}  # stateful step (or operator) -> its latest state numbers
        self.checkpoints: deque[dict[str, Any]] = deque(maxlen=CHECKPOINT_HISTORY)
        self.checkpoint_bytes: int | None = None
        self._sized_at = -1e18
        self.last_error: dict[str, Any] | None = None
        self.savepoints: list[dict[str, Any]] = []  # taken of this job (savepoints/ notes them in the checkpoint)
        self.restored_from: dict[str, Any] | None = None  # the savepoint the job started from
        self.runs: list[dict[str, Any]] = []
        self.watermark_ms: int | None = None
        self._pending_branch: dict[int, dict[str, int]] = {}
        self._late_this_run = 0
        # Sinks that measure end-to-end latency (CountSink(latency_field=...)): their samples,
        # binned as batches are reported (all of them) and the latest kept for percentiles.
        self._latency_sinks = {n.name: n.sink for n in graph.nodes
                               if isinstance(n, SinkNode) and getattr(n.sink, "latency_field", None)}
        self.latency: dict[str, dict[str, Any]] = {
            name: {"counts": [0] * (len(LATENCY_BUCKETS_S) + 1), "sum_s": 0.0, "recent": deque(maxlen=LATENCY_SAMPLES)}
            for name in self._latency_sinks}
        self._binned_through = -1

    # -- RunListener --------------------------------------------------------------------
    def job_started(self, info: dict[str, Any]) -> None:
        with self._lock:
            self.info = dict(info)
            self.status = "running"
            self.runs = _record_run(info.get("checkpoint"), self.clock())

    def batch_reported(self, report: dict[str, Any]) -> None:
        with self._lock:
            self._add_batch(report)
        self._measure_checkpoint()

    def branch_counts(self, batch_id: int, rows: dict[str, int]) -> None:
        # Runs inside the batch (foreachBatch), before Spark's progress report of it.
        with self._lock:
            self._pending_branch[batch_id] = dict(rows)

    def job_ended(self, stopped_because: str, error: str | None) -> None:
        with self._lock:
            self.status = "failed" if error else f"stopped: {stopped_because}"
            if error:
                self.last_error = {"message": error, "step": _step_named(error, self._by_name), "at_ms": int(self.clock() * 1000)}
            _end_run(self.info.get("checkpoint"), self.runs, self.clock(), self.status)

    # -- ingesting a report -------------------------------------------------------------
    def _add_batch(self, report: dict[str, Any]) -> None:
        bid = int(report.get("batchId", -1))
        observed = report.get("observedMetrics") or {}
        rows: dict[str, int] = {}
        for metric, values in observed.items():
            if metric.startswith(ROWS_METRIC):
                step = metric[len(ROWS_METRIC):]
                rows[step] = int(values.get("rows") or 0)
                latest = values.get("max_event_time_ms")
                if latest is not None:
                    self.max_event_time[step] = max(self.max_event_time.get(step, latest), int(latest))
        rows.update(self._pending_branch.pop(bid, {}))
        events = int(report.get("numInputRows") or 0)
        unobserved = [s for s in self._sources if s not in rows]
        if len(self._sources) == 1 and unobserved:  # not counted in the query (one source; or fused): Spark's count, corrected
            only = self._sources[0]
            rows[only] = events
            latest = spark_time_ms((report.get("eventTime") or {}).get("max"))  # the query's event time is the source's
            if latest is not None and "out_of_orderness_ms" in self._by_name[only]:
                self.max_event_time[only] = max(self.max_event_time.get(only, latest), latest)
        for step, n in rows.items():
            self.rows_total[step] = self.rows_total.get(step, 0) + n
        total_late = int(report.get("lateRecordsTotal") or 0)  # the runner's count (progress.py), this run
        late = max(0, total_late - self._late_this_run)
        self._late_this_run = total_late
        self.late_total += late
        self.events_total += events
        self.batches_total += 1
        duration_ms = int((report.get("durationMs") or {}).get("triggerExecution") or 0)
        self.duration_sum_s += duration_ms / 1000
        self.histogram[_bucket(duration_ms / 1000)] += 1
        watermark = spark_time_ms((report.get("eventTime") or {}).get("watermark"))
        if watermark is not None and watermark > 0:
            self.watermark_ms = watermark
        started = spark_time_ms(report.get("timestamp")) or int(self.clock() * 1000)
        self.batches.append({
            "batch_id": bid, "started_ms": started, "duration_ms": duration_ms, "events": events,
            "rows": rows, "lag": report.get("lag"), "late": late,
        })
        self._add_state(report, bid, duration_ms)
        self._bin_latencies(bid)

    def _bin_latencies(self, bid: int) -> None:
        for name, sink in self._latency_sinks.items():
            kept = self.latency[name]
            for sample in sink.latencies_after(self._binned_through):  # the sink's batches up to this one
                kept["counts"][_bucket(sample / 1000, LATENCY_BUCKETS_S)] += 1
                kept["sum_s"] += sample / 1000
                kept["recent"].append(sample)
        self._binned_through = max(self._binned_through, bid)

    def _add_state(self, report: dict[str, Any], bid: int, duration_ms: int) -> None:
        operators = report.get("stateOperators") or []
        stateful = list(self.info.get("stateful_steps") or [s["name"] for s in self.steps if s["stateful"]])
        # Spark lists state operators from the sink back to the sources: reversed, they follow
        # the steps' topological order. A step is named when the counts match one to one.
        names = list(reversed(stateful)) if len(stateful) == len(operators) else [
            f"{op.get('operatorName', 'state')} #{i + 1}" for i, op in enumerate(operators)]
        before = sum(int(s.get("rows") or 0) for s in self.state.values())
        before_bytes = sum(int(s.get("bytes") or 0) for s in self.state.values())
        for name, op in zip(names, operators):
            custom = op.get("customMetrics") or {}
            self.state[name] = {
                "operator": op.get("operatorName"), "rows": int(op.get("numRowsTotal") or 0),
                "rows_updated": int(op.get("numRowsUpdated") or 0),
                "bytes": int(op.get("memoryUsedBytes") or 0),
                "files_bytes": int(custom["rocksdbSstFileSize"]) if "rocksdbSstFileSize" in custom else None,
                "commit_ms": int(op.get("commitTimeMs") or 0), "step_named": name in self._by_name,
            }
        durations = report.get("durationMs") or {}
        commit = int(durations.get("walCommit") or 0) + int(durations.get("commitOffsets") or 0)
        commit += sum(int(op.get("commitTimeMs") or 0) for op in operators)
        rows_now = sum(int(s.get("rows") or 0) for s in self.state.values())
        bytes_now = sum(int(s.get("bytes") or 0) for s in self.state.values())
        self.checkpoints.append({
            "batch_id": bid, "duration_ms": commit, "batch_ms": duration_ms, "size_bytes": self.checkpoint_bytes,
            "state_rows": rows_now, "state_rows_growth": rows_now - before, "state_bytes": bytes_now,
            "state_bytes_growth": bytes_now - before_bytes,
        })

    def _measure_checkpoint(self) -> None:
        """The checkpoint directory's size on disk (at most every ``SIZE_EVERY_S``)."""
        path = self.info.get("checkpoint")
        now = self.clock()
        if not path or now - self._sized_at < SIZE_EVERY_S:
            return
        self._sized_at = now
        size = disk_bytes(path)
        layout = CheckpointLayout(path)
        taken, restored = _read(layout.savepoints_taken), _read(layout.restored_from)
        with self._lock:
            self.checkpoint_bytes = size
            if self.checkpoints:
                self.checkpoints[-1]["size_bytes"] = size
            self.savepoints = [t for t in taken if isinstance(t, dict)] if isinstance(taken, list) else []
            self.restored_from = restored if isinstance(restored, dict) else None

    # -- reading ------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Everything the page and /api/job show, as JSON-ready data."""
        with self._lock:
            now_ms = int(self.clock() * 1000)
            recent = _recent(list(self.batches))
            span_s = _span_s(recent)
            totals: dict[str, int | None] = {}
            rates: dict[str, float | None] = {}
            for spec in self.steps:  # topological: a step's inputs are resolved before it
                name = spec["name"]
                if name in self.rows_total:
                    totals[name] = self.rows_total[name]
                    rates[name] = sum(b["rows"].get(name, 0) for b in recent) / span_s if span_s else None
                elif spec["kind"] in PASS_THROUGH and len(spec["inputs"]) == 1:  # records unchanged: its input's
                    totals[name], rates[name] = totals.get(spec["inputs"][0]), rates.get(spec["inputs"][0])
                else:
                    totals[name], rates[name] = None, None
            steps = {}
            for spec in self.steps:
                name = spec["name"]
                inputs = spec["inputs"]
                sink = spec["role"] == "sink"
                steps[name] = {
                    # A side output receives its own records, not its parent's main output.
                    "records_in_total": totals[name] if spec["kind"] == "sideoutput" else _sum_known([totals[i] for i in inputs]) if inputs else None,
                    "records_out_total": None if sink else totals[name],
                    "records_in_per_s": rates[name] if spec["kind"] == "sideoutput" else _sum_known([rates[i] for i in inputs]) if inputs else None,
                    "records_out_per_s": None if sink else rates[name],
                    "state": self.state.get(name), "watermark_ms": self.watermark_ms if spec["stateful"] else None,
                    "watermark_lag_s": _lag_s(now_ms, self.watermark_ms) if spec["stateful"] else None,
                }
            return {
                "job": self.job, "status": self.status, "now_ms": now_ms,
                "master": self.info.get("master"), "spark_ui": self.info.get("spark_ui"),
                "checkpoint": self.info.get("checkpoint"), "graph": self.steps, "steps": steps,
                "sources": self._sources_view(recent, span_s, now_ms),
                "events_total": self.events_total,
                "events_per_s": sum(b["events"] for b in recent) / span_s if span_s else None,
                "watermark_ms": self.watermark_ms, "watermark_lag_s": _lag_s(now_ms, self.watermark_ms),
                "batches": self._batches_view(),
                "checkpoints": {"size_bytes": self.checkpoint_bytes, "history": list(self.checkpoints)[-30:],
                                "savepoints": list(self.savepoints)[-10:], "restored_from": self.restored_from},
                "other_state": {k: v for k, v in self.state.items() if not v["step_named"]},
                "late_records_total": self.late_total,
                "dead_letters": {s["dead_letters"]: self.rows_total.get(s["name"], 0) for s in self.steps if "dead_letters" in s},
                "last_error": self.last_error, "runs": list(self.runs),
                "latency": {name: self._latency_view(name) for name in self._latency_sinks},
            }

    def _latency_view(self, name: str) -> dict[str, Any]:
        kept = self.latency[name]
        ordered = sorted(kept["recent"])
        return {
            "field": self._latency_sinks[name].latency_field, "samples": sum(kept["counts"]),
            "ms": {p: _percentile(ordered, q) for p, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))},
            "histogram": {"bounds_s": list(LATENCY_BUCKETS_S), "counts": list(kept["counts"]), "sum_s": kept["sum_s"]},
        }

    def _sources_view(self, recent: list[dict[str, Any]], span_s: float | None, now_ms: int) -> dict[str, Any]:
        bound = self.info.get("max_events_per_batch")
        out = {}
        last = recent[-1] if recent else None
        for name in self._sources:
            spec = self._by_name[name]
            in_last = last["rows"].get(name) if last else None
            seen = self.max_event_time.get(name)
            delay = spec.get("out_of_orderness_ms")
            watermark = seen - delay if seen is not None and delay is not None else None
            lag = last.get("lag") if last and len(self._sources) == 1 else None
            rate = sum(b["rows"].get(name, 0) for b in recent) / span_s if span_s and name in self.rows_total else None
            out[name] = {
                "records_total": self.rows_total.get(name),
                "records_per_s": rate,
                "lag_records": lag,
                "lag_seconds": lag / rate if lag is not None and rate else (0.0 if lag == 0 else None),
                "saturation": in_last / bound if in_last is not None and bound else None,
                "max_event_time_ms": seen, "watermark_ms": watermark, "watermark_lag_s": _lag_s(now_ms, watermark),
            }
        return out

    def _batches_view(self) -> dict[str, Any]:
        batches = list(self.batches)
        durations = sorted(b["duration_ms"] for b in batches[-100:])
        return {
            "count": self.batches_total,
            "last_id": batches[-1]["batch_id"] if batches else None,
            "duration_ms": {p: _percentile(durations, q) for p, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))},
            "recent": [{"batch_id": b["batch_id"], "duration_ms": b["duration_ms"], "events": b["events"]} for b in batches[-60:]],
            "histogram": {"bounds_s": list(BATCH_BUCKETS_S), "counts": list(self.histogram), "sum_s": self.duration_sum_s},
        }

    def to_json(self) -> str:
        return json.dumps(self.snapshot())


# ---------------------------------------------------------------------------- helpers
def _record_run(checkpoint: str | None, now: float) -> list[dict[str, Any]]:
    """Append this start to the checkpoint's run history (a restart after a kill shows
    the previous run as ended without stopping); the history."""
    path = _runs_path(checkpoint)
    loaded = _read(path) if path else None
    runs = [r for r in loaded if isinstance(r, dict)] if isinstance(loaded, list) else []
    for run in runs:
        if run.get("ended_ms") is None:
            run["ended"] = "ended without stopping (killed, or its driver died)"
    runs.append({"attempt": len(runs) + 1, "started_ms": int(now * 1000), "ended_ms": None, "pid": os.getpid()})
    _write_runs(path, runs)
    return runs


def _end_run(checkpoint: str | None, runs: list[dict[str, Any]], now: float, status: str) -> None:
    if runs:
        runs[-1]["ended_ms"] = int(now * 1000)
        runs[-1]["ended"] = status
        _write_runs(_runs_path(checkpoint), runs)


def _runs_path(checkpoint: str | None) -> str | None:
    return CheckpointLayout(checkpoint).run_history if checkpoint else None


def _write_runs(path: str | None, runs: list[dict[str, Any]]) -> None:
    if path:
        write_json(path, runs[-200:])


def _read(path: str) -> Any:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None  # being replaced, or not JSON: read again next time


def _step_named(message: str, steps: dict[str, Any]) -> str | None:
    """The step an error message names ('step' 'x' or "'x'"), if any."""
    named = [name for name in steps if f"'{name}'" in message]
    return max(named, key=len) if named else None


def _recent(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not batches:
        return []
    last = batches[-1]["started_ms"]
    return [b for b in batches if b["started_ms"] >= last - RATE_WINDOW_S * 1000]


def _span_s(recent: list[dict[str, Any]]) -> float | None:
    """Wall time the recent batches cover: from the first's start to the last's end."""
    if not recent:
        return None
    span = (recent[-1]["started_ms"] + recent[-1]["duration_ms"] - recent[0]["started_ms"]) / 1000
    return span if span > 0 else None


def _sum_known(values: list[Any]) -> Any:
    known = [v for v in values if v is not None]
    return sum(known) if known and len(known) == len(values) else None


def _bucket(seconds: float, bounds: tuple[float, ...] = BATCH_BUCKETS_S) -> int:
    for i, bound in enumerate(bounds):
        if seconds <= bound:
            return i
    return len(bounds)


def _percentile(ordered: list[int], q: float) -> int | None:
    if not ordered:
        return None
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[index]


def _lag_s(now_ms: int, watermark_ms: int | None) -> float | None:
    return (now_ms - watermark_ms) / 1000 if watermark_ms is not None else None
