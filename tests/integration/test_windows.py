"""Event-time and processing-time windows against independently computed results."""

from collections import defaultdict
from datetime import timedelta

import pytest

from ember import (
    Agg,
    CollectSink,
    EventTimeSessionWindows,
    PipelineError,
    ScriptedSource,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WatermarkStrategy,
)

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
# Out of order within 2 s in every batch; the last batch brings (1500, "a")
# long after window [0, 10 s) closed: a late event.
BATCHES = [
    [(1000, "a", 1), (3000, "b", 2), (2000, "a", 3)],
    [(9500, "a", 4), (8000, "b", 5), (10500, "a", 6), (11000, "b", 7)],
    [(14000, "a", 8), (12500, "a", 9), (23000, "b", 10)],
    [(24000, "a", 11), (35000, "b", 12)],
    [(1500, "a", 99), (36000, "a", 13)],
]
LATE = {(1500, "a", 99)}
BOUND = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2), "ts")


def _on_time():
    return [r for b in BATCHES for r in b if r not in LATE]


def _run(env, windowed, batches=BATCHES, strategy=BOUND, **execute):
    src = env.from_source(ScriptedSource(batches, SCHEMA), strategy, name="events")
    sink = CollectSink()
    windowed(src).sink_to(sink)
    result = env.execute("w", progress=False, **execute)
    return sink, result


def _key(r):
    return (r["k"], r["window_start"], r["window_end"])


def test_tumbling_event_time_with_out_of_order_and_late_events(env):
    sink, result = _run(
        env,
        lambda s: s.key_by("k").window(TumblingEventTimeWindows.of(timedelta(seconds=10))).aggregate(
            n=Agg.count(), total=Agg.sum("v"), lo=Agg.min("v"), hi=Agg.max("v"), mean=Agg.avg("v"),
            first=Agg.first("v"), last=Agg.last("v"),
        ),
    )
    expected = defaultdict(list)
    for ts, k, v in sorted(_on_time()):
        expected[(k, ts // 10_000 * 10_000, ts // 10_000 * 10_000 + 10_000)].append(v)
    got = {_key(r): r for r in sink.rows()}
    assert set(got) == set(expected)
    for key, vs in expected.items():
        r = got[key]
        assert (r["n"], r["total"], r["lo"], r["hi"]) == (len(vs), sum(vs), min(vs), max(vs))
        assert r["mean"] == pytest.approx(sum(vs) / len(vs))
        assert (r["first"], r["last"]) == (vs[0], vs[-1])  # by event time, not arrival
    assert result.late_dropped == 1  # the late event is reported, not silently lost
    assert len(sink.rows()) == len(expected)  # every window exactly once


def test_windows_are_emitted_only_after_the_watermark_passes(env):
    sink, _ = _run(env, lambda s: s.key_by("k").window(TumblingEventTimeWindows.of(10_000)).count())
    # Window [0, 10 s) can close only once an event >= 12 s (10 s + 2 s bound) was seen,
    # i.e. not before batch 2; the end-of-input flush emits the rest last.
    first_batch = min(b.batch_id for b in sink.batches if any(r["window_start"] == 0 for r in b.rows))
    assert first_batch >= 2
    last = sink.batches[-1].rows
    assert {(r["k"], r["window_start"]) for r in last} >= {("a", 30_000), ("b", 30_000)}


def test_sliding_event_time_windows(env):
    sink, _ = _run(env, lambda s: s.key_by("k").window(SlidingEventTimeWindows.of(10_000, 5_000)).sum("v"))
    expected = defaultdict(int)
    for ts, k, v in _on_time():
        start = ts // 5_000 * 5_000
        for s in (start, start - 5_000):
            if s <= ts < s + 10_000 and s + 10_000 > 0:
                expected[(k, s, s + 10_000)] += v
    got = {_key(r): r["sum_v"] for r in sink.rows()}
    # The late event (1500) may only have reached window [-5 s, 5 s) if that window
    # was still open; it closed at watermark 5 s, long before the late event.
    assert got == dict(expected)


def test_event_time_session_windows(env):
    sink, _ = _run(env, lambda s: s.key_by("k").window(EventTimeSessionWindows.with_gap(3_000)).aggregate(n=Agg.count(), total=Agg.sum("v")))
    expected = []
    by_key = defaultdict(list)
    for ts, k, v in _on_time():
        by_key[k].append((ts, v))
    for k, events in by_key.items():
        events.sort()
        session = [events[0]]
        for ts, v in events[1:]:
            if ts <= session[-1][0] + 3_000:  # sessions that touch merge (Flink and Spark)
                session.append((ts, v))
            else:
                expected.append((k, session[0][0], session[-1][0] + 3_000, len(session), sum(x for _, x in session)))
                session = [(ts, v)]
        expected.append((k, session[0][0], session[-1][0] + 3_000, len(session), sum(x for _, x in session)))
    got = sorted((r["k"], r["window_start"], r["window_end"], r["n"], r["total"]) for r in sink.rows())
    assert got == sorted(expected)


def test_window_keyed_by_a_column_expression(env):
    from pyspark.sql import functions as F

    sink, _ = _run(env, lambda s: s.key_by(F.upper("k")).window(TumblingEventTimeWindows.of(20_000)).count())
    expected = defaultdict(int)
    for ts, k, _ in _on_time():
        expected[(k.upper(), ts // 20_000 * 20_000)] += 1
    assert {(r["upper(k)"], r["window_start"]): r["count"] for r in sink.rows()} == dict(expected)


def test_global_window_all(env):
    sink, _ = _run(env, lambda s: s.window_all(TumblingEventTimeWindows.of(20_000)).count())
    expected = defaultdict(int)
    for ts, _, _ in _on_time():
        expected[ts // 20_000 * 20_000] += 1
    assert {r["window_start"]: r["count"] for r in sink.rows()} == dict(expected)


@pytest.mark.parametrize("lateness", [None, 1_000], ids=["native", "operator"])
def test_a_sum_of_text_is_refused_before_the_job_starts(env, lateness):
    """Spark would cast each value and fail the job at the first that is not a number."""
    def windowed(s):
        w = s.key_by("v").window(TumblingEventTimeWindows.of(timedelta(seconds=10)))
        return (w if lateness is None else w.allowed_lateness(lateness)).aggregate(total=Agg.sum("k"), name="totals")

    with pytest.raises(PipelineError, match=r"step 'totals': aggregate 'total' is sum\('k'\), a field of type string"):
        _run(env, windowed)
    assert not any(env.spark.streams.active)


def test_event_time_window_needs_a_watermark(env):
    with pytest.raises(PipelineError, match="an event-time window needs the source's watermark strategy"):
        _run(env, lambda s: s.key_by("k").window(TumblingEventTimeWindows.of(1000)).count(), strategy=None)


def test_event_time_field_must_survive_to_the_window(env):
    with pytest.raises(PipelineError, match="step 'window_1': the event-time field 'ts' is not in the stream at this step"):
        _run(env, lambda s: s.select("k", "v").key_by("k").window(TumblingEventTimeWindows.of(1000)).count())


ONE_ROW_BATCHES = [[(i, "a", 1)] for i in range(6)]


@pytest.mark.parametrize(
    "strategy, assigner",
    [
        (WatermarkStrategy.processing_time(), TumblingProcessingTimeWindows.of(200)),
        # Same window code, time chosen by the strategy alone: ingestion time.
        (WatermarkStrategy.ingestion_time(), TumblingEventTimeWindows.of(200)),
    ],
)
def test_processing_and_ingestion_time_windows(env, strategy, assigner):
    # One row per micro-batch, batches >= 400 ms apart: each row lands in its own
    # 200 ms window, which closes when a later batch's time passes its end.
    from ember import StreamEnvironment

    paced = StreamEnvironment(
        master="local[2]", checkpoint_dir=env.config.checkpoint_dir, parallelism=2, spark=env.spark, trigger_interval=400
    )
    sink, _ = _run(paced, lambda s: s.key_by("k").window(assigner).count(), batches=ONE_ROW_BATCHES, strategy=strategy)
    rows = sink.rows()
    assert all(r["count"] == 1 and r["window_end"] - r["window_start"] == 200 for r in rows)
    assert len(rows) >= len(ONE_ROW_BATCHES) - 2  # the last window(s) wait for later processing time
    assert len({r["window_start"] for r in rows}) == len(rows)


@pytest.mark.parametrize(
    "assigner, spark_function",
    [
        (__import__("ember").SlidingProcessingTimeWindows.of(1_000, 500), "window"),
        (__import__("ember").ProcessingTimeSessionWindows.with_gap(1_000), "session_window"),
        (SlidingEventTimeWindows.of(1_000, 250), "window"),
    ],
)
def test_every_assigner_compiles_to_native_spark_windows(env, assigner, spark_function):
    src = env.from_source(ScriptedSource(BATCHES, SCHEMA), BOUND, name="events")
    src.key_by("k").window(assigner).aggregate(n=Agg.count()).sink_to(CollectSink())
    plan = env.explain()
    assert f" {spark_function}#" in plan  # Spark's own window expression
    physical = plan.split("== Physical Plan ==")[1]
    assert "EventTimeWatermark" in physical
    assert not any(op in physical for op in ("MapInArrow", "MapInPandas", "ArrowEvalPython", "FlatMapGroupsIn"))
