"""The state-machine job of WORKLOADS.md E4 with managed keyed state.

Events ``(address, type)`` come from Ember's replayable generator, which
injects invalid events at a known rate. The job keys by address, drops re-sent
events (``Dedupe``: the last timestamp per address in a ``ValueState`` with a
TTL), keeps each address's state in a ``ValueState`` and emits an alert for
every invalid transition; the alerts must equal the injected events exactly.

Both steps are keyed by the address, so the state machine reads the dedupe's
output through ``reinterpret_as_keyed("address")``: the two run chained in one
operator, each record handed from one to the other in Python, no shuffle
between them (Flink's operator chaining; ``--no-chain`` re-keys with
``key_by`` instead, ~1.6x slower in ``ember bench pipeline``).

    python examples/state_machine.py [--events 2000000]
    ember run examples/state_machine.py:build
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile

from ember import CollectSink, StreamEnvironment, WatermarkStrategy
from ember.bench.jobs import ALERT_SCHEMA, Dedupe, StateMachine  # KeyedProcessFunctions, state in ValueStates
from ember.connectors.generators import StateMachineSource


def build(env: StreamEnvironment, source: StateMachineSource | None = None, sink=None, chain: bool = True) -> CollectSink:
    source = source or StateMachineSource(rate=100_000, partitions=2)
    sink = sink or CollectSink()
    deduped = (
        env.from_source(source, WatermarkStrategy.for_monotonous_timestamps("ts"), name="events")
        .key_by("address")
        .process(Dedupe(), source.schema_ddl, name="dedupe")
    )
    keyed = deduped.reinterpret_as_keyed("address") if chain else deduped.key_by("address")
    keyed.process(StateMachine(), ALERT_SCHEMA, name="state-machine").sink_to(sink, name="alerts")
    return sink


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--no-chain", action="store_true", help="key_by between the steps instead of chaining them")
    args = parser.parse_args(argv)
    checkpoint = tempfile.mkdtemp(prefix="ember-statemachine-")
    try:
        env = StreamEnvironment(master=args.master, checkpoint_dir=checkpoint, max_events_per_batch=500_000)
        source = StateMachineSource(partitions=2, max_events=args.events, invalid_rate=0.0005)
        sink = build(env, source, chain=not args.no_chain)
        result = env.execute("state-machine")
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    got = sorted((r["address"], r["state"], r["type"]) for r in sink.rows())
    expected = source.expected_alerts(result.events)
    print(result.summary())
    print(f"alerts: {len(got)} emitted, {len(expected)} injected; "
          + ("EXACT" if got == expected else f"MISMATCH ({len(set(got) - set(expected))} false, {len(set(expected) - set(got))} missed)"))
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
