"""CEP as a step of a job on Spark: matches per key equal the reference's (tests/cep_model.py)
on out-of-order event-time input, whatever the batching; timed-out partial matches to a side
output; SQL conditions; processing time; partial matches surviving a restart."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from datetime import timedelta

import cep_model
import pytest

from ember import CollectSink, OutputTag, RedisStreamSource, ScriptedSource, StreamEnvironment, WatermarkStrategy
from ember.cep import CEP, Pattern, PatternProcessFunction, SkipStrategy

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, user string, t string, v int"
BOUND = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=1_000), "ts")
OUT = "user string, start bigint, bs int, finish bigint"


def batches(seed: int, n: int = 6) -> list[list[tuple]]:
    """Out of order within the bound (never late); timestamps distinct per user."""
    rng = random.Random(seed)
    used: set = set()
    out = []
    for b in range(n):
        batch = []
        for _ in range(rng.randint(4, 14)):
            user = rng.choice(("u1", "u2", "u3"))
            ts = 1_000 + b * 1_000 + rng.randint(-800, 800)
            while (user, ts) in used:
                ts += 3
            used.add((user, ts))
            batch.append((ts, user, rng.choice("aabbcd"), rng.randint(0, 9)))
        out.append(batch)
    return out


def pattern(sql: bool) -> Pattern:
    c = "t = 'c'" if sql else (lambda e: e["t"] == "c")
    return (Pattern.begin("a").where(lambda e: e["t"] == "a")
            .followed_by("b").where(lambda e, ctx: e["t"] == "b" and e["v"] >= ctx["a"][0]["v"] - 5).one_or_more()
            .followed_by("c").where(c)
            .within(timedelta(seconds=3)))


def summary(m: dict) -> tuple:
    return (m["a"][0]["user"], m["a"][0]["ts"], len(m["b"]), m["c"][0]["ts"])


def expected(data: list[list[tuple]], p: Pattern, event_time: bool = True) -> list[tuple]:
    per_user = defaultdict(list)
    for batch in data:
        for ts, user, t, v in batch:
            per_user[user].append({"ts": ts, "user": user, "t": t, "v": v})
    out = []
    for events in per_user.values():
        if event_time:
            events.sort(key=lambda e: e["ts"])
        times = [e["ts"] for e in events] if event_time else [0] * len(events)
        out += [summary(m) for m in cep_model.emitted(p, events, times)]
    return sorted(out)


def run(env, data, p: Pattern, *, strategy=BOUND, name="cep") -> list[tuple]:
    sink = CollectSink()
    keyed = env.from_source(ScriptedSource(data, SCHEMA), strategy, name="events").key_by("user")
    CEP.pattern(keyed, p).select(lambda m: dict(zip(("user", "start", "bs", "finish"), summary(m))), OUT,
                                 name="sequences").sink_to(sink)
    env.execute(name, progress=False)
    return sorted((r["user"], r["start"], r["bs"], r["finish"]) for r in sink.rows())


def test_matches_equal_the_reference_whatever_the_batching(spark, tmp_path):
    def env():
        return StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark)

    data = batches(5)
    want = expected(data, pattern(sql=False))
    assert len(want) >= 3, "the data must produce matches for this test to mean anything"
    assert run(env(), data, pattern(sql=True), name="cep-batched") == want  # SQL condition for 'c', vectorised by Spark
    whole = [[row for batch in data for row in batch]]
    assert run(env(), whole, pattern(sql=False), name="cep-one-batch") == want


def test_a_pattern_over_a_stream_not_keyed_matches_across_every_record(env):
    """``CEP.pattern`` of a plain stream (Flink's non-keyed pattern, parallelism 1): one
    sequence over every record, whoever's — against the reference over the whole stream;
    the SQL condition exercises the projection before the step."""
    used: set = set()
    data = []
    for batch in batches(5):
        distinct = []
        for ts, user, t, v in batch:  # distinct timestamps over the whole stream: one order
            while ts in used:
                ts += 1
            used.add(ts)
            distinct.append((ts, user, t, v))
        data.append(distinct)
    events = sorted(({"ts": ts, "user": u, "t": t, "v": v} for b in data for ts, u, t, v in b), key=lambda e: e["ts"])
    want = sorted(summary(m) for m in cep_model.emitted(pattern(sql=False), events, [e["ts"] for e in events]))
    per_user = expected(data, pattern(sql=False))
    assert len(want) >= 3 and want != per_user  # matches across users: not the keyed result
    sink = CollectSink()
    stream = env.from_source(ScriptedSource(data, SCHEMA), BOUND, name="events")
    CEP.pattern(stream, pattern(sql=True)).select(lambda m: dict(zip(("user", "start", "bs", "finish"), summary(m))),
                                                  OUT, name="sequences").sink_to(sink)
    env.execute("cep-whole-stream", progress=False)
    assert sorted((r["user"], r["start"], r["bs"], r["finish"]) for r in sink.rows()) == want


def test_a_pattern_over_a_generator_not_keyed_packs_its_one_key_at_the_source(env):
    """A Python generator read straight into the step packs its records per state bucket
    itself (source fusion): with no key, all into bucket 0 (it crashed there)."""
    from ember import StateMachineSource

    sink = CollectSink()
    every_pair = Pattern.begin("x").where(lambda e: True).next("y").where(lambda e: True)
    events = env.from_source(StateMachineSource(max_events=2_000, partitions=2), name="events")
    CEP.pattern(events, every_pair).select(lambda m: {"x": m["x"][0]["address"]}, "x bigint", name="pairs").sink_to(sink)
    env.execute("cep-whole-generator", progress=False)
    assert len(sink.rows()) == 1_999  # each record and the next, over the whole stream


def test_late_events_are_dropped_and_counted(env):
    data = [[(5_000, "u1", "a", 1), (9_000, "u1", "x", 0)], [(2_000, "u1", "a", 1), (9_500, "u1", "b", 1), (9_600, "u1", "c", 1)]]
    sink = CollectSink()
    keyed = env.from_source(ScriptedSource(data, SCHEMA), BOUND).key_by("user")
    p = Pattern.begin("a").where(lambda e: e["t"] == "a").followed_by("b").where(lambda e: e["t"] == "b") \
        .followed_by("c").where(lambda e: e["t"] == "c")
    CEP.pattern(keyed, p).select(lambda m: {"start": m["a"][0]["ts"]}, "start bigint").sink_to(sink)
    result = env.execute("cep-late", progress=False)
    assert [r["start"] for r in sink.rows()] == [5_000]  # the a at 2000 came behind the watermark (7999)
    assert result.late_dropped == 1


def test_late_events_go_to_a_side_output_when_asked(spark, tmp_path):
    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark)
    data = [[(5_000, "u1", "a", 1), (9_000, "u1", "x", 0)], [(2_000, "u1", "a", 7), (9_500, "u1", "b", 1), (9_600, "u1", "c", 1)]]
    late = OutputTag("late", SCHEMA)
    keyed = env.from_source(ScriptedSource(data, SCHEMA), BOUND).key_by("user")
    p = Pattern.begin("a").where("t = 'a'").followed_by("b").where(lambda e: e["t"] == "b")
    matches = CEP.pattern(keyed, p).select(lambda m: {"start": m["a"][0]["ts"]}, "start bigint", late=late)
    main, side = CollectSink(), CollectSink()
    matches.sink_to(main)
    matches.get_side_output(late).sink_to(side)
    result = env.execute("cep-late-side", progress=False)
    assert [r["start"] for r in main.rows()] == [5_000]
    assert side.rows() == [{"ts": 2_000, "user": "u1", "t": "a", "v": 7}]  # as it came, without the SQL condition's column
    assert result.late_dropped == 0  # kept, not dropped


def test_events_a_condition_raises_on_are_dead_letters_and_the_job_goes_on(env):
    data = [[(1_000, "u1", "a", 0), (1_500, "u1", "a", 2), (2_000, "u1", "b", 1)], [(3_000, "u1", "a", 0), (3_500, "u1", "b", 3)]]
    bad = OutputTag("bad")
    keyed = env.from_source(ScriptedSource(data, SCHEMA), BOUND).key_by("user")
    p = Pattern.begin("a").where(lambda e: e["t"] == "a" and 10 // e["v"] > 1).followed_by("b").where("t = 'b'")
    matches = CEP.pattern(keyed, p).select(lambda m: {"start": m["a"][0]["ts"]}, "start bigint", dead_letter=bad)
    main, dead = CollectSink(), CollectSink()
    matches.sink_to(main)
    matches.get_side_output(bad).sink_to(dead)
    env.execute("cep-dead-letters", progress=False)
    assert [r["start"] for r in main.rows()] == [1_500]  # the a at 1000 never was: no second match through it
    letters = sorted(dead.rows(), key=lambda r: r["raw"])
    assert [json.loads(r["raw"]) for r in letters] == [{"ts": 1_000, "user": "u1", "t": "a", "v": 0},
                                                       {"ts": 3_000, "user": "u1", "t": "a", "v": 0}]
    assert {r["error"] for r in letters} == {"step 'pattern': a pattern condition raised ZeroDivisionError: integer division or modulo by zero"}


class Report(PatternProcessFunction):
    def process_match(self, match, ctx):
        yield {"user": match["a"][0]["user"], "kind": "match", "n": sum(len(v) for v in match.values())}

    def process_timed_out_match(self, match, ctx):
        yield {"user": match["a"][0]["user"], "first": match["a"][0]["ts"]}


def test_partial_matches_cut_short_by_within_go_to_the_side_output(env):
    partial = OutputTag("partial", "user string, first bigint")
    data = [[(1_000, "x", "a", 0), (1_000, "y", "a", 0), (2_500, "x", "b", 0)], [(4_200, "y", "b", 0), (5_000, "z", "a", 0)]]
    keyed = env.from_source(ScriptedSource(data, SCHEMA), BOUND).key_by("user")
    p = Pattern.begin("a").where(lambda e: e["t"] == "a").followed_by("b").where(lambda e: e["t"] == "b").within(timedelta(seconds=2))
    matches = CEP.pattern(keyed, p).process(Report(), "user string, kind string, n int", timed_out=partial)
    main, side = CollectSink(), CollectSink()
    matches.sink_to(main)
    matches.get_side_output(partial).sink_to(side)
    env.execute("cep-timeout", progress=False)
    assert [(r["user"], r["n"]) for r in main.rows()] == [("x", 2)]
    # y's b came 3.2 s after its a; z's a never got a b (timed out at the end of input)
    assert sorted((r["user"], r["first"]) for r in side.rows()) == [("y", 1_000), ("z", 5_000)]


def test_processing_time_matches_in_arrival_order_and_survive_a_restart(spark, tmp_path, r, prefix):
    p = (Pattern.begin("a", skip=SkipStrategy.skip_past_last_event()).where(lambda e: e["t"] == "a")
         .next("b").where(lambda e: e["t"] == "b").times(1, 2).consecutive()
         .followed_by("c").where(lambda e: e["t"] == "c"))
    data = batches(9)
    stream = f"{prefix}:events"

    def run_on_redis(part: list[list[tuple]]) -> list[tuple]:
        for batch in part:  # one stream: arrival order is the entries' order
            for ts, user, t, v in batch:
                r.xadd(stream, {"ts": ts, "user": user, "t": t, "v": v})
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark)
        sink = CollectSink()
        keyed = env.from_source(RedisStreamSource(stream, SCHEMA, stop_at_end=True, max_events_per_batch=20), name="events")
        CEP.pattern(keyed.key_by("user"), p).select(lambda m: dict(zip(("user", "start", "bs", "finish"), summary(m))), OUT,
                                                    name="sequences").sink_to(sink)
        env.execute("cep-restart", progress=False)
        return sorted((x["user"], x["start"], x["bs"], x["finish"]) for x in sink.rows())

    # Without event time there is no final flush: the first run leaves partial matches in
    # keyed state; the restart reads the entries added since, on the same checkpoint.
    first = run_on_redis(data[:3])
    rest = run_on_redis(data[3:])
    want = expected(data, p, event_time=False)
    assert len(want) >= 2
    assert sorted(first + rest) == want
    assert any(m not in expected(data[:3], p, event_time=False) for m in rest)  # a match spanning the restart


def test_login_attacks_example(spark, load_example, capsys):
    example = load_example("login_attacks")
    assert example.main(["--users", "150"]) == 0
    out = capsys.readouterr().out
    assert "check: every alert exact" in out and "logins timed out before the pattern completed" in out


def test_sensor_spikes_example(spark, load_example, capsys):
    example = load_example("sensor_spikes")
    assert example.main() == 0
    out = capsys.readouterr().out
    assert "check: every alert exact (2 alerts, 2 dead letters)" in out
    assert "check: every mean exact (4 windows, 2 dead letters)" in out
    assert example.expected_alerts() == [("s-1", 1_000, 2_000), ("s-2", 2_600, 3_100)]  # each across a garbled reading
