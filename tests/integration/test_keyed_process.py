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
