"""Small micro-batches read in the driver (Spark's simple reader) against read tasks.

E2's grouping job (``GroupingSource`` -> ``key_by(seq_id)`` -> counting sink) on Ember's Python
sequence source, bounded to ``--per-batch`` events per micro-batch (default 1,000 — where a
latency target's floor is measured), ``--events`` events in all, once with the generator read
in the driver (the default for batches of at most 20,000 events) and once in Python tasks
(``EMBER_SOURCE_READS=tasks``), alternating over ``--rounds`` on one session. Reported per
variant the median over rounds of each run's median batch time (Spark's ``triggerExecution``
and ``addBatch``, the first 5 batches left out) and ``driver_vs_tasks`` (the ratio of the
batch medians); every run verified (the sink counted every event once).

``--source redis``: the same job reading two Redis streams (``RedisStreamSource``, filled with
``--events`` entries before each run; ``EMBER_REDIS_URL``, default 127.0.0.1:6379) to their end.

    python benchmarks/in_driver_reads.py --rounds 4 --json
    python benchmarks/in_driver_reads.py --source redis --rounds 4 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

os.environ["PYSPARK_PYTHON"] = sys.executable


def _redis_streams(events: int) -> tuple[object, list[str]]:
    """Two fresh Redis streams holding ``events`` entries between them."""
    import uuid

    import redis

    from ember.connectors.external import redis_url

    client = redis.Redis.from_url(redis_url(None))
    streams = [f"ember-bench-in-driver:{uuid.uuid4().hex[:8]}:{i}" for i in range(2)]
    pipe = client.pipeline(transaction=False)
    for n in range(events):
        pipe.xadd(streams[n % 2], {"seq_id": n % 1_000})
        if n % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()
    return client, streams


def _run(spark, reads: str, per_batch: int, events: int, source: str = "generator") -> dict:
    from ember import CountSink, GroupingSource, RedisStreamSource, StreamEnvironment
    from ember.runner.spark.translators.sources import IN_DRIVER_SWITCH

    os.environ[IN_DRIVER_SWITCH] = reads  # read where the job compiles (translators/sources.py)
    client, streams = _redis_streams(events) if source == "redis" else (None, [])
    with tempfile.TemporaryDirectory(prefix="ember-in-driver-") as ckpt:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=ckpt, parallelism=2, spark=spark,
                                max_events_per_batch=per_batch)
        sink = CountSink()
        if source == "redis":
            records = env.from_source(RedisStreamSource(streams, "seq_id bigint", max_events_per_batch=per_batch,
                                                        stop_at_end=True), name="records")
        else:
            records = env.from_source(GroupingSource(partitions=2, max_events=events), name="records")
        records.key_by("seq_id").sink_to(sink)
        result = env.execute("in-driver-reads", progress=False)
    if client is not None:
        client.delete(*streams)
    steady = result.progress[5:]
    return {"reads": reads, "batch_ms": statistics.median(p["durationMs"]["triggerExecution"] for p in steady),
            "add_batch_ms": statistics.median(p["durationMs"].get("addBatch", 0) for p in steady),
            "batches": result.batches, "verified": sink.count == events == result.events}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-batch", type=int, default=1_000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--source", choices=("generator", "redis"), default="generator")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from ember import StreamEnvironment

    spark = StreamEnvironment(master="local[2]", parallelism=2).spark
    _run(spark, "auto", args.per_batch, 20 * args.per_batch, args.source)  # workers and code paths warm
    runs = []
    for r in range(args.rounds):
        for reads in ("auto", "tasks") if r % 2 == 0 else ("tasks", "auto"):
            runs.append(_run(spark, reads, args.per_batch, args.events, args.source))
            if not args.json:
                print(json.dumps(runs[-1]), flush=True)
    per = {}
    for reads, name in (("auto", "driver"), ("tasks", "tasks")):
        mine = [r for r in runs if r["reads"] == reads]
        per[name] = {"batch_ms": statistics.median(r["batch_ms"] for r in mine),
                     "add_batch_ms": statistics.median(r["add_batch_ms"] for r in mine),
                     "runs_batch_ms": [r["batch_ms"] for r in mine], "verified": all(r["verified"] for r in mine)}
    report = {"source": args.source, "per_batch": args.per_batch, "events": args.events, "rounds": args.rounds, **per,
              "driver_vs_tasks": round(per["driver"]["batch_ms"] / per["tasks"]["batch_ms"], 2),
              "verified": per["driver"]["verified"] and per["tasks"]["verified"]}
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0 if report["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
