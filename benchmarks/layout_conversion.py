"""What converting a savepoint between the state layouts costs (issue 18; savepoints/convert.py).

A "last seen" process function per device (E2's records, ``--keys`` devices, round robin, so
the first half of the records creates every key) runs half its input on ``--from`` layout,
stops, and a savepoint is taken; the savepoint is then restored on the other layout (the
conversion: every bucket read, written as Parquet, handed to the new query's first
micro-batch) and the job reads the rest. Reports the savepoint's size, the restore's seconds
(verify, copy, read and write the state), the converted job's first micro-batch (the state
handed to the operator) and its throughput over the rest, and whether every device was seen
exactly once across both runs (``verified``). ``--json`` prints one JSON object.

    python benchmarks/layout_conversion.py --keys 1000000 --per-batch 500000 --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any


def run(keys: int, per_batch: int, source_layout: str) -> dict[str, Any]:
    from ember import CollectSink, StreamEnvironment
    from ember.connectors.generators import GroupingSource
    from ember.functions import KeyedProcessFunction
    from ember.savepoints import create_savepoint, restore_savepoint
    from ember.state import ValueStateDescriptor

    class LastSeen(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

        def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
            n = self.count.value() + 1
            self.count.update(n)
            if n == 1:
                yield {"host_id": ctx.current_key}

    target = "delta" if source_layout == "blob" else "blob"
    events = 2 * keys
    root = tempfile.mkdtemp(prefix="ember-layout-conversion-")
    spark = None
    sinks: list[Any] = []
    progress: list[dict[str, Any]] = []
    try:
        source = GroupingSource(partitions=2, hosts=keys, max_events=events)
        out: dict[str, Any] = {"keys": keys, "events": events, "from": source_layout, "to": target}
        point = None
        for layout in (source_layout, target):
            env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2, spark=spark,
                                    max_events_per_batch=per_batch, state_layout=layout)
            spark = env.spark
            sink = CollectSink()
            sinks.append(sink)
            (env.from_source(source, name="records").key_by("host_id")
             .process(LastSeen(), "host_id int", name="last-seen").sink_to(sink))
            if point is None:
                env.execute("before", max_events=keys, progress=False)
                point = create_savepoint(os.path.join(root, "before"), root=os.path.join(root, "sp"))
                out["savepoint_bytes"] = sum(int(s) for s, _ in point.manifest["files"].values())
                continue
            started = time.monotonic()
            restore_savepoint(spark, point.path, os.path.join(root, "after"), env.graph(), 2, state_layout=layout)
            out["restore_s"] = round(time.monotonic() - started, 2)
            started = time.monotonic()
            result = env.execute("after", progress=False)
            progress = result.progress
            out["after_s"] = round(time.monotonic() - started, 2)
            out["after_events"] = result.events
        batches = [p for p in progress if p.get("batchId") is not None]
        first = next((p for p in batches if p["batchId"] == 0), None)
        out["first_batch_ms"] = first["durationMs"].get("triggerExecution") if first else None
        rest = [p for p in batches if p["batchId"] > 0]
        seconds = sum(p["durationMs"].get("triggerExecution", 0) for p in rest) / 1000
        out["events_per_second_after"] = round(out["after_events"] / seconds) if seconds else None
        seen = [r["host_id"] for s in sinks for r in s.rows()]
        out["verified"] = len(seen) == len(set(seen)) == keys
        return out
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--per-batch", type=int, default=500_000)
    parser.add_argument("--from", dest="source", choices=("blob", "delta"), default="blob")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = run(args.keys, args.per_batch, args.source)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['keys']:,} keys, {out['from']} -> {out['to']}: savepoint {out['savepoint_bytes'] / 1e6:.1f} MB, "
              f"restore (conversion) {out['restore_s']} s, first batch {out['first_batch_ms']} ms, "
              f"then {out['events_per_second_after'] or 0:,} events/s; verified: {out['verified']}")
    return 0 if out["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
