"""Keyed state whose checkpoint follows what changed (issue 18): the same job on both state
layouts, side by side.

A "last seen" process function per device (E2's records, ``--keys`` devices) runs on
micro-batches that each touch a small share of the devices. With the default layout
(``state_layout="blob"``) every batch rewrites each state bucket's whole table into the
checkpoint; with ``state_layout="delta"`` a batch appends only the rows it changed. The job
then restarts after the working copies on local disk are dropped (as on another machine):
the delta layout rebuilds them from its log, and the counts stay exact. Last, a job started on
the blob layout is stopped halfway, a savepoint taken, and restored on the delta layout: its
state is converted on the way (docs/savepoints.md), and every device is still seen once.

    python examples/large_state.py [--keys 200000] [--per-batch 20000] [--batches 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Any

from ember import CollectSink, StreamEnvironment
from ember.connectors.generators import GroupingSource
from ember.functions import KeyedProcessFunction
from ember.runner.spark.checkpoint import state_writes
from ember.runner.spark.keyed.delta import drop_local_state
from ember.savepoints import create_savepoint
from ember.state import ValueStateDescriptor


class LastSeen(KeyedProcessFunction):
    """Per device: how many records it sent and the last sequence number; emits a device's
    first record only (so the output counts the devices)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))
        self.last = ctx.get_state(ValueStateDescriptor("last"))

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        n = self.count.value() + 1
        self.count.update(n)
        self.last.update(value["seq_id"])
        if n == 1:
            yield {"host_id": ctx.current_key, "first_seq": value["seq_id"]}


def run_layout(layout: str, root: str, keys: int, per_batch: int, batches: int, spark: Any = None) -> dict[str, Any]:
    """Two runs of the job (the second after dropping the local copies); what the checkpoint
    wrote per batch and whether every device was seen exactly once."""
    source = GroupingSource(partitions=2, hosts=keys)
    devices = CollectSink()
    env = None
    for part in (1, 2):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2, spark=spark,
                                max_events_per_batch=per_batch, state_layout=layout)
        spark = env.spark
        (env.from_source(source, name="records").key_by("host_id")
         .process(LastSeen(), "host_id int, first_seq bigint", name="last-seen").sink_to(devices))
        result = env.execute(f"large-state-{layout}", max_events=per_batch * batches // 2, progress=False)
        if part == 1:
            drop_local_state(result.checkpoint_dir)  # the second run starts without local copies
    events = per_batch * batches
    firsts = [r["host_id"] for r in devices.rows()]
    writes = state_writes(result.checkpoint_dir, batches // 2)
    return {
        "layout": layout, "events": events, "devices": len(set(firsts)), "expected_devices": min(keys, events),
        "exact": len(firsts) == len(set(firsts)) == min(keys, events),
        "checkpoint_bytes_per_batch": writes["checkpoint_changelog_bytes_per_batch"],
        "rebuilt_rows": result.counters.get("state_rebuilt_rows", 0), "spark": spark,
    }


def run_moved(root: str, keys: int, per_batch: int, batches: int, spark: Any = None) -> dict[str, Any]:
    """Half the records on the blob layout, a savepoint, the rest restored on the delta layout:
    whether every device was seen exactly once across the two."""
    events = per_batch * batches
    source = GroupingSource(partitions=2, hosts=keys, max_events=events)  # (Ember's reader: it starts where told)
    sinks = []  # one per job: the restored job numbers its micro-batches from 0 again
    point = None
    for layout in ("blob", "delta"):
        devices = CollectSink()
        sinks.append(devices)
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2, spark=spark,
                                max_events_per_batch=per_batch, state_layout=layout)
        spark = env.spark
        (env.from_source(source, name="records").key_by("host_id")
         .process(LastSeen(), "host_id int, first_seq bigint", name="last-seen").sink_to(devices))
        if point is None:
            result = env.execute("moved-blob", max_events=events // 2, progress=False)
            point = create_savepoint(result.checkpoint_dir, root=os.path.join(root, "savepoints")).path
        else:
            env.execute("moved-delta", from_savepoint=point, progress=False)
    firsts = [r["host_id"] for sink in sinks for r in sink.rows()]
    return {"devices": len(set(firsts)), "exact": len(firsts) == len(set(firsts)) == min(keys, events), "spark": spark}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--per-batch", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="ember-large-state-")
    spark, results = None, []
    try:
        for layout in ("blob", "delta"):
            out = run_layout(layout, os.path.join(root, layout), args.keys, args.per_batch, args.batches, spark)
            spark = out.pop("spark")
            results.append(out)
        moved = run_moved(os.path.join(root, "moved"), args.keys, args.per_batch, args.batches, spark)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.keys:,} devices, {args.per_batch:,} records per micro-batch, {args.batches} batches, "
          "restarted halfway without local copies:")
    for r in results:
        print(f"  {r['layout']:5}: {r['checkpoint_bytes_per_batch'] / 1e6:7.2f} MB of state changelog per batch, "
              f"{r['devices']:,} devices seen once each: {'exact' if r['exact'] else 'WRONG'}"
              + (f", {r['rebuilt_rows']:,} rows rebuilt from the log" if r["layout"] == "delta" else ""))
    print(f"  blob -> delta through a savepoint halfway: {moved['devices']:,} devices seen once each: "
          f"{'exact' if moved['exact'] else 'WRONG'}")
    return 0 if all(r["exact"] for r in results) and moved["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
