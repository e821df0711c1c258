"""Where a micro-batch's time goes (issue 19): Spark's phases per batch, and the gap between
batches, for a stateless job, a native window and a Python keyed step at several per-batch
bounds, unbounded input rate, trigger interval 0.

For each (job, bound) one run of ``--duration`` seconds; over its steady batches (the first
two excluded) the median of each phase of Spark's ``durationMs`` (latestOffset, getBatch,
queryPlanning, walCommit, addBatch, commitOffsets; ``other`` = triggerExecution minus them)
and of the *gap*: from a batch's end (start + triggerExecution) to the next batch's start —
time spent outside Spark's trigger (Ember's driver loop, polling, sinks' bookkeeping). For the
grouping job also the sink latency percentiles (at unbounded rate: arrival minus the batch's
start).

    python benchmarks/latency_profile.py [--duration 15] [--bounds 5000,50000,500000] [--jobs grouping,window,keyed] [--json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from typing import Any

from ember.bench import workloads
from ember.bench.harness import WARMUP_BATCHES, BenchConfig, bench_session, run_once
from ember.bench.stats import percentiles

PHASES = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
JOBS = {"grouping": workloads.grouping, "window": workloads.window, "keyed": workloads.statemachine}


def _start_ms(report: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(report["timestamp"].replace("Z", "+00:00")).timestamp() * 1000


def profile(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Median ms per phase, ``other``, the gap to the next batch, and the batch total."""
    steady = [r for r in reports[WARMUP_BATCHES:] if int(r.get("numInputRows") or 0) > 0]
    out: dict[str, Any] = {"batches": len(steady)}
    if not steady:
        return out
    for phase in PHASES:
        out[phase] = statistics.median(int(r.get("durationMs", {}).get(phase, 0)) for r in steady)
    totals = [int(r["durationMs"]["triggerExecution"]) for r in steady]
    out["other"] = statistics.median(
        t - sum(int(r["durationMs"].get(p, 0)) for p in PHASES) for r, t in zip(steady, totals))
    out["triggerExecution"] = statistics.median(totals)
    gaps = [_start_ms(b) - (_start_ms(a) + int(a["durationMs"]["triggerExecution"]))
            for a, b in zip(steady, steady[1:])]
    out["gap"] = statistics.median(gaps) if gaps else None
    out["events_per_batch"] = statistics.median(int(r["numInputRows"]) for r in steady)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--bounds", default="5000,50000,500000")
    parser.add_argument("--jobs", default="grouping,window,keyed")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spark = bench_session("local[*]")
    run_once(JOBS["grouping"], spark, BenchConfig(duration_s=6, verbose=False, max_events_per_batch=50_000), "warmup")
    rows = []
    for job in args.jobs.split(","):
        for bound in (int(b) for b in args.bounds.split(",")):
            cfg = BenchConfig(duration_s=args.duration, verbose=False, max_events_per_batch=bound)
            out = run_once(JOBS[job], spark, cfg, f"latency-{job}")
            row = {"job": job, "max_events_per_batch": bound, "verified": out.verified, **profile(out.progress)}
            if out.latencies_ms:
                row["latency_ms"] = percentiles(out.latencies_ms)
            rows.append(row)
            print(f"[latency] {job} <= {bound:,}/batch: " + ", ".join(
                f"{k} {v:g}" for k, v in row.items() if isinstance(v, int | float) and k != "max_events_per_batch"),
                file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({"profile": rows}))
    else:
        cols = ("batches", *PHASES, "other", "triggerExecution", "gap")
        print("| job | bound | " + " | ".join(cols) + " | latency p50/p99 |")
        print("|---" * (len(cols) + 3) + "|")
        for r in rows:
            lat = r.get("latency_ms") or {}
            print(f"| {r['job']} | {r['max_events_per_batch']:,} | " + " | ".join(f"{r.get(c, '')}" for c in cols)
                  + f" | {lat.get('p50', '')}/{lat.get('p99', '')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
