"""What grows with a cluster's size, measured on one machine (issue 18, docs/design/scale.md).

A 30-node, 120-core job differs from this machine's in the number of tasks and state
partitions each micro-batch has, not in the work per event. Two measurements:

1. **Driver cost per task**: a Spark job of ``n`` near-empty JVM tasks (``spark.range(0, n,
   1, n)`` written to the ``noop`` sink: one row per task, no Python worker), median of 5 per
   ``n``; the slope over ``n`` is what scheduling, launching and finishing one task costs,
   whatever the cluster (on this machine the driver and the executor share 2 cores).
2. **Per-batch cost per state partition**: the keyed running count (``ember bench
   grouping-keyed``: E2 records -> key_by(host_id) -> ``process_batches``) with small batches
   (``--batch`` events, default 5,000) and ``P`` state partitions (Spark's shuffle
   partitions), for each layout: the median batch duration (``triggerExecution``) and its
   ``addBatch`` over the steady batches. The slope over ``P`` is the fixed cost one more
   state partition adds to every batch (its task, its state store commit and, here on one
   machine, its share of the two cores).

    python benchmarks/scale_costs.py [--partitions 2,16,64] [--layouts blob,delta] [--duration 20] [--json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from typing import Any

from ember.bench import workloads
from ember.bench.harness import WARMUP_BATCHES, BenchConfig, bench_session, run_once


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def driver_cost(spark: Any, sizes: list[int]) -> dict[str, Any]:
    def job(n: int) -> None:
        spark.range(0, n, 1, n).write.format("noop").mode("overwrite").save()

    job(8)  # warm
    rows = []
    for n in sizes:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            job(n)
            times.append((time.perf_counter() - t0) * 1000)
        rows.append({"tasks": n, "job_ms": round(statistics.median(times), 1)})
        print(f"[scale] {n} tasks: {rows[-1]['job_ms']} ms", file=sys.stderr, flush=True)
    return {"jobs": rows, "ms_per_task": round(_slope([(r["tasks"], r["job_ms"]) for r in rows]), 3)}


def partition_cost(spark: Any, partitions: list[int], layouts: list[str], batch: int, duration: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layout in layouts:
        rows = []
        for p in partitions:
            cfg = BenchConfig(duration_s=duration, verbose=False, max_events_per_batch=batch,
                              options={"keys": 100_000, "state_layout": layout, "parallelism": p})
            run = run_once(workloads.grouping_keyed, spark, cfg, f"scale-{layout}-{p}")
            steady = [r for r in run.progress[WARMUP_BATCHES:] if int(r.get("numInputRows") or 0) > 0]
            rows.append({
                "partitions": p, "verified": run.verified, "batches": len(steady),
                "batch_ms": statistics.median(int(r["durationMs"]["triggerExecution"]) for r in steady),
                "add_batch_ms": statistics.median(int(r["durationMs"].get("addBatch", 0)) for r in steady),
                "events_per_second": round(run.events_per_second),
            })
            print(f"[scale] {layout}, {p} state partitions: {rows[-1]}", file=sys.stderr, flush=True)
        out[layout] = {"runs": rows, "batch_ms_per_partition": round(_slope([(r["partitions"], r["batch_ms"]) for r in rows]), 2)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="2,16,64")
    parser.add_argument("--layouts", default="blob,delta")
    parser.add_argument("--tasks", default="2,64,256,1024")
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spark = bench_session("local[*]")
    report = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python benchmarks/scale_costs.py " + " ".join(sys.argv[1:]),
        "driver": driver_cost(spark, [int(n) for n in args.tasks.split(",")]),
        "state_partitions": partition_cost(spark, [int(p) for p in args.partitions.split(",")],
                                           args.layouts.split(","), args.batch, args.duration),
    }
    report["verified"] = all(r["verified"] for v in report["state_partitions"].values() for r in v["runs"])
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0 if report["verified"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
