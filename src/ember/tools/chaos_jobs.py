"""The jobs ``ember chaos`` runs, configured through the environment of the child process.

``statemachine``: WORKLOADS.md E4 end to end — state-machine events read from
the Redis streams ``<prefix>:<p>``, keyed by address, the state machine with
managed keyed state, alerts written exactly once to PostgreSQL
(``EMBER_CHAOS_TABLE``) and to the Redis stream ``<prefix>:alerts``.

Variables: ``EMBER_CHAOS_PREFIX``, ``EMBER_CHAOS_PARTITIONS``,
``EMBER_CHAOS_TABLE``, ``EMBER_CHAOS_ALERTS`` (default ``<prefix>:alerts``) and
``EMBER_CHAOS_BATCH`` (records per micro-batch).
"""

from __future__ import annotations

import os

from ember import PostgresSink, RedisStreamSink, RedisStreamSource, StreamEnvironment, WatermarkStrategy
from ember.bench.jobs import ALERT_SCHEMA, StateMachine
from ember.tools.produce import STATEMACHINE_SCHEMA, stream_names

__all__ = ["statemachine"]


def statemachine(env: StreamEnvironment) -> None:
    prefix = os.environ["EMBER_CHAOS_PREFIX"]
    partitions = int(os.environ.get("EMBER_CHAOS_PARTITIONS", "2"))
    source = RedisStreamSource(
        stream_names(prefix, partitions),
        STATEMACHINE_SCHEMA,
        max_events_per_batch=int(os.environ.get("EMBER_CHAOS_BATCH", "50000")),
    )
    alerts = (
        env.from_source(source, WatermarkStrategy.for_monotonous_timestamps("ts"), name="events")
        .key_by("address")
        .process(StateMachine(), ALERT_SCHEMA, name="state-machine")
    )
    alerts.sink_to(PostgresSink(os.environ.get("EMBER_CHAOS_TABLE", "ember_chaos_alerts")), name="alerts-postgres")
    alerts.sink_to(RedisStreamSink(os.environ.get("EMBER_CHAOS_ALERTS", f"{prefix}:alerts")), name="alerts-redis")
