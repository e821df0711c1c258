"""Running a compiled job: start the query, follow its progress, stop it on time.

A job stops when the user interrupts it or when one of its stop conditions
(stopping.py) says so: every (bounded) source has ended and the last windows
were flushed, a duration has passed, a number of events was processed, no input
arrived for a while, or a savepoint asked for a stop. Stopping waits for the
batch in flight (docs/design/core.md, "Stopping").
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import sys
from typing import Any, Callable

from ember.errors import ConfigError, EmberError, JobFailedError, LatencyTargetError, PipelineError, RestartError
from ember.graph.graph import STATEFUL, Graph
from ember.graph.nodes import SqlNode
from ember.job import DEFAULT_MAX_PARALLELISM, EnvironmentConfig, JobResult, RunListener, default_max_parallelism
from ember.runner.spark.checkpoint import (
    CheckpointLayout,
    clear_done_marks,
    fixed_origin,
    last_committed_batch,
    planned_batch,
    write_json,
)
from ember.runner.spark.compiler import compile_graph
from ember.runner.spark.conversion import map_start_offsets
from ember.runner.spark.latency import BELOW_FLOOR, BoundController
from ember.runner.spark.leader import STOOD_DOWN, LeaderLock
from ember.runner.spark.placement import runtime_steps
from ember.runner.spark.progress import ProgressFollower
from ember.runner.spark.restart import check_restart, continued_manifest, stored_max_parallelism
from ember.runner.spark.session import configure_for_query, lateness_setting, query_settings, session_settings, warm_up
from ember.runner.spark.stopping import (
    SAVEPOINT_STOP,
    Duration,
    EndOfInput,
    Idle,
    MaxEvents,
    RunView,
    StopCondition,
    StopRequested,
)
from ember.time.clock import Clock

__all__ = ["run_job", "source_origins", "settle_output", "leadership", "stood_down", "Leadership"]

POLL_S = 0.1


def source_origins(checkpoint: str, graph: Graph) -> dict[str, int]:
    """Each generator source's event-time origin (epoch ms), as fixed in the checkpoint."""
    layout = CheckpointLayout(checkpoint)
    out = {}
    for node in graph.sources:
        fixed = getattr(node.source, "start_ms", None)
        path = layout.origin(node.name)
        if fixed is not None:
            out[node.name] = int(fixed)
        elif os.path.exists(path):
            out[node.name] = fixed_origin(path)
    return out


def with_max_parallelism(spark: Any, config: EnvironmentConfig, checkpoint: str) -> EnvironmentConfig:
    """``config`` with the state buckets this run uses: the ones given; else, as in Flink, the
    count the checkpoint's keyed steps hold (a restored savepoint's included), or for a new job
    :func:`~ember.job.default_max_parallelism` of its state partitions."""
    if config.max_parallelism_given:
        return config
    kept = continued_manifest(checkpoint)
    if kept is None:
        count = default_max_parallelism(int(spark.conf.get("spark.sql.shuffle.partitions")))
    else:  # a manifest without a keyed step records no count: the job has no keyed state to spread
        count = stored_max_parallelism(kept) or DEFAULT_MAX_PARALLELISM
    return dataclasses.replace(config, max_parallelism=count)


def _check_partitions(spark: Any, graph: Graph, config: EnvironmentConfig, layout: CheckpointLayout) -> None:
    """A new job with keyed steps on Ember's runtime may not have more state partitions than
    state buckets (``max_parallelism``): the partitions past them would hold no state. (A
    checkpoint with progress keeps the partitions of its first run, which passed this.)"""
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    if partitions > config.max_parallelism and not layout.has_progress() and runtime_steps(graph):
        raise ConfigError(
            f"the job would run {partitions} state partitions (parallelism) over max_parallelism="
            f"{config.max_parallelism} state buckets: give parallelism <= {config.max_parallelism} or a larger max_parallelism"
        )


def _converted_start(job: Any, layout: CheckpointLayout) -> None:
    """A checkpoint converted from a savepoint (runner/spark/conversion.py), before its first
    micro-batch: every keyed step's state file must have been handed to the step (else its
    state would be lost: refused, naming the files), and each source is told where the
    savepoint left it. Once that batch committed, the conversion's files go."""
    folder = layout.initial_states
    if not layout.converting():
        for leftover in (folder, layout.start_offsets):
            if os.path.isdir(leftover):
                shutil.rmtree(leftover, ignore_errors=True)
            elif os.path.exists(leftover):
                os.remove(leftover)
        return
    handed = {os.path.abspath(p) for p in job.compilation.initial_states}
    left = sorted(f for f in (os.listdir(folder) if os.path.isdir(folder) else ())
                  if os.path.abspath(os.path.join(folder, f)) not in handed)
    if left:
        raise RestartError(
            f"the converted checkpoint {layout.path} holds state for {', '.join(left)}, which no keyed step of this "
            "pipeline takes in (a step renamed, or one that cannot be handed state): it would be lost, so the job "
            "does not start")
    map_start_offsets(job.df, layout.path)


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
    min_batches: int = 0,
    listener: RunListener | None = None,
) -> JobResult:
    """Compile ``graph`` and run it as one streaming query on ``checkpoint`` until a
    stop condition holds; the checkpoint may hold a restored savepoint (savepoints/).
    ``listener`` (the dashboard) hears of the start, every batch and the end; with one,
    every step counts its output rows (docs/dashboard.md). The caller holds the
    checkpoint's leader lock (:func:`leadership`)."""
    configure_for_query(spark, config)
    config = with_max_parallelism(spark, config, checkpoint)
    layout = CheckpointLayout(checkpoint)
    bounded_sources = [n for n in graph.sources if n.source.bounded]
    bounded = bool(bounded_sources) and len(bounded_sources) == len(graph.sources)
    os.makedirs(layout.ember_dir, exist_ok=True)
    for left in (layout.stop_marker, layout.stop_request):
        if os.path.exists(left):
            os.remove(left)  # left by a run that did not finish stopping
    clear_done_marks(layout.end_of_input)  # this run's sources mark themselves when they reach their end
    _check_partitions(spark, graph, config, layout)
    check_restart(checkpoint, graph, config.keyed_operator, config.state_layout, config.state_backend, config.max_parallelism)
    job = compile_graph(
        graph, spark, config, job_name=name, checkpoint=checkpoint,
        end_of_input_marker=layout.end_of_input if bounded else None,
        stop_marker=layout.stop_marker, count_rows=listener is not None,
    )
    if listener is not None:
        job.on_branch_counts = listener.branch_counts
    write_json(layout.operators, {"key_types": job.compilation.key_types, "spark_operators": job.compilation.sql_operators})
    job.prepare_sinks()
    _converted_start(job, layout)
    writer = (
        job.writer()
        .outputMode(job.output_mode)
        .option("checkpointLocation", checkpoint)
        .queryName(f"{name}-{os.getpid()}-{id(job)}")
        .trigger(processingTime=f"{config.trigger_interval_ms} milliseconds")
    )
    # Spark's own count of late rows is the job's where Ember does not count them itself
    # (translators/windows.py); it counts aggregated rows, not records.
    follower = ProgressFollower(progress, name, clock, spark_late_rows=job.compilation.plan.spark_counts_late_rows,
                                listener=listener)
    follower.counted_late = lambda: _counted(job, "late_dropped")
    follower.metric_readers = job.metric_readers()
    start = clock.monotonic()
    conditions: list[StopCondition] = []
    if idle_s is not None:
        conditions.append(Idle(idle_s, start))
    if duration_s is not None:
        conditions.append(Duration(duration_s, min_batches))
    if max_events is not None:
        conditions.append(MaxEvents(max_events))
    conditions.append(StopRequested(layout.stop_request))
    knob = None
    if config.latency_target_ms is not None:  # Ember's buffer timeout: the per-batch bound adapts (latency.py)
        knob = BoundController(config.latency_target_ms, config.max_events_per_batch, layout.batch_bound)
        conditions.append(knob)
    if bounded:
        idle_limit = max(10.0, 10 * config.trigger_interval_ms / 1000)
        conditions.append(EndOfInput(len(bounded_sources), layout.end_of_input,
                                     job.compilation.uses_end_of_input, idle_limit, start, replayed=planned_batch(checkpoint),
                                     checkpoint=checkpoint))
    committed_before = last_committed_batch(checkpoint)
    write_json(layout.running, {"pid": os.getpid(), "host": socket.gethostname(), "job": name})

    def start_query() -> Any:
        plan = job.compilation.plan
        with lateness_setting(spark, plan.late_rows_against_current_watermark, plan.sql_beside_steps):
            return writer.start()

    with session_settings(spark, query_settings(checkpoint, dict(config.spark_conf), spark)):  # until the query stopped
        try:
            query = start_query()
        except BaseException as failure:
            os.remove(layout.running)
            refused = _refused_output_mode(failure, job.compilation.graph)
            if listener is not None:
                listener.job_ended("failed to start", str(refused or failure).strip().splitlines()[0])
            if refused is not None:
                raise refused from None
            raise
        if listener is not None:
            listener.job_started({
                "job": name, "checkpoint": checkpoint, "max_events_per_batch": config.max_events_per_batch,
                "trigger_interval_ms": config.trigger_interval_ms, "spark_ui": spark.sparkContext.uiWebUrl,
                "master": config.master, "stateful_steps": [n.name for n in graph.nodes if isinstance(n, STATEFUL)],
            })
        reason = "running"
        try:
            reason = _follow(query, follower, conditions, clock, start)
        except KeyboardInterrupt:
            reason = "interrupted"
        finally:
            try:
                _stop_gracefully(query, layout.stop_marker, follower, clock, checkpoint, bool(job.compilation.unstoppable))
                if reason == SAVEPOINT_STOP and query.exception() is None:
                    query = _finish_planned_batch(start_query, query, layout.stop_marker, follower, clock, checkpoint)
            finally:
                follower.poll(query)
                for done in (layout.stop_marker, layout.stop_request, layout.running):
                    if os.path.exists(done):
                        os.remove(done)
    settle_output(follower, [s.sink for s in job.sinks], checkpoint, committed_before)
    exc = query.exception()
    cause = None if exc is None else _cause(exc) + _output_schema_hint(str(getattr(exc, "desc", None) or exc), graph)
    if listener is not None:
        listener.job_ended(reason, cause)
    if exc is not None:
        raise JobFailedError(f"job '{name}' failed: {cause}") from None
    if knob is not None and reason == BELOW_FLOOR:
        raise LatencyTargetError(f"job '{name}': {knob.floor_message()}")
    return JobResult(
        name=name,
        checkpoint_dir=checkpoint,
        batches=len(follower.progress) + len(follower.unreported),
        events=follower.events,
        seconds=clock.monotonic() - start,
        processing_seconds=follower.processing_ms / 1000,
        progress=follower.progress,
        stopped_because=reason,
        late_dropped=follower.late_dropped + follower.counted_late(),
        start_ms=source_origins(checkpoint, graph),
        counters={name: int(c.value) for name, c in job.compilation.counters.items()},
        unreported_batches=sorted(follower.unreported),
        batch_bounds=knob.history if knob is not None else [],
    )


class Leadership:
    """``with leadership(...) as lead``: ``lead.leads`` — this process runs the job (else a
    standby stood down); set ``lead.ended`` to the reason the job ended by itself."""

    def __init__(self, lock: LeaderLock, leads: bool) -> None:
        self.lock, self.leads, self.ended = lock, leads, "failed"

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.leads:
            self.lock.release(self.ended if exc[0] is None else "failed")


def leadership(spark: Any, checkpoint: str, name: str, standby: bool) -> Leadership:
    """Take the checkpoint's leader lock (leader.py): at once, or — ``standby`` — after
    warming this driver up and waiting for the running one to die."""
    lock = LeaderLock(CheckpointLayout(checkpoint).leader_lock, name)
    return Leadership(lock, lock.acquire(standby, keep_warm=lambda: warm_up(spark)))


def stood_down(name: str, checkpoint: str) -> JobResult:
    """The result of a standby whose job ended by itself."""
    return JobResult(name=name, checkpoint_dir=checkpoint, batches=0, events=0, seconds=0.0, processing_seconds=0.0,
                     progress=[], stopped_because=STOOD_DOWN)


def settle_output(follower: ProgressFollower, sinks: list[Any], checkpoint: str, committed_before: int) -> None:
    """After the query stopped: driver-side sinks keep exactly the committed batches — not
    a batch stopped after its sink ran but before Spark committed it (it is replayed on
    restart). A batch committed but stopped before Spark reported its progress is the job's
    output all the same (the next run starts after it): kept, and its events counted from
    the offset log (``ProgressFollower.account_unreported``)."""
    committed = last_committed_batch(checkpoint)
    follower.account_unreported(checkpoint, committed_before, committed)
    if follower.unreported and follower.metric_readers:  # its rows were counted in the report Spark never made
        print(f"[ember] {follower.name}: batch(es) {', '.join(map(str, sorted(follower.unreported)))} committed without a "
              "progress report: the counting sink does not hold their rows", file=sys.stderr, flush=True)
    for sink in sinks:
        sink.forget_after(committed)


def _refused_output_mode(exc: BaseException, graph: Graph) -> PipelineError | None:
    """Spark's refusal, at start, of a SQL step's aggregation that cannot emit in append mode
    (no window, or no watermark), as an error naming the SQL step(s)."""
    if "STREAMING_OUTPUT_MODE" not in str(exc):
        return None
    steps = [node.name for node in graph.nodes if isinstance(node, SqlNode)]
    if not steps:
        return None
    first = str(exc).strip().splitlines()[0]
    return PipelineError(
        f"Spark refused the job: {first} — an aggregation in SQL must group by a window over the view's "
        "rowtime (e.g. GROUP BY k, window(rowtime, '10 seconds')) so it can emit each window once it closes",
        steps[0] if len(steps) == 1 else ", ".join(steps),
    )


def _follow(query: Any, follower: ProgressFollower, conditions: list[StopCondition], clock: Clock, start: float) -> str:
    """Poll the query until it ends or a condition gives a reason to stop; the reason."""
    while query.isActive:
        new = follower.poll(query)
        view = RunView(now=clock.monotonic(), started=start, follower=follower, query=query, new_batch=new)
        for condition in conditions:
            reason = condition.check(view)
            if reason is not None:
                return reason
        clock.sleep(POLL_S)
    return "running"


def _stop_gracefully(query: Any, stop_marker: str, follower: ProgressFollower, clock: Clock, checkpoint: str,
                     unstoppable: bool = False) -> None:
    """Stop between micro-batches rather than interrupting one.

    Ember's sources stop admitting input once the stop marker exists; the
    runner then waits for the batch in flight — until every batch in the
    offset log is in the commit log and no trigger runs (bounded by a few batch
    durations) — and stops the idle query. Interrupting a batch is safe for
    exactly-once (it is replayed on restart) but makes Spark log errors, and a
    savepoint wants a clean cut.

    A query whose stateful step has processing-time timeouts is never idle either: Spark
    runs no-data batches back to back for the timeouts. Once one batch after the stop
    (necessarily without input) has committed, the runner stops between two of them —
    before, a bounded job without event time lingered for the whole grace (up to 30 s).

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
        in_flight = planned_batch(checkpoint)
        # Batches Spark runs after the stop marker hold no input; a query whose stateful step
        # has processing-time timeouts runs them back to back (Spark's no-data batches) and is
        # never idle: once one of them committed, the query stops between two of them.
        quiet_after = max(last_committed_batch(checkpoint), -1 if in_flight is None else in_flight)
        idle_polls = 0
        while clock.monotonic() < deadline and query.isActive and idle_polls < 3:
            planned = planned_batch(checkpoint)
            clean = not query.status["isTriggerActive"] and planned is None
            if unstoppable and (clean or in_flight is None or last_committed_batch(checkpoint) >= in_flight):
                break
            if planned is None and last_committed_batch(checkpoint) > quiet_after:
                break
            idle_polls = idle_polls + 1 if clean else 0
            clock.sleep(0.01)
        if unstoppable:  # its commit is in: let Spark report the batch (after its commit) before stopping
            committed = last_committed_batch(checkpoint)
            reported_by = clock.monotonic() + 2.0
            while query.isActive and clock.monotonic() < reported_by:
                last = query._jsq.lastProgress()
                if committed < 0 or (last is not None and int(last.batchId()) >= committed):
                    break
                clock.sleep(0.01)
    query.stop()


def _finish_planned_batch(start: Callable[[], Any], query: Any, stop_marker: str, follower: ProgressFollower, clock: Clock,
                          checkpoint: str) -> Any:
    """After a stop for a savepoint: if a planned batch was interrupted, run the query
    once more (the stop marker admits no new input, so Spark only replays that batch
    from its logged offsets) so the savepoint's cut leaves nothing half-written."""
    for _ in range(2):
        if planned_batch(checkpoint) is None:
            break
        query = start()
        deadline = clock.monotonic() + 120
        while clock.monotonic() < deadline and query.isActive and planned_batch(checkpoint) is not None:
            follower.poll(query)
            clock.sleep(POLL_S)
        _stop_gracefully(query, stop_marker, follower, clock, checkpoint)
    return query


def _counted(job: Any, name: str) -> int:
    """A job-wide counter of Ember's operators (Spark accumulator; 0 when unused)."""
    counter = job.compilation.counters.get(name)
    return int(counter.value) if counter is not None else 0


def _output_schema_hint(text: str, graph: Graph) -> str:
    """For a failure converting a Python step's output to Arrow (a value that does not fit its
    ``output_schema``): the steps whose declared output has that field, which Spark's message
    does not name."""
    match = re.search(r"Failed to convert the value of the column '([^']+)' with type '[^']*' to Arrow type '([^']+)'", text)
    if match is None:
        return ""
    from ember.runner.spark.translators.python_ops import output_struct

    column, steps = match.group(1), []
    for node in graph.nodes:
        schema = getattr(node, "output_schema", None)
        try:
            declared = output_struct(schema, None, node.name) if schema is not None else None
        except EmberError:
            continue
        if declared is not None and column in declared.names:
            steps.append(f"'{node.name}' ({declared[column].dataType.simpleString()})")
    if not steps:
        return ""
    return (f" — a Python step emitted a value of '{column}' that is not {match.group(2)}: check the records these steps "
            f"emit against their output_schema: {', '.join(steps)}")


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
