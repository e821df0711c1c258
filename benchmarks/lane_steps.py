"""What a step on a fan-out lane's own path costs (docs/design/dataflow.md, "Fan-out").

A job of two lanes: scripted micro-batches of 20,000 records over 1,000 keys -> a keyed
``process`` step that passes them on -> lane ``a`` through ``--steps`` Python maps of its own
-> a running count per key, beside lane ``b`` (the count without maps); both to ``CountSink``.
Each step on a lane's path is its own pass over the shared operator's input rows (the other
lane's copies pass it), so the job's time grows with the steps. Runs the job with 1 map and
with ``--steps`` maps, alternating, ``--rounds`` times each (after one warm-up run), each on a
new checkpoint, and prints the median seconds per job::

    PYTHONPATH=src python benchmarks/lane_steps.py --steps 8 --rounds 3 --json
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from typing import Any

SCHEMA = "ts bigint, k bigint, v bigint"


def _batches(batches: int, size: int, keys: int) -> list[list[tuple[int, int, int]]]:
    rng = random.Random(1)
    return [[(b * 1_000 + i % 1_000, rng.randrange(keys), i) for i in range(size)] for b in range(batches)]


def _job(spark_batches: list[list[tuple[int, int, int]]], maps: int) -> float:
    """Seconds to run the two-lane job with ``maps`` Python maps on lane ``a``'s path."""
    from ember import CountSink, KeyedProcessFunction, ScriptedSource, StreamEnvironment
    from ember.state.descriptors import ValueStateDescriptor

    class Pass(KeyedProcessFunction):
        def process_element(self, value: Any, ctx: Any) -> Any:
            yield value

    class Count(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

        def process_element(self, value: Any, ctx: Any) -> Any:
            self.n.update(self.n.value() + 1)
            yield {"k": value["k"], "n": self.n.value()}

    root = tempfile.mkdtemp(prefix="ember-lane-steps-")
    try:
        env = StreamEnvironment(master="local[2]", parallelism=2, checkpoint_dir=root)
        first = env.from_source(ScriptedSource(spark_batches, SCHEMA), name="events").key_by("k").process(
            Pass(), SCHEMA, name="first")
        path = first
        for i in range(maps):
            path = path.map(lambda r: {**r, "v": r["v"] + 1}, SCHEMA, name=f"map-{i}")
        path.key_by("k").process(Count(), "k bigint, n bigint", name="a").sink_to(CountSink(), name="a-out")
        first.key_by("k").process(Count(), "k bigint, n bigint", name="b").sink_to(CountSink(), name="b-out")
        start = time.perf_counter()
        env.execute(f"lane-steps-{maps}", progress=False)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="maps on lane a's path in the second job (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--size", type=int, default=20_000, help="records per micro-batch")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data = _batches(args.batches, args.size, 1_000)
    _job(data, 1)  # warm-up: the session, the Python workers
    seconds: dict[int, list[float]] = {1: [], args.steps: []}
    for _ in range(args.rounds):
        for maps in seconds:
            seconds[maps].append(_job(data, maps))
            if not args.json:
                print(f"{maps} map(s): {seconds[maps][-1]:.2f} s", flush=True)
    medians = {maps: statistics.median(s) for maps, s in seconds.items()}
    records = args.batches * args.size
    per_step_us = (medians[args.steps] - medians[1]) / max(args.steps - 1, 1) / records * 1e6
    report = {"records": records, "median_seconds": {str(k): round(v, 2) for k, v in medians.items()},
              "seconds": {str(k): [round(x, 2) for x in v] for k, v in seconds.items()},
              "per_step_per_record_us": round(per_step_us, 2)}
    print(json.dumps(report) if args.json else
          f"median: 1 map {medians[1]:.2f} s, {args.steps} maps {medians[args.steps]:.2f} s; "
          f"each extra step ~{per_step_us:.1f} us per record of the lane")


if __name__ == "__main__":
    main()
