"""Two-input steps reading a stateful step's output (issue 17): a broadcast-state step after
a dedupe, a co-process step after a window — each checked against the model
(tests/flink_model.py). Event time flows as along a chain: the keyed step's rows keep their
timestamps, the two-input step's watermark is the least of its inputs' sources', and results
the upstream's watermark fired reach it ahead of that watermark."""

from __future__ import annotations

import os
from datetime import timedelta

import flink_model as model
import pytest
from test_broadcast import EVENTS, LIMITS, OUT, RULES, RuleCheck
from test_broadcast import _streams as broadcast_streams
from test_chains import CountSum, Dedupe, _distinct, _label
from test_connect import SCHEMA, Thresholds
from test_connect import _streams as connect_streams

from ember import CollectSink, KeyedProcessFunction, ScriptedSource, TumblingEventTimeWindows, WatermarkStrategy
from ember.savepoints import create_savepoint
from ember.state.descriptors import ValueStateDescriptor

pytestmark = pytest.mark.spark

BOUND_MS, EXPIRY_MS = 1_000, 3_000
STRATEGY = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND_MS), "ts")
JOIN_LOWER_MS, JOIN_UPPER_MS = -1_500, 2_000


def sums_as_events(stream, size, prefix=""):
    """Tumbling windows of ``size`` ms over ``stream`` keyed by ``k``, their sums as events
    (timestamp ``window_end - 1``, Flink's): a co-process step's first input."""
    return (stream.key_by("k").window(TumblingEventTimeWindows.of(size))
            .aggregate(CountSum(), output_schema="n bigint, v bigint", name=f"{prefix}sums")
            .map(lambda r: {"ts": r["window_end"] - 1, "k": r["k"], "v": r["v"]}, SCHEMA, name=f"{prefix}as-events"))


def alerts(sink, events):
    """A ``Thresholds`` step's output: (batch, or END after ``events``' last), what, key, ts), sorted."""
    return sorted(((_label(bt.batch_id, events), r["what"], r["k"], r["ts"]) for bt in sink.batches for r in bt.rows),
                  key=repr)


def join_into(left, right, sink):
    """``left`` interval-joined with ``right`` (keyed streams) within the test's bounds, both
    records' fields into ``sink``."""
    (left.interval_join(right, name="joined")
     .between(timedelta(milliseconds=JOIN_LOWER_MS), timedelta(milliseconds=JOIN_UPPER_MS))
     .select("left.k AS k", "left.ts AS lts", "left.v AS lv", "right.ts AS rts", "right.v AS rv").sink_to(sink))


def pairs(sink):
    """``join_into``'s pairs: (batch, key, left ts, left v, right ts, right v), sorted."""
    return sorted(((bt.batch_id, r["k"], r["lts"], r["lv"], r["rts"], r["rv"]) for bt in sink.batches for r in bt.rows),
                  key=repr)


def test_a_broadcast_step_after_a_dedupe_equals_the_model_on_the_distinct_events(env, tmp_path):
    """And a savepoint of the job reads each step's state as its own (Spark numbers the
    operators from the sink back: restart.spark_operator_ids)."""
    events, rules = broadcast_streams(7)
    with_duplicates = [b + b[:3] for b in events]  # the dedupe removes what each batch repeats
    distinct = _distinct(with_duplicates)
    assert sum(map(len, with_duplicates)) > sum(map(len, distinct))
    a = env.from_source(ScriptedSource(with_duplicates, EVENTS), STRATEGY, name="events")
    b = env.from_source(ScriptedSource(rules, RULES), STRATEGY, name="rules")
    sink = CollectSink()
    (a.key_by("k", "ts", "v").process(Dedupe(), EVENTS, name="dedupe")
     .key_by("k").connect(b.broadcast(LIMITS)).process(RuleCheck(), OUT, name="check").sink_to(sink))
    env.execute("dedupe-rules", progress=False)
    got = sorted(((_label(bt.batch_id, events), r["what"], r["name"], r["ts"], r["n"])
                  for bt in sink.batches for r in bt.rows), key=repr)
    expected = sorted(model.broadcast_rules(distinct, rules, BOUND_MS, EXPIRY_MS), key=repr)
    assert {e[1] for e in expected} == {"rule", "alert", "summary"}
    assert expected != sorted(model.broadcast_rules(with_duplicates, rules, BOUND_MS, EXPIRY_MS), key=repr)
    assert got == expected

    point = create_savepoint(os.path.join(env.config.checkpoint_dir, "dedupe-rules"), root=str(tmp_path / "sp"))
    assert [op["name"] for op in point.operators] == ["dedupe", "check"]
    seen = point.read_state("dedupe", env.spark)
    assert set(seen["state"]) == {"seen"}
    assert sorted(seen[["ts", "k", "v"]].itertuples(index=False, name=None)) == sorted(r for b in distinct for r in b)
    alerts = point.read_state("check", env.spark)  # every summary timer fired at the end: no count is left
    assert list(alerts.columns) == ["k", "state", "value"] and alerts.empty  # (not the dedupe's rows)


@pytest.mark.parametrize("seed", [3, pytest.param(4, marks=pytest.mark.slow)])
def test_a_co_process_step_after_a_window_sees_its_results_ahead_of_the_watermark(env, seed):
    """The window's results (timestamp ``end - 1``) are the co-process step's first input,
    rules its second: alerts and expiries in the batches the model says."""
    events, rules = connect_streams(seed, batches=10)
    size = 1_000
    a = env.from_source(ScriptedSource(events, SCHEMA), STRATEGY, name="events")
    b = env.from_source(ScriptedSource(rules, SCHEMA), STRATEGY, name="rules")
    sink = CollectSink()
    results = sums_as_events(a, size)
    results.connect(b).key_by("k", "k").process(Thresholds(), "what string, k string, ts bigint",
                                                name="thresholds").sink_to(sink)
    env.execute("window-thresholds", progress=False)
    got = alerts(sink, events)
    # Spark keeps one watermark per query, the least of its sources': the window follows the
    # rules' too (in Flink it would follow its own input's; docs/design/dataflow.md)
    ahead = model.tumbling_sums(events, BOUND_MS, size, model.two_input_watermarks(events, rules, BOUND_MS, after_last=True))
    assert ahead[:-2] != model.tumbling_sums(events, BOUND_MS, size)[:-1], "the rules should hold the window back"
    expected = sorted(model.thresholds(events, rules, BOUND_MS, EXPIRY_MS, ahead=ahead), key=repr)
    assert any(e[1] == "alert" for e in expected) and any(e[1] == "expired" for e in expected)
    assert got == expected


@pytest.mark.parametrize("rules_through", ["source", "sql"])
def test_a_co_process_step_after_a_sql_window_sees_its_results_ahead_of_the_watermark(env, rules_through):
    """As above, the window a SQL step's (its rows' event time the query's rowtime, Flink's
    ``window_end - 1``): alerts and expiries in the batches the model says — the rules straight
    from their source, or through a SQL step of their own (SQL steps on both inputs, each
    query's rows timed by its own ``rowtime``; its ``WHERE`` keeps the end-of-input row)."""
    events, rules = connect_streams(3 if rules_through == "source" else 4, batches=10)
    size = 1_000
    env.from_source(ScriptedSource(events, SCHEMA), STRATEGY, name="events").create_view("events")
    b = env.from_source(ScriptedSource(rules, SCHEMA), STRATEGY, name="rules")
    if rules_through == "sql":
        b.create_view("rules")
        b = env.sql("SELECT ts, k, v, rowtime FROM rules WHERE k IS NOT NULL", name="limits").select("ts", "k", "v")
    sink = CollectSink()
    results = env.sql(f"""SELECT unix_millis(window.end) - 1 AS ts, k, CAST(sum(v) AS INT) AS v,
                                 window.end - INTERVAL 1 MILLISECOND AS rowtime
                          FROM events GROUP BY k, window(rowtime, '{size} milliseconds')""", name="sums")
    results.select("ts", "k", "v").connect(b).key_by("k", "k").process(
        Thresholds(), "what string, k string, ts bigint", name="thresholds").sink_to(sink)
    env.execute("sql-window-thresholds", progress=False)
    got = alerts(sink, events)
    ahead = model.tumbling_sums(events, BOUND_MS, size, model.two_input_watermarks(events, rules, BOUND_MS, after_last=True))
    expected = sorted(model.thresholds(events, rules, BOUND_MS, EXPIRY_MS, ahead=ahead), key=repr)
    assert any(e[1] == "alert" for e in expected) and any(e[1] == "expired" for e in expected)
    assert got == expected


class LastLimit(KeyedProcessFunction):
    """Forwards every rule, keeping its key's latest limit."""

    def open(self, ctx):
        self.last = ctx.get_state(ValueStateDescriptor("last"))

    def process_element(self, rule, ctx):
        self.last.update(rule["v"])
        yield rule


def test_a_co_process_step_reading_a_stateful_step_on_each_input(env, tmp_path):
    """Events through a dedupe, rules through a step of their own, both into one co-process
    step: the model on the distinct events; each step's state reads back as its own from a
    savepoint (Spark numbers the two branches' operators depth first from the sink)."""
    events, rules = connect_streams(5)
    with_duplicates = [b + b[:2] for b in events]
    distinct = _distinct(with_duplicates)
    a = env.from_source(ScriptedSource(with_duplicates, SCHEMA), STRATEGY, name="events")
    b = env.from_source(ScriptedSource(rules, SCHEMA), STRATEGY, name="rules")
    sink = CollectSink()
    deduped = a.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    limits = b.key_by("k").process(LastLimit(), SCHEMA, name="limits")
    deduped.connect(limits).key_by("k", "k").process(Thresholds(), "what string, k string, ts bigint",
                                                      name="thresholds").sink_to(sink)
    env.execute("two-upstream", progress=False)
    got = alerts(sink, events)
    expected = sorted(model.thresholds(distinct, rules, BOUND_MS, EXPIRY_MS), key=repr)
    assert expected != sorted(model.thresholds(with_duplicates, rules, BOUND_MS, EXPIRY_MS), key=repr)
    assert got == expected

    point = create_savepoint(os.path.join(env.config.checkpoint_dir, "two-upstream"), root=str(tmp_path / "sp"))
    assert [(op["name"], op["spark operator id"]) for op in point.operators] == [
        ("dedupe", 1), ("limits", 2), ("thresholds", 0)]
    seen = point.read_state("dedupe", env.spark)
    assert sorted(seen[["ts", "k", "v"]].itertuples(index=False, name=None)) == sorted(r for b in distinct for r in b)
    last = point.read_state("limits", env.spark)
    latest = {}
    for batch in rules:
        for _ts, k, v in sorted(batch):
            latest[k] = v
    assert dict(zip(last["k"], last["value"])) == latest and set(last["state"]) == {"last"}


def test_a_co_process_step_reading_the_union_of_two_stateful_steps_on_one_input(env):
    """Events from two sources, each through its own dedupe, unioned into the first input of a
    co-process step whose second input is rules through a step of their own: the model on the
    distinct events, as if one source had carried them all."""
    events, rules = connect_streams(5)
    halves = [[[r for i, r in enumerate(b) if i % 2 == part] for b in events] for part in (0, 1)]
    sink = CollectSink()
    deduped = []
    for part, half in enumerate(halves):
        src = env.from_source(ScriptedSource([b + b[:1] for b in half], SCHEMA), STRATEGY, name=f"events-{part}")
        deduped.append(src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name=f"dedupe-{part}"))
    limits = env.from_source(ScriptedSource(rules, SCHEMA), STRATEGY, name="rules").key_by("k").process(
        LastLimit(), SCHEMA, name="limits")
    (deduped[0].union(deduped[1]).connect(limits).key_by("k", "k")
        .process(Thresholds(), "what string, k string, ts bigint", name="thresholds").sink_to(sink))
    env.execute("union-upstream", progress=False)
    got = alerts(sink, events)
    assert got == sorted(model.thresholds(events, rules, BOUND_MS, EXPIRY_MS), key=repr) and got


# -- interval joins beside other stateful steps (on Ember's keyed runtime) ---------------------------


def _join_sides(seed: int) -> tuple[list[list[tuple]], list[list[tuple]]]:
    left = model.random_batches(seed, keys="ab")
    right = model.random_batches(seed + 100, keys="ab")
    for side in (left, right):
        side[0] = [(2_000, "a", 5), *side[0]]
    return left, right


def test_an_interval_join_after_a_dedupe_equals_the_model_on_the_distinct_records(env):
    left, right = _join_sides(1)
    with_duplicates = [b + b[:2] for b in left]
    distinct = _distinct(with_duplicates)
    sink = CollectSink()
    a = env.from_source(ScriptedSource(with_duplicates, SCHEMA), STRATEGY, name="left")
    b = env.from_source(ScriptedSource(right, SCHEMA), STRATEGY, name="right")
    deduped = a.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    join_into(deduped.key_by("k"), b.key_by("k"), sink)
    result = env.execute("dedupe-join", progress=False)
    rows = pairs(sink)
    expected = model.interval_join(distinct, right, BOUND_MS, JOIN_LOWER_MS, JOIN_UPPER_MS)
    assert expected.late > 0 and len(expected.pairs) > 5
    assert len(model.interval_join(with_duplicates, right, BOUND_MS, JOIN_LOWER_MS, JOIN_UPPER_MS).pairs) > len(expected.pairs)
    assert rows == sorted(expected.pairs, key=repr)
    assert result.late_dropped == expected.late


@pytest.mark.parametrize("lower,upper", [(-300, 300), pytest.param(-1_500, 2_000, marks=pytest.mark.slow)])
def test_a_window_after_an_outer_interval_join_counts_pairs_at_the_later_records_time(env, lower, upper):
    """Each pair carries the later record's timestamp (Flink's), so the window downstream
    counts it in that record's window; the unmatched left records of the outer join reach it
    with their own timestamps when the watermark lets them go (late for the window if it has
    closed by then)."""
    from collections import Counter

    left, right = _join_sides(2)
    size = 2_000
    sink = CollectSink()
    a = env.from_source(ScriptedSource(left, SCHEMA), STRATEGY, name="left").key_by("k")
    b = env.from_source(ScriptedSource(right, SCHEMA), STRATEGY, name="right").key_by("k")
    (a.interval_join(b, how="left_outer", name="joined").between(lower, upper)
     .select("left.k AS k", "greatest(left.ts, coalesce(right.ts, left.ts)) AS ts", "right.ts IS NULL AS alone")
     .key_by("k", "alone").window(TumblingEventTimeWindows.of(size)).count(name="per-window").sink_to(sink))
    result = env.execute("join-window", progress=False)
    expected = model.interval_join(left, right, BOUND_MS, lower, upper)
    watermarks = model.two_input_watermarks(left, right, BOUND_MS)
    stamped = [(k, max(lts, rts), False, batch) for batch, k, lts, _, rts, _ in expected.pairs]
    counts: Counter = Counter()
    late = expected.late
    for k, ts, alone, batch in stamped:
        start = ts - ts % size
        if watermarks[batch] is not None and start + size - 1 <= watermarks[batch]:
            late += 1  # the pair is behind the window's watermark when it arrives
        else:
            counts[(k, alone, start)] += 1
    after = model.two_input_watermarks(left, right, BOUND_MS, after_last=True)
    for k, ts, _v in expected.unmatched_left:
        # it leaves in the first batch whose watermark passes ts + upper (or at the end of input),
        # reaching the window ahead of that watermark: judged by the batch before's
        leaves = next((j for j, wm in enumerate(after) if wm is not None and wm >= ts + upper + 1), len(after))
        start, judged = ts - ts % size, after[leaves - 1]
        if judged is not None and start + size - 1 <= judged:
            late += 1
        else:
            counts[(k, True, start)] += 1
    got = Counter()
    for r in sink.rows():
        got[(r["k"], r["alone"], r["window_start"])] += r["count"]
    assert expected.unmatched_left and len(expected.pairs) > 5  # (-1500, 2000): the unmatched record is late
    assert got == counts
    assert result.late_dropped == late
