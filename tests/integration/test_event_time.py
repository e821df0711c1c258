"""Event-time semantics against an independent model of Flink's (tests/flink_model.py), on
both window paths (Spark's native windowing and Ember's window operator), batch by batch;
and issue 16's five reproductions, each as the model says Flink behaves."""

from __future__ import annotations

import os
from datetime import timedelta

import flink_model as model
import pytest
from window_functions import CountSum

from ember import (
    Agg,
    CollectSink,
    EventTimeSessionWindows,
    EventTimeTrigger,
    KeyedProcessFunction,
    OutputTag,
    ScriptedSource,
    SlidingEventTimeWindows,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"


def _assigner(kind: str, size: int, slide: int | None):
    if kind == "tumbling":
        return TumblingEventTimeWindows.of(size)
    if kind == "sliding":
        return SlidingEventTimeWindows.of(size, slide)
    return EventTimeSessionWindows.with_gap(size)


def _windowed(env, batches, bound_ms, assigner, path, *, declare=None, partitions=1):
    src = env.from_source(
        ScriptedSource(batches, SCHEMA, partitions=partitions),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=bound_ms), "ts"), name="events",
    )
    windowed = src.key_by("k").window(assigner)
    if declare is not None:
        windowed = declare(windowed)
    sink = CollectSink()
    if path == "native":
        out = windowed.aggregate(n=Agg.count(), total=Agg.sum("v"), name="w")
    else:
        out = windowed.aggregate(CountSum(), output_schema="n bigint, total bigint", name="w")
    out.sink_to(sink)
    result = env.execute("event-time", progress=False)
    fired = {}
    for b in sink.batches:
        for r in b.rows:
            window = (r["k"], r["window_start"], r["window_end"])
            assert window not in fired, f"window {window} emitted twice"
            fired[window] = (r["n"], r["total"], b.batch_id if b.batch_id < len(batches) else model.END)
    return fired, result


def _explain(env, batches, bound_ms, assigner, path):
    env = StreamEnvironment(master="local[2]", parallelism=2, spark=env.spark)
    src = env.from_source(ScriptedSource(batches, SCHEMA),
                          WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=bound_ms), "ts"))
    windowed = src.key_by("k").window(assigner)
    out = (windowed.aggregate(n=Agg.count(), name="w") if path == "native"
           else windowed.aggregate(CountSum(), output_schema="n bigint, total bigint", name="w"))
    out.sink_to(CollectSink())
    return env.explain(spark_plan=False)


CASES = [("tumbling", 4_000, None), ("sliding", 4_000, 2_000), ("session", 1_500, None)]


def _on_operator(path: str, kind: str) -> bool:
    """Whether the window runs on Ember's operator, which fires in the batch whose records
    close a window (Spark has no native event-time session window of Flink's meaning)."""
    return path == "operator" or kind == "session"


# In make test-all only: Spark's native tumbling window (the findings below and the slow random
# streams check it too) and the native path of a session window (it runs on Ember's operator
# whatever the path: the same job as the operator's).
SLOW_PATHS = {("tumbling", "native"), ("session", "native")}


@pytest.mark.parametrize(("kind", "size", "slide", "path"), [
    pytest.param(*case, path, id=f"{case[0]}-{path}", marks=[pytest.mark.slow] if (case[0], path) in SLOW_PATHS else [])
    for case in CASES for path in ("native", "operator")])
def test_windows_equal_the_model_batch_by_batch_on_a_random_stream(env, kind, size, slide, path):
    batches = model.random_batches(8)
    expected = model.windows(batches, 1_000, kind, size, slide, in_batch=_on_operator(path, kind))
    assert expected.late > 0 and any(b != model.END for *_, b in expected.fired.values())  # the stream exercises both
    fired, result = _windowed(env, batches, 1_000, _assigner(kind, size, slide), path)
    assert fired == expected.fired
    assert result.late_dropped == expected.late


@pytest.mark.parametrize(("kind", "size", "slide"), [CASES[0], CASES[2]], ids=["tumbling", "session"])
def test_windows_read_in_two_partitions_fire_in_the_batch_the_model_says(env, kind, size, slide):
    """Each batch's records dealt over two partitions: a bucket whose records all come from one
    partition still learns the other's latest event time (keyed/reach.py: the task's first
    call hears every partition), so its windows fire in the batch the model says."""
    batches = model.random_batches(8)
    expected = model.windows(batches, 1_000, kind, size, slide, in_batch=True)
    fired, result = _windowed(env, batches, 1_000, _assigner(kind, size, slide), "operator", partitions=2)
    assert (fired, result.late_dropped) == (expected.fired, expected.late)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 7))
@pytest.mark.parametrize("path", ["native", "operator"])
@pytest.mark.parametrize(("kind", "size", "slide"), CASES, ids=[c[0] for c in CASES])
def test_windows_equal_the_model_on_more_random_streams(env, kind, size, slide, path, seed):
    batches = model.random_batches(100 + seed, batches=12)
    expected = model.windows(batches, 1_000, kind, size, slide, in_batch=_on_operator(path, kind))
    fired, result = _windowed(env, batches, 1_000, _assigner(kind, size, slide), path)
    assert (fired, result.late_dropped) == (expected.fired, expected.late)


@pytest.mark.parametrize("seed", [8, pytest.param(21, marks=pytest.mark.slow), pytest.param(22, marks=pytest.mark.slow)])
@pytest.mark.parametrize(("kind", "size", "slide"), [pytest.param(*CASES[0], id="tumbling", marks=pytest.mark.slow),
                                                   pytest.param(*CASES[1], id="sliding")])
def test_allowed_lateness_refires_as_the_model_says(env, kind, size, slide, seed):
    batches = model.random_batches(seed)
    rows, late = model.windows_with_lateness(batches, 1_000, size, slide, 1_500, in_batch=True)
    assert len(rows) > len({r[:3] for r in rows}) and late > 0  # the stream exercises late firings and late records
    src = env.from_source(ScriptedSource(batches, SCHEMA),
                          WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts"))
    sink = CollectSink()
    (src.key_by("k").window(_assigner(kind, size, slide)).allowed_lateness(timedelta(milliseconds=1_500))
        .aggregate(CountSum(), output_schema="n bigint, total bigint").sink_to(sink))
    result = env.execute("lateness", progress=False)
    got = sorted(((r["k"], r["window_start"], r["window_end"], r["n"], r["total"],
                   b.batch_id if b.batch_id < len(batches) else model.END) for b in sink.batches for r in b.rows), key=str)
    assert got == rows
    assert result.late_dropped == late


@pytest.mark.parametrize(("size", "slide"), [(3, None), (4, 2)], ids=["tumbling", "sliding"])
def test_count_windows_fire_as_the_model_says(env, size, slide):
    batches = model.random_batches(8)
    expected = model.count_windows(batches, size, slide)
    src = env.from_source(ScriptedSource(batches, SCHEMA),
                          WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts"))
    sink = CollectSink()
    windows = src.key_by("k").count_window(size) if slide is None else src.key_by("k").count_window(size, slide)
    windows.aggregate(CountSum(), output_schema="n bigint, total bigint").sink_to(sink)
    env.execute("count-windows", progress=False)
    got = sorted((r["k"], r["n"], r["total"], b.batch_id) for b in sink.batches for r in b.rows)
    assert got == expected and len({r[3] for r in expected}) > 2


def test_the_paths_are_what_the_model_tests_claim(env):
    """Built-in aggregates on tumbling/sliding windows run natively, a Python aggregate on the
    operator, and an event-time session window on the operator either way."""
    batches = [[(1_000, "a", 1)]]
    assert "native" in _explain(env, batches, 0, TumblingEventTimeWindows.of(1_000), "native")
    assert "python, keyed state" in _explain(env, batches, 0, TumblingEventTimeWindows.of(1_000), "operator")
    assert "python, keyed state" in _explain(env, batches, 0, EventTimeSessionWindows.with_gap(1_000), "native")


class TimerAfter(KeyedProcessFunction):
    def __init__(self, delay):
        self.delay = delay

    def process_element(self, value, ctx):
        ctx.register_event_time_timer(value["ts"] + self.delay)

    def on_timer(self, timestamp, ctx):
        yield {"k": ctx.current_key, "at": timestamp, "wm": ctx.current_watermark}


def test_a_quiet_bucket_read_from_one_partition_learns_the_batch_s_latest_time(env):
    """Key x's bucket has no timer before batch 1 (marked quiet: keyed/reach.py), and its record
    of batch 1 comes from one partition while the other's record is 3 s later. x's bucket is not
    its state partition's first, and no other bucket of that partition has records or timers: x
    learns that later time only from the first bucket's call, which every partition reaches, and
    then fires its timer (at 5,700) in batch 1, under the watermark the later record makes
    (6,999), as the model says — not one batch late."""
    from pyspark.sql import functions as F

    from ember.runner.spark.keyed.reach import first_buckets, spark_hash_int

    names = [f"k{i}" for i in range(40)]
    buckets = dict(env.spark.createDataFrame([(n,) for n in names], "k string")
                   .select("k", F.expr("pmod(xxhash64(k), 128)")).collect())
    ordinary = [n for n in names if buckets[n] not in first_buckets(128, 2)]
    x = ordinary[0]  # y and z in the other state partition: only x's partition's first bucket tells x
    y, z = [n for n in ordinary if spark_hash_int(buckets[n]) % 2 != spark_hash_int(buckets[x]) % 2][:2]
    batches = [[(1_000, z, 1)], [(5_000, x, 1), (8_000, y, 1)], []]
    expected = model.timer_firings(batches, 1_000, 700, in_batch=True)
    assert (x, 5_700, 1) in expected
    fired, _ = _timers_fired(env, batches, partitions=2)
    assert fired == expected


def _timers_fired(env, batches, partitions=1):
    """TimerAfter(700) on ``batches`` (1 s bound): the timers fired as (key, time, batch), sorted;
    and the sink's batches."""
    src = env.from_source(ScriptedSource(batches, SCHEMA, partitions=partitions),
                          WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts"))
    sink = CollectSink()
    src.key_by("k").process(TimerAfter(700), "k string, at bigint, wm bigint").sink_to(sink)
    env.execute("timers", progress=False)
    fired = sorted((r["k"], r["at"], b.batch_id if b.batch_id < len(batches) else model.END)
                   for b in sink.batches for r in b.rows)
    return fired, sink.batches


@pytest.mark.parametrize(("seed", "partitions"), [pytest.param(3, 1, marks=pytest.mark.slow), (4, 2)])
def test_timers_fire_as_the_model_says_on_a_random_stream(env, seed, partitions):
    batches = model.random_batches(seed)
    expected = model.timer_firings(batches, 1_000, 700, in_batch=True)
    fired, sink_batches = _timers_fired(env, batches, partitions)
    assert fired == expected
    watermarks = model.flink_watermarks(batches, 1_000, after_last=True)
    for b in sink_batches:
        if b.batch_id < len(batches):  # fired after the batch's records, under the watermark they make
            assert {r["wm"] for r in b.rows} <= {watermarks[b.batch_id + 1]}  # ctx.current_watermark is Flink's


@pytest.mark.parametrize("seed", [3, pytest.param(5, marks=pytest.mark.slow)])
def test_timers_fire_as_the_model_says_without_spark_s_group_timeout(env, seed):
    """A stream that does not end: the step fires in the batch and runs without Spark's group
    timeout (translators/keyed.py: without_group_timeout) — its state rows have no timeout
    column — and every timer fires in the batch the model says; the timers still pending when
    the job stops are not fired (no end of input: no final watermark)."""
    from ember.runner.spark.checkpoint import last_committed_batch
    from ember.runner.spark.state_io import _keeps_timeout

    batches = model.random_batches(seed)
    expected = [f for f in model.timer_firings(batches, 1_000, 700, in_batch=True) if f[2] != model.END]
    src = env.from_source(ScriptedSource(batches, SCHEMA, ends=False),
                          WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts"))
    sink = CollectSink()
    src.key_by("k").process(TimerAfter(700), "k string, at bigint, wm bigint").sink_to(sink)
    env.execute("timers-open", progress=False, max_events=sum(len(b) for b in batches))
    fired = sorted((r["k"], r["at"], b.batch_id) for b in sink.batches for r in b.rows)
    assert fired == expected
    checkpoint = os.path.join(env.config.checkpoint_dir, "timers-open")
    assert not _keeps_timeout(env.spark, checkpoint, last_committed_batch(checkpoint), 0)


@pytest.mark.parametrize("older", [False, True])
def test_a_restart_keeps_the_checkpoint_s_group_timeouts(env, monkeypatch, older):
    """A job stopped midway and restarted fires every timer as one uninterrupted run would.
    ``older``: the checkpoint was written before steps ran without Spark's group timeout (its
    state rows have the timeout column, its manifest no mark): the restarted step keeps the
    timeout — Spark refuses state of another shape."""
    import json

    from ember.runner.spark.checkpoint import GROUP_TIMEOUTS, CheckpointLayout, last_committed_batch
    from ember.runner.spark.state_io import _keeps_timeout
    from ember.runner.spark.translators import keyed

    batches = model.random_batches(4)
    expected = [f for f in model.timer_firings(batches, 1_000, 700, in_batch=True) if f[2] != model.END]
    checkpoint = os.path.join(env.config.checkpoint_dir, "timers-restart")
    sink = CollectSink()

    def run(max_events):
        fresh = StreamEnvironment(master="local[2]", checkpoint_dir=env.config.checkpoint_dir, parallelism=2,
                                  spark=env.spark)
        src = fresh.from_source(ScriptedSource(batches, SCHEMA, ends=False),
                                WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts"))
        src.key_by("k").process(TimerAfter(700), "k string, at bigint, wm bigint").sink_to(sink)
        return fresh.execute("timers-restart", progress=False, max_events=max_events).events

    first = sum(len(b) for b in batches[:4])
    if older:
        with monkeypatch.context() as patch:
            patch.setattr(keyed, "without_group_timeout", lambda comp, advance_ms: False)
            read = run(first)
        layout = CheckpointLayout(checkpoint)
        with open(layout.pipeline) as f:
            manifest = json.load(f)
        del manifest[GROUP_TIMEOUTS]  # as an older Ember wrote it
        with open(layout.pipeline, "w") as f:
            json.dump(manifest, f)
    else:
        read = run(first)
    run(sum(len(b) for b in batches) - read)
    # every timer fires once, at its time (with a timeout, Spark may run a batch without data
    # after the restart — the watermark moved — which shifts the later batches' ids)
    fired = sorted((r["k"], r["at"]) for b in sink.batches for r in b.rows)
    assert fired == sorted((k, at) for k, at, _ in expected)
    assert _keeps_timeout(env.spark, checkpoint, last_committed_batch(checkpoint), 0) == older


# ---------------------------------------------------------------------------------------------
# Issue 16's reproductions (ScriptedSource batches of (ts, key, value); the expected results are
# the model's, spelled out).

@pytest.mark.parametrize("path", ["native", "operator"])
def test_finding_1_late_dropped_counts_records_not_aggregated_rows(env, path):
    batches = [[(25_000, "a", 1)], [], [(5_000, "a", 1), (6_000, "a", 2)]]
    _, result = _windowed(env, batches, 0, TumblingEventTimeWindows.of(10_000), path)
    assert result.late_dropped == 2 == model.windows(batches, 0, "tumbling", 10_000).late


@pytest.mark.parametrize("path", ["native", "operator"])
def test_finding_1_a_record_late_in_all_its_sliding_windows_counts_once(env, path):
    batches = [[(25_000, "a", 1)], [], [(5_000, "a", 1)]]
    _, result = _windowed(env, batches, 0, SlidingEventTimeWindows.of(10_000, 5_000), path)
    assert result.late_dropped == 1 == model.windows(batches, 0, "sliding", 10_000, 5_000).late


@pytest.mark.parametrize("path", ["native", "operator"])
def test_finding_2_a_record_behind_the_watermark_joins_a_session_still_open(env, path):
    batches = [[(10_000, "a", 1), (12_000, "a", 2)], [(13_500, "b", 0)], [(7_000, "a", 4)]]
    fired, result = _windowed(env, batches, 0, EventTimeSessionWindows.with_gap(3_000), path)
    assert fired[("a", 7_000, 15_000)][:2] == (3, 7)
    assert result.late_dropped == 0
    assert fired == model.windows(batches, 0, "session", 3_000, in_batch=_on_operator(path, "session")).fired


@pytest.mark.parametrize("declare", [
    None, lambda w: w.trigger(EventTimeTrigger.create()), lambda w: w.allowed_lateness(timedelta(0)),
], ids=["plain", "default-trigger", "zero-lateness"])
def test_finding_3_every_declaration_of_the_same_window_has_one_meaning(env, declare):
    # The watermark is 10_999 when (500, a, 9) arrives: its window [0, 10 s) ended (Flink fires it
    # at 9_999), so it is late, whatever the declaration.
    batches = [[(1_000, "a", 1), (2_000, "b", 2)], [(12_000, "a", 3)], [(500, "a", 9)]]
    fired, result = _windowed(env, batches, 1_000, TumblingEventTimeWindows.of(10_000), "native", declare=declare)
    assert fired[("a", 0, 10_000)][:2] == (1, 1)
    assert result.late_dropped == 1
    assert fired == model.windows(batches, 1_000, "tumbling", 10_000).fired


def test_finding_3_the_late_record_goes_to_the_late_output_when_one_is_declared(env):
    batches = [[(1_000, "a", 1), (2_000, "b", 2)], [(12_000, "a", 3)], [(500, "a", 9)]]
    src = env.from_source(ScriptedSource(batches, SCHEMA),
                          WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts"))
    late = OutputTag("late")
    windows = src.key_by("k").window(TumblingEventTimeWindows.of(10_000)).side_output_late_data(late).aggregate(
        n=Agg.count(), total=Agg.sum("v"))
    main, side = CollectSink(), CollectSink()
    windows.sink_to(main)
    windows.get_side_output(late).sink_to(side)
    result = env.execute("late-output", progress=False)
    assert {(r["k"], r["window_start"], r["n"], r["total"]) for r in main.rows()} == {
        ("a", 0, 1, 1), ("b", 0, 1, 2), ("a", 10_000, 1, 3)}
    assert [(r["ts"], r["k"], r["v"]) for r in side.rows()] == [(500, "a", 9)]
    assert result.late_dropped == 0


@pytest.mark.parametrize("path", ["native", "operator"])
@pytest.mark.parametrize("split", [False, True])
def test_finding_4_a_record_exactly_at_the_bound_is_on_time_however_batched(env, path, split):
    # Bound 2 s: after 11_999 the watermark is 9_998 (Flink's), so 9_999 is not late.
    batches = [[(11_999, "a", 1)], [(9_999, "a", 2)]] if split else [[(11_999, "a", 1), (9_999, "a", 2)]]
    fired, result = _windowed(env, batches, 2_000, TumblingEventTimeWindows.of(10_000), path)
    assert fired[("a", 0, 10_000)][:2] == (1, 2)
    assert result.late_dropped == 0


@pytest.mark.parametrize("path", ["native", "operator"])
def test_finding_5_a_window_fires_when_the_watermark_reaches_it_whatever_other_keys_do(env, path):
    # Tumbling 2 s, bound 0: Flink's watermark before each batch: none, 999, 1_998, 2_499. [0, 2 s)
    # has its last timestamp 1_999: both a's and b's fire in batch 3 on Spark's native path,
    # in batch 2 (whose record moves the watermark to 2_499) on Ember's operator — where a's
    # bucket gets no record in batch 2: the batch's packing tells it the batch's latest time.
    batches = [[(1_000, "a", 1)], [(1_999, "b", 1)], [(2_500, "b", 1)], [(5_000, "b", 1)]]
    fired, _ = _windowed(env, batches, 0, TumblingEventTimeWindows.of(2_000), path)
    assert fired[("a", 0, 2_000)][2] == fired[("b", 0, 2_000)][2] == (3 if path == "native" else 2)
    assert fired == model.windows(batches, 0, "tumbling", 2_000, in_batch=path == "operator").fired


def test_current_watermark_is_none_before_the_first_watermark(env):
    batches = [[(1_000, "a", 1)], [(2_000, "a", 1)]]

    class Watch(KeyedProcessFunction):
        def process_element(self, value, ctx):
            yield {"ts": value["ts"], "wm": ctx.current_watermark}

    src = env.from_source(ScriptedSource(batches, SCHEMA),
                          WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=200), "ts"))
    sink = CollectSink()
    src.key_by("k").process(Watch(), "ts bigint, wm bigint").sink_to(sink)
    env.execute("watch", progress=False)
    assert sorted((r["ts"], r["wm"]) for r in sink.rows()) == [(1_000, None), (2_000, 799)]


def test_reduce_emits_the_reduced_record_with_its_window(env):
    """Overlapping sliding windows' reduced records are told apart by their window."""
    batches = [[(1_000, "a", 3), (2_500, "a", 5), (4_500, "a", 1)]]
    src = env.from_source(ScriptedSource(batches, SCHEMA),
                          WatermarkStrategy.for_bounded_out_of_orderness(timedelta(0), "ts"))
    sink = CollectSink()
    (src.key_by("k").window(SlidingEventTimeWindows.of(4_000, 2_000))
        .reduce(lambda a, b: a if a["v"] >= b["v"] else b).sink_to(sink))
    env.execute("reduce", progress=False)
    got = sorted((r["window_start"], r["window_end"], r["ts"], r["v"]) for r in sink.rows())
    # windows [-2 s, 2 s) {1000}, [0, 4 s) {1000, 2500}, [2 s, 6 s) {2500, 4500}, [4 s, 8 s) {4500}
    assert got == [(-2_000, 2_000, 1_000, 3), (0, 4_000, 2_500, 5), (2_000, 6_000, 2_500, 5), (4_000, 8_000, 4_500, 1)]


@pytest.mark.parametrize("path", ["native", "operator"])
def test_a_record_late_for_some_sliding_windows_reaches_only_the_others(env, path):
    # Watermark 11_999 when (7_000, a) arrives: [0, 10 s) has closed, [5 s, 15 s) has not. Flink
    # adds it to the open window only and does not count it late; [0, 10 s) never had a record.
    batches = [[(12_000, "a", 1)], [(7_000, "a", 2)]]
    fired, result = _windowed(env, batches, 0, SlidingEventTimeWindows.of(10_000, 5_000), path)
    assert {w: v[:2] for w, v in fired.items()} == {("a", 5_000, 15_000): (2, 3), ("a", 10_000, 20_000): (1, 1)}
    assert result.late_dropped == 0
    assert fired == model.windows(batches, 0, "sliding", 10_000, 5_000, in_batch=path == "operator").fired
    # (on the native path the closed window would get the record had the query run Spark's
    # default filter, against the previous batch's watermark; the session keeps its own setting)
    assert env.spark.conf.get("spark.sql.streaming.statefulOperator.allowMultiple", "true") == "true"
