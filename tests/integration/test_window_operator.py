"""Ember's window operator on Spark: Python window functions, count windows,
lateness with a late-data side output, side outputs to a second sink, restarts."""

from __future__ import annotations

import pytest

from ember import (
    Agg,
    CollectSink,
    EventTimeSessionWindows,
    ScriptedSource,
    SlidingEventTimeWindows,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from ember.functions import AggregateFunction, KeyedProcessFunction, OutputTag, ProcessWindowFunction
from ember.windowing.triggers import EventTimeTrigger

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, x bigint"
MONOTONOUS = WatermarkStrategy.for_monotonous_timestamps("ts")


class SumX(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, acc):
        return acc + value["x"]

    def merge(self, a, b):
        return a + b

    def get_result(self, acc):
        return acc


def _source(env, batches, strategy=MONOTONOUS):
    return env.from_source(ScriptedSource(batches, SCHEMA), strategy, name="events")


def test_python_aggregate_with_late_records_to_a_second_sink(env):
    batches = [
        [(1000, "a", 1), (2000, "a", 2), (15_000, "b", 5)],
        [(25_000, "a", 7)],
        [(3000, "a", 100), (30_000, "b", 1), (24_000, "a", 10)],  # 3000 is late (watermark 25000)
    ]
    late = OutputTag("late")
    windows = (
        _source(env, batches).key_by("k").window(TumblingEventTimeWindows.of(10_000))
        .side_output_late_data(late).aggregate(SumX(), output_schema="total bigint", name="sums")
    )
    main, late_sink = CollectSink(), CollectSink()
    windows.sink_to(main)
    windows.get_side_output(late).sink_to(late_sink)
    result = env.execute("late", progress=False)

    wm, expected, late_rows = 0, {}, []
    for batch in batches:  # independent model: Spark's watermark = max ts of earlier batches
        for ts, k, x in batch:
            start = ts - ts % 10_000
            if start + 9999 <= wm:
                late_rows.append({"ts": ts, "k": k, "x": x})
            else:
                expected[(k, start)] = expected.get((k, start), 0) + x
        wm = max([wm] + [ts for ts, _, _ in batch])
    assert sorted((r["k"], r["window_start"], r["total"]) for r in main.rows()) == sorted(
        (k, s, t) for (k, s), t in expected.items()
    )
    assert all(r["window_end"] == r["window_start"] + 10_000 for r in main.rows())
    assert late_sink.rows() == late_rows == [{"ts": 3000, "k": "a", "x": 100}]
    assert result.late_dropped == 0


def test_late_records_without_side_output_are_counted_in_the_result(env):
    batches = [[(20_000, "a", 1)], [(1000, "a", 1), (2000, "b", 1)]]
    sink = CollectSink()
    (_source(env, batches).key_by("k").window(TumblingEventTimeWindows.of(10_000))
     .trigger(EventTimeTrigger.create())  # the default trigger, declared: runs on Ember's window operator
     .aggregate(n=Agg.count(), total=Agg.sum("x")).sink_to(sink))
    result = env.execute("late-counted", progress=False)
    assert [(r["k"], r["n"], r["total"]) for r in sink.rows()] == [("a", 1, 1)]
    assert result.late_dropped == 2


def test_count_windows_tumbling_and_sliding(env):
    xs = [1, 2, 4, 8, 16, 32, 64, 128]
    batches = [[(i, k, x) for i, x in enumerate(xs[:5]) for k in ("a", "b")],
               [(10 + i, k, x) for i, x in enumerate(xs[5:]) for k in ("a", "b")]]
    tumbling, sliding = CollectSink(), CollectSink()
    src = _source(env, batches)
    src.key_by("k").count_window(3).aggregate(n=Agg.count(), total=Agg.sum("x"), name="tumbling").sink_to(tumbling)
    env.execute("count-tumbling", progress=False)
    env2 = StreamEnvironment(master="local[2]", checkpoint_dir=env.config.checkpoint_dir + "-2", parallelism=2, spark=env.spark)
    _source(env2, batches).key_by("k").count_window(4, 2).sum("x", name="sliding").sink_to(sliding)
    env2.execute("count-sliding", progress=False)

    for k in ("a", "b"):
        got = [(r["n"], r["total"]) for r in tumbling.rows() if r["k"] == k]
        assert got == [(3, sum(xs[i:i + 3])) for i in range(0, len(xs) - 2, 3)]
        got = [r["sum_x"] for r in sliding.rows() if r["k"] == k]
        assert got == [sum(xs[max(0, n - 4):n]) for n in range(2, len(xs) + 1, 2)]


class SessionSummary(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield {"k": key, "start": context.window.start, "end": context.window.end, "xs": sorted(e["x"] for e in elements)}


def test_process_window_function_on_session_windows(env):
    batches = [[(1000, "a", 1), (9000, "a", 2), (2000, "b", 3)], [(5000, "a", 4), (40_000, "b", 5)]]
    sink = CollectSink()
    slack = WatermarkStrategy.for_bounded_out_of_orderness(10_000, "ts")  # keeps a@5000 from being late
    (_source(env, batches, slack).key_by("k").window(EventTimeSessionWindows.with_gap(5000))
     .process(SessionSummary(), "k string, start bigint, end bigint, xs array<bigint>").sink_to(sink))
    env.execute("sessions", progress=False)
    assert sorted((r["k"], r["start"], r["end"], r["xs"]) for r in sink.rows()) == [
        ("a", 1000, 14_000, [1, 2, 4]),  # 5000 bridged [1000, 6000) and [9000, 14000)
        ("b", 2000, 7000, [3]),
        ("b", 40_000, 45_000, [5]),
    ]


class Split(KeyedProcessFunction):
    BIG = OutputTag("big", "k string, x bigint")

    def process_element(self, value, ctx):
        if value["x"] >= 10:
            ctx.output(self.BIG, {"k": ctx.current_key, "x": value["x"]})
        yield {"k": ctx.current_key, "x": value["x"]}


def test_process_function_side_output_to_its_own_sink(env):
    batches = [[(1, "a", 5), (2, "b", 50)], [(3, "a", 10), (4, "c", 1)]]
    processed = _source(env, batches).key_by("k").process(Split(), "k string, x bigint", name="split")
    everything, big = CollectSink(), CollectSink()
    processed.sink_to(everything)
    processed.get_side_output(Split.BIG).filter("x < 100").sink_to(big)
    env.execute("side", progress=False)
    assert sorted((r["k"], r["x"]) for r in everything.rows()) == [("a", 5), ("a", 10), ("b", 50), ("c", 1)]
    assert sorted((r["k"], r["x"]) for r in big.rows()) == [("a", 10), ("b", 50)]


def test_count_window_state_survives_a_restart(spark, tmp_path):
    batches = [[(1, "a", 1), (2, "a", 2)], [(3, "a", 4), (4, "a", 8)], [(5, "a", 16), (6, "a", 32)]]

    def run(upto):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark)
        sink = CollectSink()
        _source(env, batches[:upto], strategy=None).key_by("k").count_window(4).sum("x").sink_to(sink)
        env.execute("restart", progress=False)
        return [r["sum_x"] for r in sink.rows()]

    first = run(2)
    second = run(3)  # restarts from the checkpoint and reads the third batch
    assert first == [15] and second == []  # 16 and 32 wait in state for two more records
    batches.append([(7, "a", 64), (8, "a", 128)])
    assert run(4) == [16 + 32 + 64 + 128]


class MinMax(AggregateFunction):
    """Order-insensitive: the same result however records are split into partials."""

    def create_accumulator(self):
        return [None, None, 0]

    def add(self, value, acc):
        x = value["x"]
        return [x if acc[0] is None else min(acc[0], x), x if acc[1] is None else max(acc[1], x), acc[2] + 1]

    def merge(self, a, b):
        pick = lambda f, u, v: v if u is None else u if v is None else f(u, v)  # noqa: E731
        return [pick(min, a[0], b[0]), pick(max, a[1], b[1]), a[2] + b[2]]

    def get_result(self, acc):
        return tuple(acc)


def test_pre_aggregation_before_the_shuffle_gives_identical_results(spark, tmp_path):
    batches = [
        [(t, k, (t * 7 + len(k)) % 50) for t in range(0, 30_000, 700) for k in ("a", "bb", "ccc")],
        [(t, k, (t * 3) % 41) for t in range(25_000, 60_000, 900) for k in ("a", "dddd")],
    ]
    outputs = {}
    for combine in (True, False):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path / str(combine), parallelism=2,
                                spark=spark, combine_windows=combine)
        sink = CollectSink()
        (env.from_source(ScriptedSource(batches, SCHEMA), WatermarkStrategy.for_bounded_out_of_orderness(5000, "ts"), name="events")
         .key_by("k").window(SlidingEventTimeWindows.of(10_000, 5000))
         .aggregate(MinMax(), output_schema="lo bigint, hi bigint, n bigint").sink_to(sink))
        assert "MinMax (python, keyed state)" in env.explain(spark_plan=False)
        result = env.execute("combine", progress=False)
        outputs[combine] = (sorted(tuple(r.values()) for r in sink.rows()), result.late_dropped)
    expected = {}
    for t, k, x in [e for b in batches for e in b]:
        for start in range(t - t % 5000, t - 10_000, -5000):
            lo, hi, n = expected.get((k, start), (x, x, 0))
            expected[(k, start)] = (min(lo, x), max(hi, x), n + 1)
    assert outputs[True] == outputs[False]
    assert outputs[True][0] == sorted((k, s, s + 10_000, *v) for (k, s), v in expected.items())


def test_windows_tour_example(spark, load_example):
    tour = load_example("windows_tour")
    sinks, every_3, every_4 = tour.run()
    by_batch = [sorted((r["page"], r["window_start"], r["seconds"]) for r in b.rows) for b in sinks["windows"].batches]
    fired = [rows for rows in by_batch if rows]
    # batch 1's records close the [0, 10 s) windows (home 3+1+5, cart 8): they fire in batch 1;
    # batch 2's late views re-fire them
    assert fired[0] == [("cart", 0, 8), ("home", 0, 9)]
    assert ("cart", 0, 14) in fired[1] and ("home", 0, 18) in fired[1]
    assert sorted(r for rows in fired[1:] for r in rows) == [
        ("cart", 0, 14), ("cart", 10_000, 4), ("cart", 30_000, 2), ("home", 0, 18), ("home", 10_000, 2), ("home", 20_000, 1)
    ]
    assert sinks["late"].rows() == [{"ts": 5_000, "page": "home", "seconds": 7}]
    assert sorted((r["page"], r["sum_seconds"]) for r in every_3.rows()) == [("cart", 18), ("home", 9), ("home", 12)]
    # the site's views in event time within each batch: 1000, 2500, 4000 | 9000 -> 3+8+1+5; 12000, 13000 |
    # 3000, 8000 -> 2+4+6+9 (a global window is never late); 26000 | 5000, 30000: three wait, unfired
    assert [r["sum_seconds"] for r in every_4.rows()] == [17, 21]
