"""Two connected streams (issue 17): a KeyedCoProcessFunction with keyed state and event-time
timers shared by both inputs, checked against the model (tests/flink_model.py: ``thresholds``);
the stateless co_map."""

from __future__ import annotations

import random
from datetime import timedelta

import flink_model as model
import pytest

from ember import CollectSink, KeyedCoProcessFunction, ScriptedSource, WatermarkStrategy
from ember.state.descriptors import ValueStateDescriptor

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
BOUND, EXPIRY = 1_000, 3_000


class Thresholds(KeyedCoProcessFunction):
    """Stream 2 sets a key's limit for EXPIRY ms (an event-time timer clears it); stream 1's
    records above their key's limit are alerts."""

    def open(self, ctx):
        self.limit = ctx.get_state(ValueStateDescriptor("limit"))

    def process_element1(self, event, ctx):
        limit = self.limit.value()
        if limit is not None and event["v"] > limit:
            yield ("alert", ctx.current_key, event["ts"])

    def process_element2(self, rule, ctx):
        self.limit.update(rule["v"])
        ctx.register_event_time_timer(rule["ts"] + EXPIRY)

    def on_timer(self, timestamp, ctx):
        self.limit.clear()
        yield ("expired", ctx.current_key, timestamp)


def _streams(seed: int, batches: int = 8) -> tuple[list[list[tuple]], list[list[tuple]]]:
    rng = random.Random(seed)
    used: set = set()

    def record(front: int, key: str, v: int) -> tuple:
        ts = front - rng.randint(0, BOUND)
        while (key, ts) in used or ts < 0:  # distinct timestamps per key: the order within a batch is defined
            ts += 1
        used.add((key, ts))
        return (ts, key, v)

    events, rules, front = [], [], 1_500
    for _ in range(batches):
        front += rng.randint(200, 1_500)
        events.append([record(front, rng.choice("ab"), rng.randint(0, 20)) for _ in range(rng.randint(0, 6))])
        rules.append([record(front, rng.choice("ab"), rng.randint(5, 15)) for _ in range(rng.randint(0, 2))])
    events[0].append((1_500, "a", 1))
    rules[0].append((1_400, "b", 10))
    return events, rules


def _label(batch_id: int, batches: int) -> int | str:
    return batch_id if batch_id < batches else model.END


@pytest.mark.parametrize("seed,layout", [(3, "blob"), pytest.param(3, "delta", marks=pytest.mark.slow),
                                         pytest.param(4, "blob", marks=pytest.mark.slow)])
def test_shared_state_and_timers_equal_the_model(spark, tmp_path, seed, layout):
    """Also on the delta state layout (issue 18): the keys' state in a log with a working copy."""
    from ember import StreamEnvironment

    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark, state_layout=layout)
    events, rules = _streams(seed)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND), "ts")
    a = env.from_source(ScriptedSource(events, SCHEMA), strategy, name="events")
    b = env.from_source(ScriptedSource(rules, SCHEMA), strategy, name="rules")
    sink = CollectSink()
    a.connect(b).key_by("k", "k").process(Thresholds(), "what string, k string, ts bigint", name="thresholds").sink_to(sink)
    result = env.execute("thresholds", progress=False)
    assert (result.counters.get("state_changed_keys", 0) > 0) == (layout == "delta")  # the step ran on the layout asked
    got = sorted(((_label(bt.batch_id, len(events)), r["what"], r["k"], r["ts"]) for bt in sink.batches for r in bt.rows), key=repr)
    expected = sorted(model.thresholds(events, rules, BOUND, EXPIRY), key=repr)
    assert any(e[1] == "alert" for e in expected) and any(e[1] == "expired" for e in expected)
    assert got == expected


def test_co_map_applies_one_function_per_stream(env):
    a = env.from_source(ScriptedSource([[(1, "a", 2)], [(2, "b", 3)]], SCHEMA), None, name="a")
    b = env.from_source(ScriptedSource([[(5, "x", 7)]], "ts bigint, name string, n int"), None, name="b")
    sink = CollectSink()
    (a.connect(b).map(lambda r: {"label": r["k"], "value": r["v"] * 10},
                      lambda r: {"label": r["name"], "value": -r["n"]}, "label string, value int")
     .sink_to(sink))
    env.execute("co-map", progress=False)
    assert sorted((r["label"], r["value"]) for r in sink.rows()) == [("a", 20), ("b", 30), ("x", -7)]


def test_a_window_after_the_connected_step_counts_what_it_emitted(env):
    """Steps chain after a co-process step as after any keyed step: a window downstream sees
    every alert and expiry it emitted (counted per kind against the model)."""
    from collections import Counter

    from ember import TumblingEventTimeWindows

    events, rules = _streams(3)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND), "ts")
    a = env.from_source(ScriptedSource(events, SCHEMA), strategy, name="events")
    b = env.from_source(ScriptedSource(rules, SCHEMA), strategy, name="rules")
    sink = CollectSink()
    (a.connect(b).key_by("k", "k").process(Thresholds(), "what string, k string, ts bigint", name="thresholds")
     .key_by("what").window(TumblingEventTimeWindows.of(100_000)).count(name="per-kind").sink_to(sink))
    env.execute("thresholds-counted", progress=False)
    expected = Counter(e[1] for e in model.thresholds(events, rules, BOUND, EXPIRY))
    assert {r["what"]: r["count"] for r in sink.rows()} == dict(expected) and len(expected) == 2
