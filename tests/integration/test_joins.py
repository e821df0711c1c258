"""Interval joins (issue 17): Spark's native stream-stream join with Flink's semantics,
checked against the independent model (tests/flink_model.py: ``interval_join``) on seeded
out-of-order streams — pairs batch by batch, late records dropped and counted, outer
joins' unmatched records, and results independent of how the input is cut into batches."""

from __future__ import annotations

from datetime import timedelta

import flink_model as model
import pytest

from ember import CollectSink, ScriptedSource, WatermarkStrategy

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
BOUND = 1_000


def _strategy(bound_ms: int = BOUND) -> WatermarkStrategy:
    return WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=bound_ms), "ts")


def _sides(seed: int) -> tuple[list[list[tuple]], list[list[tuple]]]:
    left = model.random_batches(seed, keys="ab")
    right = model.random_batches(seed + 100, keys="ab")
    for side in (left, right):  # both inputs start with a record: the join's watermark is then Flink's from batch 1
        side[0] = [(2_000, "a", 5), *side[0]]
    return left, right


def _job(env, left, right, how="inner", lower=-1_500, upper=2_000, name="joined"):
    sink = CollectSink()
    a = env.from_source(ScriptedSource(left, SCHEMA), _strategy(), name="left").key_by("k")
    b = env.from_source(ScriptedSource(right, SCHEMA), _strategy(), name="right").key_by("k")
    (a.interval_join(b, how=how, name=name).between(timedelta(milliseconds=lower), timedelta(milliseconds=upper))
        .select("coalesce(left.k, right.k) AS k", "left.ts AS lts", "left.v AS lv", "right.ts AS rts", "right.v AS rv").sink_to(sink))
    result = env.execute(name, progress=False)
    rows = [(b.batch_id, r["k"], r["lts"], r["lv"], r["rts"], r["rv"]) for b in sink.batches for r in b.rows]
    return sorted(rows, key=repr), result


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_inner_interval_join_equals_the_model_batch_by_batch(env, seed):
    left, right = _sides(seed)
    rows, result = _job(env, left, right)
    expected = model.interval_join(left, right, BOUND, -1_500, 2_000)
    assert expected.late > 0 and len(expected.pairs) > 5  # the stream exercises both
    assert rows == sorted(expected.pairs, key=repr)
    assert result.late_dropped == expected.late


def test_full_outer_join_emits_every_unmatched_record_once(env):
    left, right = _sides(4)
    rows, result = _job(env, left, right, how="full_outer", lower=-300, upper=300)
    expected = model.interval_join(left, right, BOUND, -300, 300)
    got_pairs = sorted((r[1:] for r in rows if r[2] is not None and r[4] is not None), key=repr)
    assert got_pairs == sorted((p[1:] for p in expected.pairs), key=repr)
    assert sorted((r[1], r[2], r[3]) for r in rows if r[4] is None) == sorted(expected.unmatched_left)
    assert sorted((r[1], r[4], r[5]) for r in rows if r[2] is None) == sorted(expected.unmatched_right)
    assert expected.unmatched_left and expected.unmatched_right
    assert result.late_dropped == expected.late


def _in_bound(seed: int, n: int) -> list[tuple]:
    """Records in arrival order, each at most the bound behind the latest before it: never late."""
    import random

    rng = random.Random(seed)
    front, out = 1_000, []
    for _ in range(n):
        front += rng.randint(0, 400)
        out.append((front - rng.randint(0, BOUND), rng.choice("ab"), rng.randint(1, 9)))
    return out


@pytest.mark.parametrize("parts", [pytest.param(1, marks=pytest.mark.slow), pytest.param(5, marks=pytest.mark.slow), 17])
def test_results_do_not_depend_on_the_batches(env, parts):
    left_records, right_records = _in_bound(7, 40), _in_bound(8, 40)
    left, right = model.split_evenly(left_records, parts), model.split_evenly(right_records, parts)
    rows, result = _job(env, left, right, how="left_outer", name=f"split-{parts}")
    expected = model.interval_join([left_records], [right_records], BOUND, -1_500, 2_000)
    assert expected.late == 0 == result.late_dropped
    assert sorted(r[1:] for r in rows if r[4] is not None) == sorted(p[1:] for p in expected.pairs)
    assert sorted((r[1], r[2], r[3]) for r in rows if r[4] is None) == sorted(expected.unmatched_left)


def test_process_function_sees_both_sides_and_the_boundary_is_flinks(env):
    """Bound 0: after (10000, a) the watermark is 9999 (Flink's), so a right record at 9999
    joins and one at 9998 is late; the pair's function may return one record, several or None."""
    left = [[(10_000, "a", 1), (10_000, "b", 2)], [], [(20_000, "a", 3)]]
    right = [[(10_000, "b", 10)], [(9_999, "a", 20), (9_998, "a", 30)], []]
    sink = CollectSink()
    a = env.from_source(ScriptedSource(left, SCHEMA), _strategy(0), name="l").key_by("k")
    b = env.from_source(ScriptedSource(right, SCHEMA), _strategy(0), name="r").key_by("k")

    def pair(lrec, rrec):
        if lrec["k"] == "b":
            return None
        return [(lrec["k"], rrec["ts"] - lrec["ts"]), {"k": lrec["k"] + "!", "delay": lrec["v"] + rrec["v"]}]

    a.interval_join(b).between(-1_000, 1_000).process(pair, "k string, delay bigint", name="pairs").sink_to(sink)
    result = env.execute("pairs", progress=False)
    assert [(bt.batch_id, sorted((r["k"], r["delay"]) for r in bt.rows)) for bt in sink.batches if bt.rows] == [
        (1, [("a", -1), ("a!", 21)])
    ]
    assert result.late_dropped == 1


def test_ad_attribution_example(spark, load_example):
    example = load_example("ad_attribution")
    result = example.run()
    pairs = sorted((b.batch_id, r["user"], r["ad"], r["delay_ms"]) for b in result["pairs"].batches for r in b.rows)
    assert pairs == [(0, "ann", "shoes", 5_000), (1, "bob", "tv", 2_000)]  # 13 s and 10.5 s are outside the 10 s
    outcomes = sorted((r["shown_at"], r["user"], r["ad"], r["click_delay_ms"]) for r in result["outcomes"].rows())
    assert outcomes == [(1_000, "ann", "shoes", 5_000), (2_000, "bob", "tv", 2_000),
                        (9_000, "ann", "tv", None), (30_000, "cid", "shoes", None)]
    assert result["late"] == (1, 1)  # dan's click at 500 ms, behind the watermark
