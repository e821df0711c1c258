"""Window joins (issue 17): Flink's ``a.join(b).where(k).equal_to(k).window(assigner)``,
checked against the model (tests/flink_model.py: ``window_join``, ``session_window_join``)
batch by batch — out of order and late records, tumbling, sliding and session windows, inner
and outer — and batch-split invariance."""

from __future__ import annotations

import random
from datetime import timedelta

import flink_model as model
import pytest

from ember import (
    CollectSink,
    EventTimeSessionWindows,
    ScriptedSource,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
BOUND = 1_000


def _streams(seed: int, batches: int = 8) -> tuple[list[list[tuple]], list[list[tuple]]]:
    rng = random.Random(seed)
    left, right, front = [], [], 1_000
    for _ in range(batches):
        front += rng.randint(800, 2_000)
        for out in (left, right):
            batch = [(max(0, front - rng.randint(0, BOUND)), rng.choice("ab"), rng.randint(0, 99))
                     for _ in range(rng.randint(0, 5))]
            if front > 8_000 and rng.random() < 0.5:  # behind the watermark by more than a window: late
                batch.append((front - rng.randint(7_000, 8_000), rng.choice("ab"), -1))
            out.append(batch)
    return left, right


def _label(batch_id: int, batches: int) -> int | str:
    return batch_id if batch_id < batches else model.END


def _job(env, left, right, assigner, how, name):
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND), "ts")
    a = env.from_source(ScriptedSource(left, SCHEMA), strategy, name="left")
    b = env.from_source(ScriptedSource(right, SCHEMA), strategy, name="right")
    return a.join(b, how=how).where("k").equal_to("k").window(assigner), name


def _pair(left, right):
    return {"k": (left or right)["k"], "lts": left and left["ts"], "lv": left and left["v"],
            "rts": right and right["ts"], "rv": right and right["v"]}


PAIR = "k string, lts bigint, lv int, rts bigint, rv int"


@pytest.mark.parametrize("seed, size, slide, how", [
    (1, 2_000, 2_000, "inner"),
    (2, 3_000, 1_000, "full_outer"),
    pytest.param(3, 2_000, 2_000, "left_outer", marks=pytest.mark.slow),
    pytest.param(4, 3_000, 1_500, "right_outer", marks=pytest.mark.slow),
])
def test_window_join_equals_the_model(env, seed, size, slide, how):
    left, right = _streams(seed)
    assigner = TumblingEventTimeWindows.of(size) if size == slide else SlidingEventTimeWindows.of(size, slide)
    joined, name = _job(env, left, right, assigner, how, "joined")
    sink = CollectSink()
    joined.apply(_pair, PAIR, name=name).sink_to(sink)
    result = env.execute(f"window-join-{seed}", progress=False)
    got = sorted(((_label(b.batch_id, len(left)), r["k"], r["lts"], r["lv"], r["rts"], r["rv"])
                  for b in sink.batches for r in b.rows), key=repr)
    expected, late = model.window_join(left, right, BOUND, size, slide, how)
    assert len(expected) > 5 and late > 0
    assert got == sorted(expected, key=repr)
    assert result.late_dropped == late


def test_select_projects_pairs_natively(env, spark, tmp_path):
    left = [[(1_000, "a", 1), (1_500, "b", 2)], [(5_000, "a", 9)]]
    right = [[(1_200, "a", 10)], [(1_900, "b", 20), (5_500, "c", 30)]]
    joined, _ = _job(env, left, right, TumblingEventTimeWindows.of(2_000), "inner", "sel")
    sink, all_fields = CollectSink(), CollectSink()
    joined.select("left.k AS k", "right.v - left.v AS diff", "right.ts AS rts", name="sel").sink_to(sink)
    env.execute("window-join-select", progress=False)
    assert sorted((r["k"], r["diff"], r["rts"]) for r in sink.rows()) == [("a", 9, 1_200), ("b", 18, 1_900)]
    from ember import StreamEnvironment

    env2 = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path / "all", parallelism=2, spark=spark)
    joined2, _ = _job(env2, left, right, TumblingEventTimeWindows.of(2_000), "inner", "all")
    joined2.select(name="all").sink_to(all_fields)
    env2.execute("window-join-all", progress=False)
    assert sorted(tuple(r.values()) for r in all_fields.rows()) == [(1_000, "a", 1, 1_200, "a", 10), (1_500, "b", 2, 1_900, "b", 20)]
    assert list(all_fields.rows()[0]) == ["ts", "k", "v", "right_ts", "right_k", "right_v"]


def _ordered() -> tuple[list[tuple], list[tuple]]:
    rng = random.Random(7)
    stamps = sorted(rng.sample(range(0, 40_000), 80))
    left = [(ts, rng.choice("ab"), i) for i, ts in enumerate(stamps[::2])]
    right = [(ts, rng.choice("ab"), i) for i, ts in enumerate(stamps[1::2])]
    return left, right


@pytest.mark.parametrize("parts", [pytest.param(1, marks=pytest.mark.slow), 5, pytest.param(17, marks=pytest.mark.slow)])
def test_batch_split_invariance(env, parts):
    left, right = _ordered()
    split = [[[r for r in rows if i * 40_000 // parts <= r[0] < (i + 1) * 40_000 // parts] for i in range(parts)]
             for rows in (left, right)]
    joined, _ = _job(env, split[0], split[1], SlidingEventTimeWindows.of(4_000, 2_000), "inner", "split")
    sink = CollectSink()
    joined.apply(_pair, PAIR, name="split").sink_to(sink)
    env.execute(f"window-join-split-{parts}", progress=False)
    expected, late = model.window_join([left], [right], BOUND, 4_000, 2_000)
    assert late == 0 and len(expected) > 20
    assert sorted(((r["k"], r["lts"], r["rts"]) for r in sink.rows()), key=repr) == sorted(((e[1], e[2], e[4]) for e in expected), key=repr)


def _joined_rows(sink, batches):
    return sorted(((_label(b.batch_id, batches), r["k"], r["lts"], r["lv"], r["rts"], r["rv"])
                   for b in sink.batches for r in b.rows), key=repr)


@pytest.mark.parametrize("seed, gap, how", [
    (5, 700, "inner"),
    pytest.param(6, 1_200, "full_outer", marks=pytest.mark.slow),
    pytest.param(7, 400, "left_outer", marks=pytest.mark.slow),
])
def test_session_window_join_equals_the_model(env, seed, gap, how):
    """Sessions merge over both streams (a left record can join two right records that only
    a third record's session connects), fire at their last timestamp, and a record that
    merges with no open session and whose own session has closed is late."""
    left, right = _streams(seed)
    joined, name = _job(env, left, right, EventTimeSessionWindows.with_gap(gap), how, "sessions")
    sink = CollectSink()
    joined.apply(_pair, PAIR, name=name).sink_to(sink)
    result = env.execute(f"session-join-{seed}", progress=False)
    expected, late = model.session_window_join(left, right, BOUND, gap, how)
    assert len(expected) > 5 and late > 0
    assert _joined_rows(sink, len(left)) == sorted(expected, key=repr)
    assert result.late_dropped == late


def test_sessions_merge_across_streams_and_a_record_behind_the_watermark_can_join_an_open_one(env):
    """Hand-checked, gap 1 s, bound 1 s. Key a: left 1,000 and right 2,500 open two sessions;
    right 1,800 (the next batch) touches both, so all three are one session: 2 pairs. Before
    the last batch the watermark is 4,999 (both streams' latest 6,000 - 1,001). There, left
    3,000's own session [3,000, 4,000) has closed, but it touches the open [4,000, 5,900)
    (left 4,000, right 4,900) and joins it; left 1,500's touches nothing open: late."""
    left = [[(1_000, "a", 1)], [], [(4_000, "a", 3), (6_000, "b", 7)], [(3_000, "a", 4), (1_500, "a", 5)]]
    right = [[(2_500, "a", 10)], [(1_800, "a", 20)], [(4_900, "a", 30), (6_000, "b", 70)], []]
    joined, name = _job(env, left, right, EventTimeSessionWindows.with_gap(1_000), "inner", "merged")
    sink = CollectSink()
    joined.apply(_pair, PAIR, name=name).sink_to(sink)
    result = env.execute("session-join-hand", progress=False)
    got = sorted((r["k"], r["lts"], r["rts"]) for r in sink.rows())
    assert got == [("a", 1_000, 1_800), ("a", 1_000, 2_500), ("a", 3_000, 4_900), ("a", 4_000, 4_900), ("b", 6_000, 6_000)]
    assert result.late_dropped == 1
    expected, late = model.session_window_join(left, right, BOUND, 1_000)
    assert sorted((e[1], e[2], e[4]) for e in expected) == got and late == 1


@pytest.mark.slow  # the split invariance of the co-process runtime is in make test with the sliding join above
@pytest.mark.parametrize("parts", [1, 6])
def test_session_join_batch_split_invariance(env, parts):
    left, right = _ordered()
    split = [[[r for r in rows if i * 40_000 // parts <= r[0] < (i + 1) * 40_000 // parts] for i in range(parts)]
             for rows in (left, right)]
    joined, _ = _job(env, split[0], split[1], EventTimeSessionWindows.with_gap(900), "full_outer", "split")
    sink = CollectSink()
    joined.apply(_pair, PAIR, name="split").sink_to(sink)
    env.execute(f"session-join-split-{parts}", progress=False)
    expected, late = model.session_window_join([left], [right], BOUND, 900, "full_outer")
    assert late == 0 and len(expected) > 20 and any(e[2] is None or e[4] is None for e in expected)
    assert sorted(((r["k"], r["lts"], r["rts"]) for r in sink.rows()), key=repr) == sorted(((e[1], e[2], e[4]) for e in expected), key=repr)


def test_shopping_sessions_example(load_example):
    example = load_example("shopping_sessions")
    result = example.run()
    got = sorted(((r["user"], r["viewed_at"], r["page"], r["bought"]) for r in result["rows"].rows()), key=repr)
    assert got == sorted([("ann", 0, "home", "shoes"), ("ann", 25_000, "shoes", "shoes"), ("ann", 50_000, "cart", "shoes"),
                          ("bob", 5_000, "home", "tv"), ("bob", 20_000, "tv", "tv"), ("bob", 200_000, "radio", None)], key=repr)
    assert result["late"] == 1  # eve's view at 10 s
    expected, late = model.session_window_join(example.VIEWS, example.PURCHASES, 5_000, 30_000, "left_outer")
    assert sorted(((e[1], e[2], e[3], e[5]) for e in expected), key=repr) == got and late == 1


@pytest.mark.parametrize("assigner", [
    __import__("ember").TumblingProcessingTimeWindows.of(200),
    pytest.param(__import__("ember").ProcessingTimeSessionWindows.with_gap(150), marks=pytest.mark.slow),
])
def test_processing_time_window_join_pairs_records_of_one_micro_batch(env, assigner):
    """Processing time: a record is in the windows of its micro-batch's time. Batches >= 400 ms
    apart, windows of 200 ms (sessions with a 150 ms gap): each batch's left and right record
    pair with each other and with nothing else; a window fires once a later batch's time
    passes it, so the last may not fire before the bounded input ends (as in Flink)."""
    from ember import StreamEnvironment

    paced = StreamEnvironment(master="local[2]", checkpoint_dir=env.config.checkpoint_dir, parallelism=2,
                              spark=env.spark, trigger_interval=400)
    left = [[(i, "a", i)] for i in range(6)]
    right = [[(i, "a", 10 + i)] for i in range(6)]
    a = paced.from_source(ScriptedSource(left, SCHEMA), name="left")
    b = paced.from_source(ScriptedSource(right, SCHEMA), name="right")
    sink = CollectSink()
    a.join(b).where("k").equal_to("k").window(assigner).apply(_pair, PAIR, name="paced").sink_to(sink)
    result = paced.execute("processing-time-join", progress=False)
    pairs = sorted((r["lv"], r["rv"]) for r in sink.rows())
    assert all(rv == lv + 10 for lv, rv in pairs) and len(set(pairs)) == len(pairs)
    assert len(pairs) >= len(left) - 2
    assert result.late_dropped == 0


def test_event_time_windows_on_streams_without_event_time_fail_before_the_job_starts(env):
    a = env.from_source(ScriptedSource([[(1, "a", 1)]], SCHEMA), name="left")
    b = env.from_source(ScriptedSource([[(1, "a", 2)]], SCHEMA), name="right")
    a.join(b).where("k").equal_to("k").window(TumblingEventTimeWindows.of(1_000)).apply(_pair, PAIR, name="untimed").sink_to(CollectSink())
    with pytest.raises(Exception, match="needs event time on both streams") as failure:
        env.execute("untimed-join", progress=False)
    assert "untimed" in str(failure.value)
