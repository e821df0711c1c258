"""What the full garbage collection PySpark's reused workers run after every task costs, and
what Ember's young collections (ember.runner.spark.worker_gc) save.

Runs ``--jobs`` small bounded jobs per process — a dedupe (a process function) feeding a 2 s
event-time window with a Python aggregate feeding a process function that reports each
window: three keyed steps on Ember's runtime, 10 scripted micro-batches of a few records —
once with PySpark's collections (``EMBER_WORKER_GC=full``) and once with Ember's, alternating
over ``--rounds``. ``--concurrent N`` runs N such processes at once (two: a 2-core machine
shared by two jobs, as ``make test``'s two workers share it); the measure is the wall time
until all of them finished. Reports per variant the median seconds per round and per job,
the ratio (PySpark's / Ember's), and whether every job's output was the expected one;
``--json`` prints one JSON object.

    python benchmarks/worker_gc.py --jobs 3 --rounds 3 --concurrent 2 --json
    python benchmarks/worker_gc.py --jobs 3 --rounds 3 --concurrent 1 --json
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

from ember.runner.spark.worker_gc import KEEP_FULL

VARIANTS = {"pyspark-full": "full", "ember-young": "young"}
BATCHES = [[(1_000 + 700 * b + 90 * i, "abcd"[(b + i) % 4], (b * 7 + i) % 5) for i in range(6)] for b in range(10)]


def _child(jobs: int) -> None:
    """Run ``jobs`` jobs on one session; print one JSON line per job."""
    from datetime import timedelta

    from ember import (
        CollectSink,
        KeyedProcessFunction,
        ScriptedSource,
        StreamEnvironment,
        TumblingEventTimeWindows,
        WatermarkStrategy,
    )
    from ember.bench.jobs import CountAggregate
    from ember.state import ValueStateDescriptor

    class Dedupe(KeyedProcessFunction):
        def open(self, ctx):
            self.seen = ctx.get_state(ValueStateDescriptor("seen"))

        def process_element(self, value, ctx):
            if self.seen.value() is None:
                self.seen.update(True)
                yield value

    class Report(KeyedProcessFunction):
        def process_element(self, value, ctx):
            yield {"k": value["k"], "end": value["window_end"], "n": value["n"]}

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = StreamEnvironment(master="local[2]", parallelism=2).spark
    distinct = sorted({r for b in BATCHES for r in b})
    expected = {}
    for ts, k, _ in distinct:
        end = ts - ts % 2_000 + 2_000
        expected[(k, end)] = expected.get((k, end), 0) + 1
    for _ in range(jobs):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tempfile.mkdtemp(), parallelism=2, spark=spark)
        sink = CollectSink()
        src = env.from_source(ScriptedSource(BATCHES, "ts bigint, k string, v int"),
                              WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=500), "ts"), name="events")
        (src.key_by("k", "ts", "v").process(Dedupe(), "ts bigint, k string, v int", name="dedupe")
            .key_by("k").window(TumblingEventTimeWindows.of(2_000)).aggregate(CountAggregate(), output_schema="n bigint", name="count")
            .key_by("k").process(Report(), "k string, end bigint, n bigint", name="report").sink_to(sink))
        start = time.perf_counter()
        result = env.execute("worker-gc", progress=False)
        seconds = time.perf_counter() - start
        got = {(r["k"], r["end"]): r["n"] for r in sink.rows()}
        print(json.dumps({"seconds": seconds, "batches": result.batches, "verified": got == expected}), flush=True)


def _round(mode: str, jobs: int, concurrent: int) -> tuple[float, list[dict]]:
    """Wall seconds until ``concurrent`` processes of ``jobs`` jobs each finished, and their jobs."""
    env = {**os.environ, KEEP_FULL: mode}
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, __file__, "--child", "--jobs", str(jobs)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(concurrent)]
    outs = [p.communicate()[0] for p in procs]
    wall = time.perf_counter() - start
    if any(p.returncode for p in procs):
        raise SystemExit(f"a child process failed ({mode})")
    return wall, [json.loads(line) for out in outs for line in out.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3, help="jobs per process")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per variant, alternating")
    parser.add_argument("--concurrent", type=int, default=2, help="processes running at once in a round")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.jobs)
        return
    if min(args.jobs, args.rounds, args.concurrent) < 1:
        parser.error("--jobs, --rounds and --concurrent must be at least 1")
    walls: dict[str, list[float]] = {v: [] for v in VARIANTS}
    jobs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for variant, mode in (VARIANTS.items() if r % 2 == 0 else reversed(VARIANTS.items())):
            wall, done = _round(mode, args.jobs, args.concurrent)
            walls[variant].append(wall)
            jobs[variant].extend(done)
            print(f"round {r + 1}: {variant} {wall:.1f} s", file=sys.stderr, flush=True)
    report = {
        "jobs_per_process": args.jobs, "rounds": args.rounds, "concurrent": args.concurrent,
        "variants": {v: {"median_round_seconds": round(statistics.median(walls[v]), 2),
                         "round_seconds": [round(w, 2) for w in walls[v]],
                         "median_job_seconds": round(statistics.median(j["seconds"] for j in jobs[v]), 2),
                         "jobs": len(jobs[v])} for v in VARIANTS},
        "verified": all(j["verified"] for v in VARIANTS for j in jobs[v])
                    and all(len(jobs[v]) == args.rounds * args.jobs * args.concurrent for v in VARIANTS),
    }
    full, young = (report["variants"][v]["median_round_seconds"] for v in VARIANTS)
    report["ratio_full_to_young"] = round(full / young, 2)
    if args.json:
        print(json.dumps(report))
    else:
        for v, r in report["variants"].items():
            print(f"{v:14s} {r['median_round_seconds']:6.1f} s per round, {r['median_job_seconds']:5.1f} s per job")
        print(f"PySpark's / Ember's: {report['ratio_full_to_young']}x   verified: {report['verified']}")


if __name__ == "__main__":
    main()
