"""Arrow batches into Python bounded by rows only, or also by bytes (Spark 4's default)?

Spark 4 bounds each Arrow batch it sends to a Python worker by rows
(``spark.sql.execution.arrow.maxRecordsPerBatch``) and by bytes
(``spark.sql.execution.arrow.maxBytesPerBatch``, 64 MiB by default). With a byte bound the
JVM measures the batch it is building after every row it appends
(``ArrowWriter.sizeInBytes``); the one value ``2147483647`` turns the check off. Ember's
queries run with it off (``session.query_settings``); this script runs Ember's benchmark
workloads in one Spark session, alternating the byte bound on (``bytes``: Spark's default,
64 MiB) and off (``rows``: Ember's), and reports each side's median events/s and the ratio.

    python benchmarks/arrow_batch_bytes.py --workloads statemachine,window,rolling --duration 15 --rounds 2 --json

Each run is verified as ``ember bench`` verifies it; the JSON has, per workload,
``events_per_second`` (median per side), ``ratio_rows_to_bytes`` and every run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

SPARK_DEFAULT_BYTES = str(64 * 2**20)


def measure(workloads: list[str], duration: float, rounds: int, verbose: bool = True) -> dict[str, Any]:
    from ember.bench.harness import BenchConfig, bench_session, run_once
    from ember.bench.suite import WORKLOADS
    from ember.runner.spark.session import ARROW_BATCH_BYTES

    spark = bench_session("local[*]")
    report: dict[str, Any] = {"duration_s": duration, "rounds": rounds, "workloads": {}}
    try:
        for name in workloads:
            run = WORKLOADS[name][0]
            cfg = BenchConfig(duration_s=duration, verbose=False, baseline=False)
            run_once(run, spark, BenchConfig(duration_s=6, verbose=False, baseline=False), "arrow-bytes")  # JIT warm-up
            runs: dict[str, list[dict[str, Any]]] = {"bytes": [], "rows": []}
            for _ in range(rounds):
                for side in ("bytes", "rows"):
                    # A value the session sets itself is the user's and Ember keeps it; unset, Ember's query turns it off.
                    if side == "bytes":
                        spark.conf.set(ARROW_BATCH_BYTES, SPARK_DEFAULT_BYTES)
                    else:
                        spark.conf.unset(ARROW_BATCH_BYTES)
                    out = run_once(run, spark, cfg, "arrow-bytes")
                    runs[side].append({"events_per_second": round(out.events_per_second), "verified": out.verified})
                    if verbose:
                        print(f"{name} {side}: {out.events_per_second:,.0f} events/s verified={out.verified}",
                              file=sys.stderr, flush=True)
            spark.conf.unset(ARROW_BATCH_BYTES)
            med = {side: statistics.median(r["events_per_second"] for r in rs) for side, rs in runs.items()}
            report["workloads"][name] = {
                "events_per_second": med,
                "ratio_rows_to_bytes": round(med["rows"] / med["bytes"], 3),
                "verified": all(r["verified"] is not False for rs in runs.values() for r in rs),
                "runs": runs,
            }
    finally:
        spark.stop()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="statemachine,window,rolling,cep,pipeline")
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = measure(args.workloads.split(","), args.duration, args.rounds)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for name, w in report["workloads"].items():
        e = w["events_per_second"]
        print(f"{name:14s} bytes {e['bytes']:>12,.0f}  rows {e['rows']:>12,.0f}  x{w['ratio_rows_to_bytes']}  verified={w['verified']}")


if __name__ == "__main__":
    main()
