"""A keyed running count emitting one row per record, two versions of Ember side by side.

The job is ``ember bench peers``' per-record count: E2's generator (100 keys, event time) ->
``key_by("key").sum("n")`` (``emit="record"``) -> a counting sink. Each run executes it over
``--small`` and then ``--big`` events in one Spark session and reports the slope between them
(events/s without the session's and the job's start), verified: ``--big`` outputs whose sum is
the sum of every key's 1 + 2 + ... + count. Versions alternate A-B, B-A, ..., each run in a
fresh process with its source tree first on ``PYTHONPATH``:

    git worktree add /tmp/ember-old <commit>
    python benchmarks/rolling_per_record.py --a /tmp/ember-old/src --b src --rounds 2 --json

JSON: per version the median ``events_per_second`` and every run, and ``ratio_b_to_a``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

KEYS = 100


def _count(spark: Any, events: int) -> tuple[float, int, int]:
    from ember import CountSink, GroupingSource, StreamEnvironment

    ckpt = tempfile.mkdtemp(prefix="ember-rolling-")
    try:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=ckpt, spark=spark, max_events_per_batch=2_000_000)
        src = GroupingSource(partitions=2, hosts=KEYS, event_time=True, max_events=events, nominal_rate=100_000, start_ms=0)
        sink = CountSink(sum_field="n")
        rows = env.from_source(src, name="events").select("host_id AS key", "1 AS n", "ts", name="ones")
        rows.key_by("key").sum("n", name="running-count").sink_to(sink)
        started = time.time()
        env.execute("rolling-per-record", progress=False)
        return time.time() - started, sink.count, sink.total
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)


def one(small: int, big: int) -> dict[str, Any]:
    """This process's version: the slope between a ``small`` and a ``big`` run."""
    from ember.bench.harness import bench_session
    from ember.bench.peers.peer_events import running_count_checksum

    spark = bench_session("local[2]")
    try:
        _count(spark, 100_000)  # the first job's imports and JIT, not timed
        t_small, _, _ = _count(spark, small)
        t_big, outputs, total = _count(spark, big)
    finally:
        spark.stop()
    return {"events_per_second": round((big - small) / (t_big - t_small)), "seconds": [round(t_small, 2), round(t_big, 2)],
            "verified": (outputs, total) == running_count_checksum(big, KEYS)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", help="version A's source tree (e.g. a worktree's src)")
    parser.add_argument("--b", default="src", help="version B's source tree (default: src)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--small", type=int, default=1_000_000)
    parser.add_argument("--big", type=int, default=5_000_000)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.small, args.big)))
        return
    versions = {"a": args.a, "b": args.b} if args.a else {"b": args.b}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in versions}
    for r in range(args.rounds):
        for v in (list(versions) if r % 2 == 0 else list(reversed(versions))):
            env = {**os.environ, "PYTHONPATH": os.path.abspath(versions[v]), "PYSPARK_PYTHON": sys.executable}
            cmd = [sys.executable, __file__, "--one", "--small", str(args.small), "--big", str(args.big)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"version {v} ({versions[v]}) failed:\n{done.stderr[-3000:]}")
            out = json.loads(done.stdout.strip().splitlines()[-1])
            runs[v].append(out)
            print(f"{v}: {out['events_per_second']:,} events/s verified={out['verified']}", file=sys.stderr, flush=True)
    medians = {v: statistics.median(x["events_per_second"] for x in rs) for v, rs in runs.items()}
    report: dict[str, Any] = {"events": args.big, "keys": KEYS, "medians": medians, "runs": runs,
                              "verified": all(x["verified"] for rs in runs.values() for x in rs)}
    if "a" in medians:
        report["ratio_b_to_a"] = round(medians["b"] / medians["a"], 2)
    print(json.dumps(report, indent=2) if args.json else report)


if __name__ == "__main__":
    main()
