"""A tour of Ember's window operator on a small scripted stream of page views.

- per page, 10 s event-time windows summed by a Python AggregateFunction, with 5 s of allowed
  lateness (a late view re-fires its window) and later views sent to a side output — two sinks
  fed by one Spark query;
- per page, tumbling count windows of 3 views (count_window), and beside them count windows of
  4 views of the whole site (count_window_all: no key, one task).

    python examples/windows_tour.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile

from ember import (
    AggregateFunction,
    CollectSink,
    OutputTag,
    ScriptedSource,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)

# (event time ms, page, seconds spent), in four micro-batches. The watermark is the largest
# timestamp of the batches before (no out-of-orderness allowed).
BATCHES = [
    [(1_000, "home", 3), (2_500, "cart", 8), (4_000, "home", 1)],
    [(12_000, "home", 2), (13_000, "cart", 4), (9_000, "home", 5)],  # 9_000: out of order, in time
    [(26_000, "home", 1), (3_000, "cart", 6), (8_000, "home", 9)],  # behind watermark 13_000: late, within 5 s
    [(30_000, "cart", 2), (5_000, "home", 7)],  # 5_000 behind watermark 26_000: too late -> side output
]


class TotalSeconds(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, acc):
        return acc + value["seconds"]

    def merge(self, a, b):
        return a + b

    def get_result(self, acc):
        return acc


LATE = OutputTag("late_views")


def build(env: StreamEnvironment) -> dict[str, CollectSink]:
    views = env.from_source(
        ScriptedSource(BATCHES, "ts bigint, page string, seconds bigint"),
        WatermarkStrategy.for_monotonous_timestamps("ts"),
        name="views",
    )
    sinks = {"windows": CollectSink(), "late": CollectSink()}
    windows = (
        views.key_by("page")
        .window(TumblingEventTimeWindows.of(10_000))
        .allowed_lateness(5_000)
        .side_output_late_data(LATE)
        .aggregate(TotalSeconds(), output_schema="seconds bigint", name="seconds-per-window")
    )
    windows.sink_to(sinks["windows"], name="windows-out")
    windows.get_side_output(LATE).sink_to(sinks["late"], name="late-out")
    return sinks


def run() -> tuple[dict[str, CollectSink], CollectSink, CollectSink]:
    checkpoint = tempfile.mkdtemp(prefix="ember-windows-tour-")
    try:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=checkpoint, parallelism=2)
        sinks = build(env)
        print(env.explain(spark_plan=False))
        env.execute("windows-tour", progress=False)

        counts_env = StreamEnvironment(master="local[2]", checkpoint_dir=checkpoint + "-counts", parallelism=2, spark=env.spark)
        every_3, every_4 = CollectSink(), CollectSink()
        counted = counts_env.from_source(ScriptedSource(BATCHES, "ts bigint, page string, seconds bigint"),
                                         WatermarkStrategy.for_monotonous_timestamps("ts"), name="views")
        counted.key_by("page").count_window(3).sum("seconds", name="every-3-views").sink_to(every_3)
        counted.count_window_all(4).sum("seconds", name="every-4-site-views").sink_to(every_4)
        counts_env.execute("windows-tour-counts", progress=False)
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
        shutil.rmtree(checkpoint + "-counts", ignore_errors=True)
    return sinks, every_3, every_4


def main() -> int:
    sinks, every_3, every_4 = run()
    print("\nwindow results (a window fired again by a late view appears twice, updated):")
    for b in sinks["windows"].batches:
        for r in b.rows:
            print(f"  batch {b.batch_id}: {r['page']:5} [{r['window_start']:>6}, {r['window_end']:>6}) seconds={r['seconds']}")
    print("late views (behind window end + 5 s of allowed lateness):")
    for r in sinks["late"].rows():
        print(f"  {r}")
    print("every 3 views of a page:")
    for r in every_3.rows():
        print(f"  {r['page']:5} sum_seconds={r['sum_seconds']}")
    print("every 4 views of the site (in event time within a micro-batch):")
    for r in every_4.rows():
        print(f"  sum_seconds={r['sum_seconds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
