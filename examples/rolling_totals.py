"""Rolling aggregations (Flink's KeyedStream.sum / max_by / reduce) on a scripted stream of
purchases: no window — every purchase updates its user's running figures, emitted at once.

- running total spent per user (``sum``), then per user the largest purchase so far
  (``max_by``), chained: two stateful steps in one Spark query;
- each purchase with its user's running total, with ``reduce``.

    python examples/rolling_totals.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile

from ember import CollectSink, ScriptedSource, StreamEnvironment, WatermarkStrategy

# (event time ms, user, amount), in three micro-batches.
BATCHES = [
    [(1_000, "ann", 30), (1_500, "bob", 5), (2_000, "ann", 12)],
    [(3_000, "bob", 40), (2_500, "ann", 7)],
    [(4_000, "ann", 50), (4_500, "bob", 1)],
]
SCHEMA = "ts bigint, user string, amount bigint"


def build_reduce(env: StreamEnvironment) -> CollectSink:
    """Each purchase with its user's running total (``reduce``: the latest record's
    fields, the amounts added)."""
    sink = CollectSink()
    (env.from_source(ScriptedSource(BATCHES, SCHEMA), WatermarkStrategy.for_monotonous_timestamps("ts"), name="purchases")
     .key_by("user").reduce(lambda acc, r: {**r, "amount": acc["amount"] + r["amount"]}, name="latest-with-total")
     .sink_to(sink))
    return sink


def run() -> dict[str, CollectSink]:
    root = tempfile.mkdtemp(prefix="ember-rolling-")
    try:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root + "/a", parallelism=2)
        totals = CollectSink()
        (env.from_source(ScriptedSource(BATCHES, SCHEMA), WatermarkStrategy.for_monotonous_timestamps("ts"),
                         name="purchases")
         .key_by("user").sum("amount", name="running-total")
         .key_by("user").max_by("amount", name="largest-total-so-far").sink_to(totals))
        env.execute("rolling-totals", progress=False)
        env2 = StreamEnvironment(master="local[2]", checkpoint_dir=root + "/b", parallelism=2, spark=env.spark)
        with_total = build_reduce(env2)
        env2.execute("rolling-count", progress=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"largest_total": totals, "with_total": with_total}


def main() -> int:
    sinks = run()
    print("running total per user, kept when it is the largest so far (sum -> max_by):")
    for b in sinks["largest_total"].batches:
        for r in b.rows:
            print(f"  batch {b.batch_id}: {r['user']:3} total={r['amount']}")
    print("each purchase (its time) with the running total (reduce):")
    for b in sinks["with_total"].batches:
        for r in sorted(b.rows, key=lambda r: r["ts"]):
            print(f"  batch {b.batch_id}: {r['user']:3} at {r['ts']} total={r['amount']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
