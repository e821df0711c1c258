"""The per-batch floor of a keyed step of few keys, end to end on Spark.

A job of three keys: scripted micro-batches of a few out-of-order records each
(tests/flink_model.py's random stream, repeated ``--reps`` times later in event time) ->
``key_by`` -> a tumbling 4 s event-time window with a Python aggregate (Ember's window
operator, firing in the batch) -> ``CollectSink``. Prints the medians of Spark's progress
reports after the first two batches: ``addBatch`` and the whole batch (``triggerExecution``).
With ``--concurrent 2`` two such jobs run at once in two processes (as ``make test`` runs two
test files at a time on two cores) and each reports its own medians. To compare two versions,
run it with each on ``PYTHONPATH``, alternating::

    PYTHONPATH=src python benchmarks/few_keys.py --concurrent 2 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def run_job(reps: int) -> dict[str, Any]:
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import flink_model as model

    from ember import AggregateFunction, CollectSink, ScriptedSource, StreamEnvironment, TumblingEventTimeWindows, WatermarkStrategy

    class CountSum(AggregateFunction):
        def create_accumulator(self) -> Any:
            return (0, 0)

        def add(self, value: Any, acc: Any) -> Any:
            return (acc[0] + 1, acc[1] + value["v"])

        def merge(self, a: Any, b: Any) -> Any:
            return (a[0] + b[0], a[1] + b[1])

        def get_result(self, acc: Any) -> Any:
            return {"n": acc[0], "total": acc[1]}

    base = model.random_batches(3)
    batches = [[(r[0] + i * 100_000, *r[1:]) for r in b] for i in range(reps) for b in base]
    env = StreamEnvironment(master="local[2]", checkpoint_dir=tempfile.mkdtemp(prefix="few-keys-"), parallelism=2)
    src = env.from_source(ScriptedSource(batches, "ts bigint, k string, v int"),
                          WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts"), name="events")
    sink = CollectSink()
    (src.key_by("k").window(TumblingEventTimeWindows.of(4_000))
     .aggregate(CountSum(), output_schema="n bigint, total bigint", name="w").sink_to(sink))
    started = time.perf_counter()
    result = env.execute("few-keys", progress=False)
    steady = result.progress[2:]
    return {
        "batches": len(batches),
        "windows": sum(len(b.rows) for b in sink.batches),
        "seconds": round(time.perf_counter() - started, 1),
        "add_batch_ms": statistics.median(p["durationMs"].get("addBatch", 0) for p in steady),
        "batch_ms": statistics.median(p["durationMs"].get("triggerExecution", 0) for p in steady),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="the 9-batch random stream, repeated (default 3: 27 batches)")
    parser.add_argument("--concurrent", type=int, default=1, help="jobs run at once, each in its own process")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    if args.child or args.concurrent == 1:
        runs = [run_job(args.reps)]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--reps", str(args.reps), "--json", "--child"]
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                 for _ in range(args.concurrent)]
        runs = [json.loads(p.communicate()[0].strip().splitlines()[-1])["runs"][0] for p in procs]
    out = {"runs": runs, "add_batch_ms": statistics.median(r["add_batch_ms"] for r in runs),
           "batch_ms": statistics.median(r["batch_ms"] for r in runs)}
    if args.json:
        print(json.dumps(out))
    else:
        for r in runs:
            print(f"{r['batches']} batches, {r['windows']} windows: addBatch median {r['add_batch_ms']} ms, "
                  f"batch median {r['batch_ms']} ms ({r['seconds']} s)")


if __name__ == "__main__":
    main()
