"""Where a chain of keyed steps spends its time (issue 17, docs/design/dataflow.md).

Runs prefixes of ``ember bench pipeline``'s job (E4 events -> dedupe -> state machine
-> 1 s window of alerts) as separate queries in one process and prints Spark's
``addBatch`` milliseconds of every batch that took input, and with ``--operators``
one keyed step (the state machine) on ``applyInPandasWithState`` and on
``transformWithStateInPandas``. A fan-out (the dedupe read by several steps, run as lanes of
one operator) is ``fanout:`` and its readers — ``sm`` (a state machine), ``raw`` (a sink of the
deduplicated events):

    python benchmarks/chain_cost.py dedupe sm dedupe+sm+window --operators
    python benchmarks/chain_cost.py dedupe+sm fanout:sm,sm fanout:sm,raw
"""

from __future__ import annotations

import argparse
import json
import tempfile

from ember import TumblingEventTimeWindows, WatermarkStrategy
from ember.api.environment import StreamEnvironment
from ember.bench.harness import bench_session
from ember.bench.jobs import ALERT_SCHEMA, ALERT_WINDOW_SCHEMA, AlertsInWindow, Dedupe, StateMachine
from ember.connectors.generators import StateMachineSource
from ember.connectors.sinks import NoopSink

PER_BATCH = 2_000_000


class DedupeThenStateMachine(StateMachine):
    """``Dedupe`` and ``StateMachine`` written as one function, both states on one key."""

    def open(self, ctx):
        super().open(ctx)
        self.dedupe = Dedupe()
        self.dedupe.open(ctx)

    def process_element(self, event, ctx):
        for kept in self.dedupe.process_element(event, ctx):
            yield from super().process_element(kept, ctx)


def run(spark, variant: str, operator: str, duration: float) -> dict:
    env = StreamEnvironment(checkpoint_dir=tempfile.mkdtemp(prefix="ember-chain-"), spark=spark,
                            max_events_per_batch=PER_BATCH, keyed_operator=operator)
    src = StateMachineSource(rate=None, partitions=2, invalid_rate=0.0005, nominal_rate=PER_BATCH // 2)
    stream = env.from_source(src, WatermarkStrategy.for_monotonous_timestamps("ts"), name="events")
    if variant.startswith("fanout:"):
        deduped = stream.key_by("address").process(Dedupe(), src.schema_ddl, name="dedupe")
        for i, reader in enumerate(variant.split(":", 1)[1].split(",")):
            if reader == "sm":
                deduped.key_by("address").process(StateMachine(), ALERT_SCHEMA, name=f"state-machine-{i}").sink_to(
                    NoopSink(), name=f"alerts-{i}")
            else:
                deduped.sink_to(NoopSink(), name=f"raw-{i}")
        return _measured(env, variant, operator, duration)
    steps = variant.split("+")
    if "dedupe" in steps:
        stream = stream.key_by("address").process(Dedupe(), src.schema_ddl, name="dedupe")
    if "both" in steps:  # dedupe and state machine by hand in one function: what fusing them could reach
        stream = stream.key_by("address").process(DedupeThenStateMachine(), ALERT_SCHEMA, name="both")
    if "chained-sm" in steps:  # the state machine chained to the dedupe (reinterpret_as_keyed)
        stream = stream.reinterpret_as_keyed("address").process(StateMachine(), ALERT_SCHEMA, name="state-machine")
    if "sm" in steps:
        stream = stream.key_by("address").process(StateMachine(), ALERT_SCHEMA, name="state-machine")
    if "window" in steps:
        stream = stream.key_by("state").window(TumblingEventTimeWindows.of(1000)).aggregate(
            AlertsInWindow(), output_schema=ALERT_WINDOW_SCHEMA, name="alerts-per-second")
    stream.sink_to(NoopSink())
    return _measured(env, variant, operator, duration)


def _measured(env: StreamEnvironment, variant: str, operator: str, duration: float) -> dict:
    result = env.execute("chain-cost", duration_s=duration, progress=False, min_batches=4)
    batches = [p["durationMs"].get("addBatch") for p in result.progress if p.get("numInputRows")]
    ordered = sorted(batches[1:])  # the first batch pays for starting the Python workers
    median = ordered[len(ordered) // 2] if ordered else None
    return {"variant": variant, "keyed_operator": operator, "add_batch_ms": batches, "median_ms": median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="*", default=["dedupe", "sm", "dedupe+sm+window"])
    parser.add_argument("--operators", action="store_true", help="also one step on APWS and on TWS")
    parser.add_argument("--duration", type=float, default=25.0)
    args = parser.parse_args()
    spark = bench_session("local[*]")
    runs = [(v, "transform_with_state") for v in args.variants]
    if args.operators:
        runs += [("sm", "auto"), ("sm", "transform_with_state")]
    for variant, operator in runs:
        print(json.dumps(run(spark, variant, operator, args.duration)), flush=True)


if __name__ == "__main__":
    main()
