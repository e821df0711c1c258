"""The generators' Spark compilation equals their numpy reference models."""

from collections import Counter

import numpy as np
import pytest
from pyspark.sql import functions as F

from ember import CollectSink, GrepSource, GroupingSource, StateMachineSource, YahooSource
from ember.connectors.generators import EVENT_TYPES
from ember.connectors.hashing import spark_xxhash64

pytestmark = pytest.mark.spark


def test_numpy_xxhash64_equals_sparks(spark):
    values = [0, 1, -1, 42, 2**40 + 7, -(2**63), 2**63 - 1, 123456789]
    df = spark.createDataFrame([(v,) for v in values], "v bigint")
    got = [r[0] for r in df.select(F.xxhash64("v", F.lit(5).cast("bigint"))).collect()]
    assert got == spark_xxhash64(np.array(values), np.full(len(values), 5)).tolist()


def _collect(env, source, **execute):
    sink = CollectSink()
    env.from_source(source, name="gen").sink_to(sink)
    result = env.execute("gen", progress=False, **execute)
    return sink.rows(), result


def _yahoo_multiset(src, start, end, origin):
    ref = src.reference(start, end, origin)
    ads, types = src.ids["ads"], EVENT_TYPES
    return Counter(
        (ads[a], types[t], str(ts)) for a, t, ts in zip(ref["ad"].tolist(), ref["event_type"].tolist(), ref["event_time"].tolist())
    )


def test_yahoo_python_driver_matches_reference(env):
    src = YahooSource(partitions=2, max_events=5_000, max_events_per_batch=2_000, skew_ms=50, seed=7)
    rows, result = _collect(env, src)
    assert result.events == 5_000 and result.batches == 3
    origin = result.start_ms["gen"]
    assert Counter((r["ad_id"], r["event_type"], r["event_time"]) for r in rows) == _yahoo_multiset(src, 0, 5_000, origin)
    assert {r["ip_address"] for r in rows} == {"1.2.3.4"}


def test_yahoo_native_driver_matches_reference(env):
    src = YahooSource(partitions=2, max_events_per_batch=3_000, seed=1)  # unbounded speed: Spark's rate-micro-batch
    rows, result = _collect(env, src, max_events=5_000)
    assert result.events % 3_000 == 0 and result.events >= 5_000
    origin = result.start_ms["gen"]
    assert Counter((r["ad_id"], r["event_type"], r["event_time"]) for r in rows) == _yahoo_multiset(src, 0, result.events, origin)


def test_grep_records_match_reference(env):
    src = GrepSource(partitions=2, max_events=4_500, nominal_rate=1000)
    rows, result = _collect(env, src)
    origin = result.start_ms["gen"]
    expected = Counter(
        (src.sentences(seq % 2)[(seq // 2) % 2000], origin + seq) for seq in range(4_500)
    )
    assert Counter((r["sentence"], r["ts"]) for r in rows) == expected


def test_grouping_records(env):
    src = GroupingSource(partitions=2, max_events=3_000, hosts=7, sample_every=100)
    rows, _ = _collect(env, src)
    assert sorted(r["seq_id"] for r in rows) == list(range(3_000))
    assert all(r["host_id"] == r["seq_id"] % 7 and len(r["payload"]) == 12 for r in rows)
    assert all((r["ts"] > 0) == (r["seq_id"] % 100 == 0) for r in rows)


def test_grouping_records_with_event_time(env):
    """``event_time=True``: every record's ts is its event time (``ember bench peers`` windows on it)."""
    src = GroupingSource(partitions=2, max_events=3_000, hosts=7, nominal_rate=1_000, event_time=True, start_ms=5_000)
    rows, _ = _collect(env, src)
    assert sorted((r["seq_id"], r["host_id"], r["ts"]) for r in rows) == [
        (seq, seq % 7, 5_000 + seq * 1000 // 1_000) for seq in range(3_000)]


def test_state_machine_records_match_reference(env):
    src = StateMachineSource(partitions=2, max_events=6_000, active_addresses=50, frames_per_epoch=10, invalid_rate=0.01)
    rows, _ = _collect(env, src)
    expected = Counter()
    for p in range(2):
        addr, types, _ = src.events(p, 0, 3_000)
        expected.update(zip(addr.tolist(), types.tolist()))
    assert Counter((r["address"], r["type"]) for r in rows) == expected


def test_picked_values_keep_quotes_and_backslashes(spark):
    """Generators pick fields from one SQL array literal: every value arrives as declared."""
    from ember.runner.spark.translators.sources import _pick

    values = ["plain", "it's", "back\\slash", 'dou"ble', "üñí", "\\'", "end'", ""] + [f"s{i}" for i in range(500)]
    got = [r[0] for r in spark.range(len(values)).select(_pick(values, F.col("id"))).collect()]
    assert got == values


@pytest.mark.parametrize("reads", ["driver", "tasks"])
def test_a_generator_stopped_and_run_again_gives_every_event_once_read_in_the_driver_or_tasks(spark, tmp_path,
                                                                                               monkeypatch, reads):
    """Batches of at most 20,000 events are read in the driver (Spark's simple reader, replayed
    by offsets on a restart); the tasks' reader the same, for comparison."""
    from ember import StreamEnvironment
    from ember.runner.spark.translators.sources import IN_DRIVER_SWITCH

    if reads == "tasks":
        monkeypatch.setenv(IN_DRIVER_SWITCH, "tasks")
    src = GroupingSource(partitions=2, max_events=24_000, max_events_per_batch=5_000)
    seen = []
    for max_events in (9_000, None):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=str(tmp_path), parallelism=2, spark=spark)
        sink = CollectSink()
        env.from_source(src, name="gen").select("seq_id", name="ids").sink_to(sink)
        env.execute("halves", progress=False, max_events=max_events)
        seen.append([r["seq_id"] for r in sink.rows()])
    assert 0 < len(seen[0]) < 24_000 and sorted(seen[0] + seen[1]) == list(range(24_000))
