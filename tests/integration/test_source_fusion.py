"""Source fusion: a Python source right before a keyed step packs its own records per
state bucket (keyed/packing.py); results, event counts and state buckets must be
exactly those of the separate packing step."""

import numpy as np
import pytest
from pyspark.sql import functions as F

from ember import CollectSink, StateMachineSource, StreamEnvironment, WatermarkStrategy
from ember.bench.jobs import ALERT_SCHEMA, StateMachineVectorized
from ember.connectors.hashing import spark_xxhash64

pytestmark = pytest.mark.spark

EVENTS = 120_000


def test_python_bucket_of_integer_keys_equals_spark_pmod_xxhash64(spark):
    rng = np.random.default_rng(7)
    a = rng.integers(-(2**31), 2**31, 500, dtype=np.int64)
    b = rng.integers(-128, 128, 500, dtype=np.int64)
    c = rng.integers(-(2**62), 2**62, 500, dtype=np.int64)
    rows = [(int(x), int(y), int(z)) for x, y, z in zip(a, b, c)]
    df = spark.createDataFrame(rows, "a int, b tinyint, c bigint")
    got = df.select(
        F.pmod(F.xxhash64("a"), F.lit(128)).alias("one"),
        F.pmod(F.xxhash64("a", "b", "c"), F.lit(128)).alias("three"),
        F.pmod(F.xxhash64("c"), F.lit(128)).alias("long"),
    ).collect()
    assert [r.one for r in got] == np.mod(spark_xxhash64(a, kinds=("int",)), 128).tolist()
    assert [r.three for r in got] == np.mod(spark_xxhash64(a, b, c, kinds=("int", "tinyint", "bigint")), 128).tolist()
    assert [r.long for r in got] == np.mod(spark_xxhash64(c, kinds=("bigint",)), 128).tolist()


def _state_machine(spark, tmp_path, fuse):
    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path / str(fuse), parallelism=2, spark=spark,
                            fuse_sources=fuse, max_events_per_batch=30_000)
    source = StateMachineSource(partitions=2, max_events=EVENTS, active_addresses=300, frames_per_epoch=20, invalid_rate=0.002)
    sink = CollectSink()
    (env.from_source(source, WatermarkStrategy.for_monotonous_timestamps("ts"), name="events")
     .key_by("address").process_batches(StateMachineVectorized(), ALERT_SCHEMA, name="state-machine").sink_to(sink))
    plan = env.explain()
    result = env.execute("fusion", progress=False)
    return source, sink, plan, result


def test_fused_and_separate_packing_give_the_same_exact_alerts_and_event_counts(spark, tmp_path):
    source, fused, fused_plan, fused_result = _state_machine(spark, tmp_path, True)
    _, separate, separate_plan, separate_result = _state_machine(spark, tmp_path, False)
    expected = source.expected_alerts(EVENTS)
    assert len(expected) > 50
    for sink in (fused, separate):
        assert sorted((r["address"], r["state"], r["type"]) for r in sink.rows()) == expected
    # Events are counted by the source's offsets when its rows are packed buckets.
    assert fused_result.events == separate_result.events == EVENTS
    assert fused_result.batches >= 4
    assert "MapInArrow" not in fused_plan and "MapInArrow" in separate_plan
    offsets = [r["sources"][0]["endOffset"] for r in fused_result.progress]
    assert all(o.get("packed") is True for o in offsets)


def test_a_job_restarted_with_fusion_finds_its_keys_state_in_the_same_buckets(spark, tmp_path):
    """Fusion changes how rows reach the operator, not the state layout: a job run
    without it and restarted with it (same checkpoint) continues every address's state."""

    def run(fuse, max_events):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark,
                                fuse_sources=fuse, max_events_per_batch=20_000)
        source = StateMachineSource(partitions=2, max_events=max_events, active_addresses=300, frames_per_epoch=20,
                                    invalid_rate=0.002)
        sink = CollectSink()
        (env.from_source(source, name="events")
         .key_by("address").process_batches(StateMachineVectorized(), ALERT_SCHEMA, name="state-machine").sink_to(sink))
        result = env.execute("restart", progress=False)
        return source, [(r["address"], r["state"], r["type"]) for r in sink.rows()], result

    _, first, first_result = run(False, EVENTS // 2)
    source, second, second_result = run(True, EVENTS)
    assert first_result.events == second_result.events == EVENTS // 2
    expected = source.expected_alerts(EVENTS)
    assert len(expected) > 50
    assert sorted(first + second) == expected
