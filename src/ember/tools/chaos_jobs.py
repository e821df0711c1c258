"""The jobs ``ember chaos`` runs, configured through the environment of the child process.

``statemachine``: WORKLOADS.md E4 end to end — state-machine events read from
the Redis streams ``<prefix>:<p>``, keyed by address, the state machine with
managed keyed state, alerts written exactly once to PostgreSQL
(``EMBER_CHAOS_TABLE``) and to the Redis stream ``<prefix>:alerts``.

Variables: ``EMBER_CHAOS_PREFIX``, ``EMBER_CHAOS_PARTITIONS``,
``EMBER_CHAOS_TABLE``, ``EMBER_CHAOS_ALERTS`` (default ``<prefix>:alerts``) and
``EMBER_CHAOS_BATCH`` (records per micro-batch).

``pipeline``: three stateful steps chained in one query (issue 17) — the same
events, per-address dedupe, the state machine, then the alerts of every 1 s of
event time per state listed by a window (``AlertsInWindow``); the window rows go
to both sinks, so every alert is checked through all three steps.

``fanout``: a fan-out (issue 17) — the same events, per-address dedupe, read by two
state machines that run as two lanes of one Spark operator (docs/design/dataflow.md,
"Fan-out"); one lane's alerts go to PostgreSQL, the other's to the Redis stream, so each
lane's alerts are checked on their own.
"""

from __future__ import annotations

import os
from datetime import timedelta

from ember import DataStream, PostgresSink, RedisStreamSink, RedisStreamSource, StreamEnvironment, TumblingEventTimeWindows, WatermarkStrategy
from ember.bench.jobs import ALERT_SCHEMA, ALERT_WINDOW_SCHEMA, AlertsInWindow, Dedupe, StateMachine
from ember.tools.produce import STATEMACHINE_SCHEMA, stream_names

__all__ = ["statemachine", "pipeline", "fanout", "PIPELINE_WINDOW_MS", "PIPELINE_BOUND_MS"]

PIPELINE_WINDOW_MS = 1_000
# Two streams read side by side may drift apart a little: a bound keeps their alerts in time.
PIPELINE_BOUND_MS = 2_000


def _source() -> tuple[str, RedisStreamSource]:
    prefix = os.environ["EMBER_CHAOS_PREFIX"]
    partitions = int(os.environ.get("EMBER_CHAOS_PARTITIONS", "2"))
    source = RedisStreamSource(
        stream_names(prefix, partitions),
        STATEMACHINE_SCHEMA,
        max_events_per_batch=int(os.environ.get("EMBER_CHAOS_BATCH", "50000")),
    )
    return prefix, source


def _sinks(stream: DataStream, prefix: str) -> None:
    stream.sink_to(PostgresSink(os.environ.get("EMBER_CHAOS_TABLE", "ember_chaos_alerts")), name="alerts-postgres")
    stream.sink_to(RedisStreamSink(os.environ.get("EMBER_CHAOS_ALERTS", f"{prefix}:alerts")), name="alerts-redis")


def pipeline(env: StreamEnvironment) -> None:
    prefix, source = _source()
    watermark = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=PIPELINE_BOUND_MS), "ts")
    windows = (
        env.from_source(source, watermark, name="events")
        .key_by("address").process(Dedupe(), STATEMACHINE_SCHEMA, name="dedupe")
        .reinterpret_as_keyed("address").process(StateMachine(), ALERT_SCHEMA, name="state-machine")  # chained
        .key_by("state").window(TumblingEventTimeWindows.of(PIPELINE_WINDOW_MS))
        .aggregate(AlertsInWindow(), output_schema=ALERT_WINDOW_SCHEMA, name="alerts-per-second")
    )
    _sinks(windows, prefix)


def fanout(env: StreamEnvironment) -> None:
    prefix, source = _source()
    watermark = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=PIPELINE_BOUND_MS), "ts")
    deduped = (env.from_source(source, watermark, name="events")
               .key_by("address").process(Dedupe(), STATEMACHINE_SCHEMA, name="dedupe"))
    (deduped.key_by("address").process(StateMachine(), ALERT_SCHEMA, name="state-machine-a")
     .sink_to(PostgresSink(os.environ.get("EMBER_CHAOS_TABLE", "ember_chaos_alerts")), name="alerts-postgres"))
    (deduped.key_by("address").process(StateMachine(), ALERT_SCHEMA, name="state-machine-b")
     .sink_to(RedisStreamSink(os.environ.get("EMBER_CHAOS_ALERTS", f"{prefix}:alerts")), name="alerts-redis"))


def statemachine(env: StreamEnvironment) -> None:
    prefix, source = _source()
    alerts = (
        env.from_source(source, WatermarkStrategy.for_monotonous_timestamps("ts"), name="events")
        .key_by("address")
        .process(StateMachine(), ALERT_SCHEMA, name="state-machine")
    )
    _sinks(alerts, prefix)
