"""What savepoint operations cost as keyed state grows.

For each state size, runs the grouping-keyed job (E2 + a vectorised running count per key,
``--keys`` distinct keys) until every key has state, then times, on that job's checkpoint:
taking a savepoint (copy + SHA-256 of every file), opening it (verification), reading the
operator's state into pandas, writing a modified state into a new savepoint (Spark's state
rewriter), and restoring it into a new checkpoint rescaled 2 -> 4 state partitions
(Spark's offline repartitioning). Reads back the rescaled state and checks it equals the
written one (``verified``).

    .venv/bin/python benchmarks/savepoints.py [--keys 10000,1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - start, 2)


def measure(spark, keys: int, work: str) -> dict:
    from ember import GroupingSource, StreamEnvironment
    from ember.bench.jobs import KEYED_COUNT_SCHEMA, KeyedCount
    from ember.connectors.sinks import NoopSink
    from ember.savepoints import Savepoint, create_savepoint
    from ember.savepoints.__init__ import rescale_checkpoint
    from ember.savepoints.store import copy_into_checkpoint

    root = os.path.join(work, "checkpoints")
    env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2, spark=spark, max_events_per_batch=2_000_000)
    (env.from_source(GroupingSource(partitions=2, hosts=keys), name="records").key_by("host_id")
     .process_batches(KeyedCount("host_id"), KEYED_COUNT_SCHEMA, name="count").sink_to(NoopSink()))
    env.execute("keyed", max_events=max(4 * keys, 2_000_000), progress=False)
    ckpt = os.path.join(root, "keyed")
    point, create_s = _timed(lambda: create_savepoint(ckpt, root=os.path.join(work, "sp")))
    size_mb = round(sum(int(s) for s, _ in point.manifest["files"].values()) / 1e6, 1)
    _, verify_s = _timed(lambda: Savepoint(point.path))
    state, read_s = _timed(lambda: point.read_state("count", spark))
    changed = state.copy()
    changed[changed.columns[-1]] = changed[changed.columns[-1]] + 1
    written, write_s = _timed(lambda: point.write_state("count", changed, os.path.join(work, "sp", "written"), spark))
    target = os.path.join(work, "rescaled")

    def restore_rescaled():
        copy_into_checkpoint(written.path, target)
        rescale_checkpoint(spark, target, 4)

    _, rescale_s = _timed(restore_rescaled)
    again = create_savepoint(target, root=os.path.join(work, "sp"))
    back = again.read_state("count", spark)
    cols = list(changed.columns)
    verified = (
        again.partitions == 4
        and len(back) == len(changed) == keys
        and back.sort_values(cols[0]).reset_index(drop=True).equals(changed.sort_values(cols[0]).reset_index(drop=True))
    )
    return {
        "keys": keys, "state_rows": len(state), "savepoint_mb": size_mb, "files": len(point.manifest["files"]),
        "create_s": create_s, "verify_s": verify_s, "read_state_s": read_s, "write_state_s": write_s,
        "restore_rescale_2_to_4_s": rescale_s, "verified": verified,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="10000,1000000", help="comma-separated key counts")
    args = parser.parse_args(argv)
    from ember.bench.harness import bench_session

    spark = bench_session("local[2]")
    results = []
    for keys in [int(k) for k in args.keys.split(",")]:
        work = tempfile.mkdtemp(prefix="ember-bench-savepoints-")
        try:
            out = measure(spark, keys, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(json.dumps(out), flush=True)
        results.append(out)
    return 0 if all(r["verified"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
