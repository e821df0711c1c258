"""Running a compiled job: start the query, follow its progress, stop it on time.

A job stops when the user interrupts it, when every (bounded) source has
ended and the last windows were flushed, after a duration, or once a number
of events was processed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from typing import Any, Callable

from ember.api.environment import EnvironmentConfig, JobResult
from ember.errors import JobFailedError
from ember.graph.graph import Graph
from ember.runner.spark.compat import check_restart
from ember.runner.spark.compiler import compile_graph
from ember.runner.spark.datasources import fixed_origin, origin_file
from ember.runner.spark.session import configure_for_query
from ember.savepoints.store import last_batch
from ember.time.clock import Clock

__all__ = ["run_job", "source_origins"]

POLL_S = 0.1
RUNNING = "running"  # in <checkpoint>/ember while a job runs: its pid and host
STOP_REQUEST = "stop-request"  # written by `ember savepoint create --stop`: stop at a clean cut
PROGRESS_EVERY_S = 5.0


def _has_progress(checkpoint: str) -> bool:
    """Spark planned at least one batch from this checkpoint (its offset log is not empty)."""
    return last_batch(checkpoint, "offsets") >= 0


def last_committed_batch(checkpoint: str) -> int:
    """The newest batch id in Spark's commit log (-1 when none)."""
    return last_batch(checkpoint, "commits")


def source_origins(checkpoint: str, graph: Graph) -> dict[str, int]:
    """Each generator source's event-time origin (epoch ms), as fixed in the checkpoint."""
    out = {}
    for node in graph.sources:
        fixed = getattr(node.source, "start_ms", None)
        path = origin_file(checkpoint, node.name)
        if fixed is not None:
            out[node.name] = int(fixed)
        elif os.path.exists(path):
            out[node.name] = fixed_origin(path)
    return out


# How much longer than its duration a run may take to reach its ``min_batches``.
MIN_BATCHES_GRACE_S = 60.0


def run_job(
    graph: Graph,
    spark: Any,
    config: EnvironmentConfig,
    *,
    name: str,
    checkpoint: str,
    duration_s: float | None,
    max_events: int | None,
    progress: Callable[[dict[str, Any]], None] | bool,
    clock: Clock,
    idle_s: float | None = None,
    from_savepoint: str | None = None,
    min_batches: int = 0,
) -> JobResult:
    configure_for_query(spark, config)
    if from_savepoint is not None:
        from ember.savepoints import restore_savepoint

        restore_savepoint(spark, from_savepoint, checkpoint, graph, config.parallelism)
    bounded_sources = [n for n in graph.sources if n.source.bounded]
    bounded = bool(bounded_sources) and len(bounded_sources) == len(graph.sources)
    os.makedirs(os.path.join(checkpoint, "ember"), exist_ok=True)  # Ember's own files: origins, markers
    marker = os.path.join(checkpoint, "ember", "end-of-input")
    stop_marker = os.path.join(checkpoint, "ember", "stop")
    stop_request = os.path.join(checkpoint, "ember", STOP_REQUEST)  # `ember savepoint create --stop`
    for left in (stop_marker, stop_request):
        if os.path.exists(left):
            os.remove(left)  # left by a run that did not finish stopping
    check_restart(checkpoint, graph, has_progress=_has_progress(checkpoint))
    job = compile_graph(
        graph, spark, config, job_name=name, checkpoint=checkpoint,
        end_of_input_marker=marker if bounded else None,
        stop_marker=stop_marker,
    )
    _write_json(os.path.join(checkpoint, "ember", "operators.json"), {"key_types": job.compilation.key_types})
    job.prepare_sinks()
    needs_flush = job.compilation.uses_end_of_input
    writer = (
        job.writer()
        .outputMode(job.output_mode)
        .option("checkpointLocation", checkpoint)
        .queryName(f"{name}-{os.getpid()}-{id(job)}")
        .trigger(processingTime=f"{config.trigger_interval_ms} milliseconds")
    )
    follower = _Follower(progress, name, clock)
    start = clock.monotonic()
    running = os.path.join(checkpoint, "ember", RUNNING)
    _write_json(running, {"pid": os.getpid(), "host": socket.gethostname(), "job": name})
    try:
        query = writer.start()
    except BaseException:
        os.remove(running)
        raise
    reason = "running"
    flushing = False  # end of input marked; waiting for the batch after the end-of-input row
    idle_since = clock.monotonic()
    input_since = clock.monotonic()  # last batch with input (or the start)
    try:
        while True:
            if not query.isActive:
                break
            if follower.poll(query):
                idle_since = clock.monotonic()
                if follower.progress[-1]["numInputRows"] > 0:
                    input_since = idle_since
            now = clock.monotonic()
            if idle_s is not None and follower.progress and now - input_since >= idle_s:
                if not query.status["isDataAvailable"]:
                    reason = f"no input for {idle_s:g} s"
                    break
            if duration_s is not None and now - start >= duration_s:
                fed = sum(1 for r in follower.progress if r["numInputRows"])
                if fed >= min_batches or now - start >= duration_s + MIN_BATCHES_GRACE_S:
                    reason = f"duration {duration_s:g} s reached"
                    break
            if max_events is not None and follower.events >= max_events:
                reason = f"{max_events:,} events processed"
                break
            if os.path.exists(stop_request):
                reason = "stopped for a savepoint"
                break
            if bounded:
                if not flushing and follower.sources_done(len(bounded_sources)):
                    if not needs_flush:
                        reason = "sources ended"
                        break
                    open(marker, "a").close()
                    flushing = True
                elif flushing and follower.end_of_input_seen_before(follower.last_batch):
                    reason = "sources ended, windows flushed"
                    break
                idle_limit = max(10.0, 10 * config.trigger_interval_ms / 1000)
                status = query.status
                if now - idle_since > idle_limit and not status["isDataAvailable"] and not status["isTriggerActive"]:
                    reason = "sources idle"
                    break
            clock_sleep(POLL_S)
    except KeyboardInterrupt:
        reason = "interrupted"
    finally:
        try:
            _stop_gracefully(query, stop_marker, follower, clock, checkpoint, bool(job.compilation.unstoppable))
            if reason == "stopped for a savepoint" and query.exception() is None:
                query = _finish_planned_batch(writer, query, stop_marker, follower, clock, checkpoint)
        finally:
            follower.poll(query)
            for done in (stop_marker, stop_request, running):
                if os.path.exists(done):
                    os.remove(done)
    # Driver-side sinks keep exactly the batches this result counts: not a batch stopped after
    # its sink ran but before Spark committed it, nor one committed but stopped before Spark
    # reported its progress (its input would be missing from ``events``).
    counted = min(last_committed_batch(checkpoint), follower.last_batch)
    for sink in job.sinks:
        forget = getattr(sink.sink, "_forget_after", None)
        if forget is not None:
            forget(counted)
    exc = query.exception()
    if exc is not None:
        raise JobFailedError(f"job '{name}' failed: {_cause(exc)}") from None
    return JobResult(
        name=name,
        checkpoint_dir=checkpoint,
        batches=len(follower.progress),
        events=follower.events,
        seconds=clock.monotonic() - start,
        processing_seconds=follower.processing_ms / 1000,
        progress=follower.progress,
        stopped_because=reason,
        late_dropped=follower.late_dropped + _counted(job, "late_dropped"),
        start_ms=source_origins(checkpoint, graph),
    )


def _stop_gracefully(query: Any, stop_marker: str, follower: "_Follower", clock: Clock, checkpoint: str,
                     unstoppable: bool = False) -> None:
    """Stop between micro-batches rather than interrupting one.

    Ember's sources stop admitting input once the stop marker exists; the
    runner then waits for the batch in flight — until every batch in the
    offset log is in the commit log and no trigger runs (bounded by a few batch
    durations) — and stops the idle query. Interrupting a batch is safe for
    exactly-once (it is replayed on restart) but makes Spark log errors, and a
    savepoint wants a clean cut.

    A source read by Spark's own reader (``unstoppable``) keeps admitting input,
    so with a trigger interval of 0 the query is never idle: the runner waits
    only for the batch in flight to be committed and stops then, interrupting
    at most the batch that has just begun (replayed on restart).
    """
    if query.isActive and query.exception() is None:
        open(stop_marker, "a").close()
        # The first batch also starts Spark's Python workers: give it the longest grace.
        last = follower.progress[-1]["durationMs"].get("triggerExecution", 1000) if follower.progress else 10_000
        deadline = clock.monotonic() + min(30.0, 2.0 + 3 * last / 1000)
        in_flight = _planned_batch(checkpoint)
        idle_polls = 0
        while clock.monotonic() < deadline and query.isActive and idle_polls < 3:
            clean = not query.status["isTriggerActive"] and _planned_batch(checkpoint) is None
            if unstoppable and (clean or in_flight is None or last_committed_batch(checkpoint) >= in_flight):
                break
            idle_polls = idle_polls + 1 if clean else 0
            clock_sleep(0.01)
    query.stop()


def _planned_batch(checkpoint: str) -> int | None:
    """The batch Spark planned (offset log) but has not committed, if any."""
    planned, committed = last_batch(checkpoint, "offsets"), last_committed_batch(checkpoint)
    return planned if planned > committed else None


def _finish_planned_batch(writer: Any, query: Any, stop_marker: str, follower: "_Follower", clock: Clock, checkpoint: str) -> Any:
    """After a stop for a savepoint: if a planned batch was interrupted, run the query
    once more (the stop marker admits no new input, so Spark only replays that batch
    from its logged offsets) so the savepoint's cut leaves nothing half-written."""
    for _ in range(2):
        if _planned_batch(checkpoint) is None:
            break
        query = writer.start()
        deadline = clock.monotonic() + 120
        while clock.monotonic() < deadline and query.isActive and _planned_batch(checkpoint) is not None:
            follower.poll(query)
            clock_sleep(POLL_S)
        _stop_gracefully(query, stop_marker, follower, clock, checkpoint)
    return query


def _write_json(path: str, value: Any) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, sort_keys=True)
    os.replace(tmp, path)


def clock_sleep(seconds: float) -> None:
    import time

    time.sleep(seconds)


class _Follower:
    """Collects progress reports (each batch once) and shows progress."""

    def __init__(self, progress: Callable[[dict[str, Any]], None] | bool, name: str, clock: Clock) -> None:
        self.callback = progress if callable(progress) else None
        self.verbose = progress is True
        self.name = name
        self.clock = clock
        self.progress: list[dict[str, Any]] = []
        self.seen: set[int] = set()
        self.events = 0
        self.late_dropped = 0
        self.processing_ms = 0
        self.last_batch = -1
        self.eos_batch: int | None = None
        self.last_print = clock.monotonic()
        self.events_at_print = 0

    def poll(self, query: Any) -> bool:
        """Record new progress reports; cheap when nothing changed (one JVM call)."""
        last = query._jsq.lastProgress()  # the JVM object: reading batchId parses nothing
        bid = None if last is None else int(last.batchId())
        if bid is None or bid in self.seen:
            new = False
        elif self.last_batch >= 0 and bid == self.last_batch + 1:
            new = self._record(json.loads(last.json()))
        else:  # the first report, or batches went by between polls: take them from this run's history
            new = False
            for p in sorted(query.recentProgress, key=lambda r: int(r.batchId)):
                if int(p.batchId) not in self.seen:
                    new = self._record(json.loads(p.json)) or new
        if self.verbose and self.clock.monotonic() - self.last_print >= PROGRESS_EVERY_S:
            self._print()
        return new

    def _record(self, report: dict[str, Any]) -> bool:
        bid = int(report["batchId"])
        if bid in self.seen:
            return False
        self.seen.add(bid)
        self.progress.append(report)
        sources = report.get("sources", [])
        offsets = [_offset(s.get("endOffset")) for s in sources]
        report["numInputRows"] = _events(report, sources, offsets)
        self.events += report["numInputRows"]
        lag = _lag(sources)
        if lag is not None:
            report["lag"] = lag
        self.processing_ms += int(report.get("durationMs", {}).get("triggerExecution", 0))
        self.last_batch = max(self.last_batch, bid)
        dropped = sum(int(op.get("numRowsDroppedByWatermark") or 0) for op in report.get("stateOperators", []))
        if dropped:
            self.late_dropped += dropped
            print(
                f"[ember] {self.name}: batch {bid} dropped {dropped} late record(s) behind the watermark",
                file=sys.stderr, flush=True,
            )
        if self.eos_batch is None and any(o.get("ended") == 1 for o in offsets):
            self.eos_batch = bid
        if self.callback:
            self.callback(report)
        return True

    def _print(self) -> None:
        now = self.clock.monotonic()
        rate = (self.events - self.events_at_print) / max(1e-9, now - self.last_print)
        last = self.progress[-1] if self.progress else {}
        wm = last.get("eventTime", {}).get("watermark", "-")
        took = last.get("durationMs", {}).get("triggerExecution", "-")
        lag = f", lag {last['lag']:,} records" if "lag" in last else ""
        print(
            f"[ember] {self.name}: {self.events:,} events, {rate:,.0f} events/s, "
            f"batch {last.get('batchId', '-')} took {took} ms, watermark {wm}{lag}",
            file=sys.stderr, flush=True,
        )
        self.last_print, self.events_at_print = now, self.events

    def sources_done(self, expected: int) -> bool:
        if not self.progress:
            return False
        offsets = [_offset(s.get("endOffset")) for s in self.progress[-1].get("sources", [])]
        done = [o["done"] for o in offsets if "done" in o]
        return len(done) >= expected and all(done)

    def end_of_input_seen_before(self, batch: int) -> bool:
        return self.eos_batch is not None and batch > self.eos_batch


def _events(report: dict[str, Any], sources: list[dict[str, Any]], offsets: list[dict[str, Any]]) -> int:
    """The batch's input events: Spark's row count, except that the end-of-input
    row is Ember's, not the user's, and a source packing its records per state
    bucket (keyed/packing.py) counts events by its offsets (``n``), not rows."""
    total = int(report.get("numInputRows") or 0)
    for source, end in zip(sources, offsets):
        if "ended" in end or end.get("packed"):
            total -= int(source.get("numInputRows") or 0)
        if end.get("packed"):
            total += int(end["n"]) - int(_offset(source.get("startOffset")).get("n", 0))
    return total


def _lag(sources: list[dict[str, Any]]) -> int | None:
    """Records waiting in sources that report them, after the batch: entries added
    minus read (Redis streams), events due minus admitted (rate-limited generators)."""
    total, known = 0, False
    for s in sources:
        end = _offset(s.get("endOffset"))
        added, read = _offset(s.get("latestOffset")).get("added"), end.get("read")
        if isinstance(added, dict) and isinstance(read, dict):
            total += sum(max(0, int(added[k]) - int(read.get(k, 0))) for k in added)
            known = True
        elif "due" in end and "n" in end:
            total += max(0, int(end["due"]) - int(end["n"]))
            known = True
    return total if known else None


def _counted(job: Any, name: str) -> int:
    """A job-wide counter of Ember's operators (Spark accumulator; 0 when unused)."""
    counter = job.compilation.counters.get(name)
    return int(counter.value) if counter is not None else 0


def _offset(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def _cause(exc: Any) -> str:
    text = str(getattr(exc, "desc", None) or exc)
    match = re.search(r"(UserFunctionError|EmberError|PipelineError): (.*)", text)
    if match:
        return match.group(2).strip()
    raised = re.findall(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$", text, flags=re.M)
    python = [(kind, msg) for kind, msg in raised if kind not in ("PythonException", "Py4JJavaError", "Py4JException")]
    if python:  # the Python error a Spark task or foreachBatch raised, not its Java wrappers
        kind, msg = python[-1]
        return f"{kind}: {msg.strip()}"
    lines = [line for line in text.splitlines() if line.strip()]
    return "\n".join(lines[:6])
