"""Ember's buffer timeout: the same job under two latency targets.

E2's grouping job (records -> key_by(seq_id), a hash shuffle -> a counting sink that samples
latency) at unbounded input speed, run twice with ``StreamEnvironment(latency_target=...)``.
After every micro-batch the runner resizes the next one: the tight target settles on small
batches (low latency, less throughput), the loose one on large batches. Printed: how the
bound moved, the events/s and the sampled latency of each run.

    python examples/latency_target.py [SECONDS]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile

from ember import CountSink, GroupingSource, StreamEnvironment
from ember.bench.stats import percentiles

TARGETS_MS = (1_000, 5_000)  # (on 2 cores a batch of Ember's Python source costs ~250-350 ms at least: the floor)
SETTLE_BATCHES = 8  # the knob starts at 20,000 events per batch and needs a few batches to settle


def run(seconds: float = 15.0, targets_ms: tuple[int, ...] = TARGETS_MS, settle: int = SETTLE_BATCHES,
        max_events_per_batch: int = 2_000_000) -> dict[int, dict]:
    root = tempfile.mkdtemp(prefix="ember-latency-target-")
    out: dict[int, dict] = {}
    spark = None
    try:
        for target in targets_ms:
            env = StreamEnvironment(master="local[2]", checkpoint_dir=f"{root}/{target}", parallelism=2, spark=spark,
                                    latency_target=target, max_events_per_batch=max_events_per_batch)
            spark = env.spark
            sink = CountSink(latency_field="ts")
            env.from_source(GroupingSource(partitions=2), name="records").key_by("seq_id").sink_to(sink)
            result = env.execute(f"target-{target}", duration_s=seconds, min_batches=settle + 4, progress=False)
            steady = result.batch_bounds[settle:]
            first = steady[0]["batch"] if steady else 0
            out[target] = {
                "bounds": [b["bound"] for b in result.batch_bounds],
                "events": [b["events"] for b in result.batch_bounds],
                "steady_bound": statistics.median(b["bound"] for b in steady) if steady else None,
                "events_per_second": sum(b["events"] for b in steady) / max(1e-9, sum(b["ms"] for b in steady) / 1000),
                "latency_ms": percentiles(sink.latencies_after(first - 1)),
                "median_batch_ms": statistics.median(b["ms"] for b in steady) if steady else None,
                "exact": sink.count == result.events,
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
    runs = run(seconds)
    for target, r in runs.items():
        lat = r["latency_ms"] or {}
        trace = " -> ".join(f"{b:,}" for b in r["bounds"][:12]) + (" ..." if len(r["bounds"]) > 12 else "")
        print(f"latency target {target:,} ms")
        print(f"  bound per batch: {trace}")
        print(f"  steady: {r['events_per_second']:,.0f} events/s, batches {r['median_batch_ms']:,.0f} ms (median), "
              f"latency p50 {lat.get('p50', 0):,.0f} ms, p99 {lat.get('p99', 0):,.0f} ms; every event counted once: {r['exact']}")
    return 0 if all(r["exact"] for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
