"""Batch-by-batch check of keyed state at scale (issue 18): the keyed running count on E2's
records with Zipf-like keys (``GroupingSource(skew=True)``), each micro-batch's number of keys
seen for the first time compared with the generator's numpy twin over that batch's sequence
numbers. A key counted as new twice, or never, shows in the batch where it happened.

    python benchmarks/keyed_state_check.py EVENTS [blob|delta] [--hosts N] [--restart-at EVENTS]

``--restart-at``: stop the job after that many events and restart it from its checkpoint (as
``ember bench grouping-keyed --prefill`` does), then run to EVENTS.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

from ember import CollectSink, StreamEnvironment
from ember.bench.jobs import KEYED_COUNT_SCHEMA, KeyedCount
from ember.connectors.generators import GroupingSource


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("events", type=int)
    parser.add_argument("layout", nargs="?", default="delta", choices=["blob", "delta"])
    parser.add_argument("--hosts", type=int, default=100_000_000)
    parser.add_argument("--restart-at", type=int)
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    src = GroupingSource(partitions=2, hosts=args.hosts, skew=True)
    root = tempfile.mkdtemp(prefix="ember-keyed-check-")
    per: dict[int, tuple[int, int]] = {}
    for stop in ([args.restart_at] if args.restart_at else []) + [args.events]:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, max_events_per_batch=2_000_000, state_layout=args.layout)
        sink = CollectSink()
        (env.from_source(src, name="records").key_by("host_id")
         .process_batches(KeyedCount("host_id"), KEYED_COUNT_SCHEMA, name="count").sink_to(sink))
        done = sum(e for e, _ in per.values())
        result = env.execute("check", max_events=stop - done, progress=False)
        for b in sink.batches:
            per[b.batch_id] = (sum(r["events"] for r in b.rows), sum(r["new_keys"] for r in b.rows))
        print(f"run to {stop:,}: {result.events:,} events, stopped: {result.stopped_because}", file=sys.stderr, flush=True)
    seen, lo, bad = np.zeros(src.hosts, bool), 0, 0
    for b in sorted(per):
        events, new = per[b]
        ids = np.unique(src.host_ids(np.arange(lo, lo + events, dtype=np.int64)))
        lo += events
        twin = int((~seen[ids]).sum())
        seen[ids] = True
        if twin != new:
            bad += 1
            print(f"batch {b}: {events:,} events, {new:,} new keys, the generator says {twin:,}")
    print(f"{len(per)} batches, {lo:,} events, {bad} batches differ")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
