"""What a job's number of state buckets (``max_parallelism``) costs per micro-batch (issue 19;
docs/design/latency.md, "State buckets").

Spark hands Ember's keyed operator one group per state bucket that has input in a micro-batch,
and each group costs a few ms of pyspark's per-group work in the Python worker whatever its
size. This runs Ember's benchmark jobs with a Python keyed step — the E4 state machine
(``process``, ~1 k live keys per partition) and the Yahoo-style window (a Python aggregate on
Ember's window operator, 100 campaigns) — at each per-batch bound, once per bucket count,
the counts alternating within each round, all in one Spark session; every run verified. It
prints per run the median batch duration (Spark's ``triggerExecution``) over the steady
batches and the events per second, and per (job, bound, buckets) the median over rounds::

    PYTHONPATH=src python benchmarks/state_buckets.py --buckets 128,16 --bounds 5000,2000000 --rounds 2 [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from ember.bench import workloads
from ember.bench.harness import WARMUP_BATCHES, BenchConfig, bench_session, run_once

JOBS = {"keyed": workloads.statemachine, "window": workloads.window}


def batch_ms(reports: list[dict[str, Any]]) -> float | None:
    """Median ``triggerExecution`` over the steady batches (the first ones and empty ones left out)."""
    steady = [int(r["durationMs"]["triggerExecution"]) for r in reports[WARMUP_BATCHES:] if int(r.get("numInputRows") or 0) > 0]
    return statistics.median(steady) if steady else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--buckets", default="128,16", help="bucket counts to compare (default 128,16)")
    parser.add_argument("--bounds", default="5000,2000000", help="events per micro-batch (default 5000,2000000)")
    parser.add_argument("--jobs", default="keyed,window")
    parser.add_argument("--duration", type=float, default=15.0, metavar="S")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spark = bench_session("local[*]")
    counts = [int(b) for b in args.buckets.split(",")]
    runs: list[dict[str, Any]] = []
    run_once(JOBS["keyed"], spark, BenchConfig(duration_s=6, verbose=False, max_events_per_batch=50_000), "warmup")
    for job in args.jobs.split(","):
        for bound in (int(b) for b in args.bounds.split(",")):
            for round_ in range(args.rounds):
                for buckets in counts if round_ % 2 == 0 else counts[::-1]:
                    cfg = BenchConfig(duration_s=args.duration, verbose=False, max_events_per_batch=bound,
                                      options={"max_parallelism": buckets})
                    out = run_once(JOBS[job], spark, cfg, f"buckets-{job}")
                    run = {"job": job, "max_events_per_batch": bound, "buckets": buckets, "verified": out.verified,
                           "batch_ms": batch_ms(out.progress), "events_per_second": round(out.events_per_second)}
                    runs.append(run)
                    print(f"[buckets] {json.dumps(run)}", file=sys.stderr, flush=True)
    summary = []
    for job in args.jobs.split(","):
        for bound in (int(b) for b in args.bounds.split(",")):
            for buckets in counts:
                mine = [r for r in runs if (r["job"], r["max_events_per_batch"], r["buckets"]) == (job, bound, buckets)]
                summary.append({
                    "job": job, "max_events_per_batch": bound, "buckets": buckets,
                    "verified": all(r["verified"] for r in mine),
                    "batch_ms": statistics.median(r["batch_ms"] for r in mine if r["batch_ms"] is not None),
                    "events_per_second": round(statistics.median(r["events_per_second"] for r in mine)),
                })
    if args.json:
        print(json.dumps({"runs": runs, "summary": summary}))
    else:
        print("| job | events per batch | buckets | batch median ms | events/s | verified |")
        print("|---|---|---|---|---|---|")
        for s in summary:
            print(f"| {s['job']} | {s['max_events_per_batch']:,} | {s['buckets']} | {s['batch_ms']:g} | "
                  f"{s['events_per_second']:,} | {s['verified']} |")
    return 0 if all(r["verified"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
