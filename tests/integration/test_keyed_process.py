"""KeyedProcessFunction with ValueState: exact results, state across batches and restarts."""

import importlib.util
import os
from collections import Counter

import pytest

from ember import CollectSink, PipelineError, ScriptedSource, StateMachineSource, StreamEnvironment, WatermarkStrategy
from ember.api.functions import KeyedProcessFunction
from ember.state import ValueStateDescriptor

pytestmark = pytest.mark.spark

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


class RunningCount(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        yield {"k": ctx.current_key, "n": n, "ts": ctx.timestamp}


SCHEMA = "ts bigint, k string"
BATCHES = [
    [(1, "a"), (2, "b"), (3, "a")],
    [(5, "a"), (4, "c")],
    [(6, "b"), (7, "a")],
]


def _counts(env, batches, name="counts"):
    src = env.from_source(ScriptedSource(batches, SCHEMA), WatermarkStrategy.for_monotonous_timestamps("ts"), name="events")
    sink = CollectSink()
    src.key_by("k").process(RunningCount(), "k string, n bigint, ts bigint").sink_to(sink)
    env.execute(name, progress=False)
    return sink


def test_value_state_counts_per_key_across_batches(env):
    sink = _counts(env, BATCHES)
    expected, seen = [], Counter()
    for batch in BATCHES:
        for ts, k in batch:
            seen[k] += 1
            expected.append((k, seen[k], ts))
    assert sorted((r["k"], r["n"], r["ts"]) for r in sink.rows()) == sorted(expected)


def test_records_of_a_key_are_processed_in_timestamp_order_within_a_batch(env):
    sink = _counts(env, [[(30, "a"), (10, "a"), (20, "a")]])
    assert [(r["ts"], r["n"]) for r in sorted(sink.rows(), key=lambda r: r["n"])] == [(10, 1), (20, 2), (30, 3)]


def test_state_survives_a_restart_from_the_checkpoint(spark, tmp_path):
    def env():
        return StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark)

    first = _counts(env(), BATCHES[:2], name="restart")
    assert max(r["n"] for r in first.rows() if r["k"] == "a") == 3
    # the restarted job reads the same source; its offsets resume after batch 2
    second = _counts(env(), BATCHES, name="restart")
    assert sorted((r["k"], r["n"]) for r in second.rows()) == [("a", 4), ("b", 2)]


def test_state_machine_alerts_equal_injected_events(env):
    spec = importlib.util.spec_from_file_location("state_machine", os.path.join(ROOT, "examples", "state_machine.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    source = StateMachineSource(partitions=2, max_events=120_000, active_addresses=200, frames_per_epoch=20, invalid_rate=0.002)
    sink = example.build(env, source)
    result = env.execute("sm", progress=False)
    assert result.events == 120_000
    got = sorted((r["address"], r["state"], r["type"]) for r in sink.rows())
    expected = source.expected_alerts(120_000)
    assert len(expected) > 50
    assert got == expected


def test_process_validation(env):
    keyed = env.from_source(ScriptedSource(BATCHES, SCHEMA)).key_by("k")
    with pytest.raises(PipelineError, match="process takes a KeyedProcessFunction instance"):
        keyed.process(lambda r: r, "k string")
    with pytest.raises(PipelineError, match="needs an output_schema"):
        keyed.process(RunningCount(), "")


class EveryKind(KeyedProcessFunction):
    """Exercises list, map, reducing and aggregating state on each element."""

    def open(self, ctx):
        from ember.api.functions import AggregateFunction
        from ember.state import AggregatingStateDescriptor, ListStateDescriptor, MapStateDescriptor, ReducingStateDescriptor

        class Mean(AggregateFunction):
            def create_accumulator(self):
                return (0, 0)

            def add(self, value, acc):
                return (acc[0] + value, acc[1] + 1)

            def merge(self, a, b):
                return (a[0] + b[0], a[1] + b[1])

            def get_result(self, acc):
                return acc[0] / acc[1]

        self.seen = ctx.get_state(ListStateDescriptor("seen"))
        self.per_word = ctx.get_state(MapStateDescriptor("per_word"))
        self.biggest = ctx.get_state(ReducingStateDescriptor("biggest", reduce_fn=max))
        self.mean = ctx.get_state(AggregatingStateDescriptor("mean", aggregate_fn=Mean()))

    def process_element(self, value, ctx):
        self.seen.add(value["v"])
        self.per_word.put(value["w"], self.per_word.get(value["w"], 0) + 1)
        self.biggest.add(value["v"])
        self.mean.add(value["v"])
        yield (ctx.current_key, value["ts"], ",".join(map(str, self.seen.get())), self.per_word.get(value["w"]),
               len(self.per_word.keys()), self.biggest.get(), self.mean.get())


def test_list_map_reducing_and_aggregating_state(env):
    batches = [[(1, "a", "x", 5), (2, "b", "x", 1)], [(3, "a", "y", 2), (4, "a", "x", 9)], [(5, "b", "x", 4)]]
    src = env.from_source(ScriptedSource(batches, "ts bigint, k string, w string, v int"),
                          WatermarkStrategy.for_monotonous_timestamps("ts"))
    sink = CollectSink()
    src.key_by("k").process(EveryKind(), "k string, ts bigint, seen string, word_count int, words int, biggest int, mean double").sink_to(sink)
    env.execute("kinds", progress=False)
    expected, state = [], {}
    for ts, k, w, v in sorted(r for b in batches for r in b):
        s = state.setdefault(k, {"seen": [], "words": {}})
        s["seen"].append(v)
        s["words"][w] = s["words"].get(w, 0) + 1
        expected.append((k, ts, ",".join(map(str, s["seen"])), s["words"][w], len(s["words"]), max(s["seen"]), sum(s["seen"]) / len(s["seen"])))
    got = sorted(tuple(r.values()) for r in sink.rows())
    assert got == sorted(expected)


class Remember(KeyedProcessFunction):
    def __init__(self, ttl_ms):
        self.ttl_ms = ttl_ms

    def open(self, ctx):
        from ember.state import StateTtlConfig

        self.last = ctx.get_state(ValueStateDescriptor("last", default="(none)", ttl=StateTtlConfig.of(self.ttl_ms)))

    def process_element(self, value, ctx):
        yield (ctx.current_key, value["ts"], self.last.value(), ctx.current_processing_time)
        if value["v"] != "read-only":
            self.last.update(value["v"])


def test_state_ttl_expires_by_processing_time(spark, tmp_path):
    # Batches start >= 2 s apart; the TTL is 3 s: a value written in batch 0 is still
    # there in batch 1, and gone in batch 2 unless batch 1 rewrote it.
    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark, trigger_interval=2_000)
    batches = [
        [(1, "a", "a0"), (2, "b", "b0")],
        [(3, "a", "a1"), (4, "b", "read-only")],
        [(5, "a", "read-only"), (6, "b", "read-only")],
    ]
    src = env.from_source(ScriptedSource(batches, "ts bigint, k string, v string"), WatermarkStrategy.for_monotonous_timestamps("ts"))
    sink = CollectSink()
    src.key_by("k").process(Remember(3_000), "k string, ts bigint, last string, now bigint").sink_to(sink)
    env.execute("ttl", progress=False)
    rows = {r["ts"]: r for r in sink.rows()}
    now = {ts: rows[ts]["now"] for ts in rows}
    assert now[3] - now[1] < 3_000 <= now[5] - now[1]  # the premise: batch timing as scripted
    assert [rows[ts]["last"] for ts in (1, 2, 3, 4)] == ["(none)", "(none)", "a0", "b0"]
    assert rows[5]["last"] == "a1"  # rewritten in batch 1: alive
    assert rows[6]["last"] == "(none)"  # written in batch 0 only, read (not refreshed) in batch 1: expired
