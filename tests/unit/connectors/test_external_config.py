"""Redis entry decoding and the configuration errors of the external connectors,
the producer and chaos — no servers needed."""

from __future__ import annotations

import pytest

from ember import PostgresSink, RedisSink, RedisStreamSink, RedisStreamSource
from ember.connectors.external import parse_stream_schema
from ember.errors import ConfigError
from ember.runner.spark.redis_source import decode_entries
from ember.tools.chaos import ChaosConfig
from ember.tools.cluster import LocalCluster
from ember.tools.produce import ProduceConfig

FIELDS = list(parse_stream_schema("address int not null, type tinyint not null, note string, score double"))


def entry(i: int, *pairs: bytes) -> tuple[bytes, list[bytes]]:
    return (f"1-{i}".encode(), list(pairs))


def test_schema_parsing_normalises_types_and_nullability() -> None:
    assert parse_stream_schema("a integer NOT NULL, `b` long, c bool") == (
        ("a", "int", False), ("b", "bigint", True), ("c", "boolean", True),
    )


@pytest.mark.parametrize(
    "schema, message",
    [
        ("", "schema"),
        ("a int, a string", "declared twice"),
        ("a map<string,int>", "cannot read schema field"),
        ("a timestamp", "fields can be read as"),
    ],
)
def test_schema_errors(schema: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_stream_schema(schema)


def test_decode_fast_path_in_declared_order() -> None:
    entries = [
        entry(i, b"address", str(i).encode(), b"type", b"3", b"note", b"n%d" % i, b"score", b"1.5")
        for i in range(5)
    ]
    batch, bad = decode_entries(entries, FIELDS)
    assert bad == []
    assert batch.column("address").to_pylist() == [0, 1, 2, 3, 4]
    assert batch.column("type").to_pylist() == [3] * 5
    assert batch.column("note").to_pylist() == [f"n{i}" for i in range(5)]
    assert batch.column("score").to_pylist() == [1.5] * 5


def test_decode_fields_in_any_order_extra_and_missing_nullable() -> None:
    entries = [
        entry(0, b"type", b"1", b"address", b"7", b"extra", b"x"),
        entry(1, b"score", b" 2 ", b"address", b"8", b"type", b"2", b"note", b"hi"),
    ]
    batch, bad = decode_entries(entries, FIELDS)
    assert bad == []
    assert batch.to_pylist() == [
        {"address": 7, "type": 1, "note": None, "score": None},
        {"address": 8, "type": 2, "note": "hi", "score": 2.0},
    ]


def test_bad_entries_are_set_aside_with_their_reason_and_fields() -> None:
    good = entry(0, b"address", b"1", b"type", b"2")
    not_int = entry(1, b"address", b"one", b"type", b"2")
    overflow = entry(2, b"address", b"3", b"type", b"300")
    missing = entry(3, b"type", b"2")
    bad_utf8 = entry(4, b"address", b"4", b"type", b"1", b"note", b"\xff\xfe")
    batch, bad = decode_entries([good, not_int, overflow, missing, bad_utf8, good], FIELDS)
    assert batch.column("address").to_pylist() == [1, 1]
    reasons = {entry_id: reason for entry_id, _, reason in bad}
    assert set(reasons) == {b"1-1", b"1-2", b"1-3", b"1-4"}
    assert reasons[b"1-1"] == "field 'address': cannot read 'one' as int"
    assert reasons[b"1-2"] == "field 'type': cannot read '300' as tinyint"
    assert reasons[b"1-3"] == "field 'address' is missing (declared NOT NULL)"
    assert reasons[b"1-4"].startswith("field 'note': cannot read")
    raw_fields = {entry_id: values for entry_id, values, _ in bad}
    assert raw_fields[b"1-1"] == {b"address": b"one", b"type": b"2"}


def test_all_entries_bad_gives_an_empty_batch_of_the_schema() -> None:
    batch, bad = decode_entries([entry(0, b"address", b"x", b"type", b"1")], FIELDS)
    assert batch.num_rows == 0 and batch.schema.names == ["address", "type", "note", "score"]
    assert len(bad) == 1


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: RedisStreamSource([], "a int"), "one or more stream names"),
        (lambda: RedisStreamSource(["s", "s"], "a int"), "listed twice"),
        (lambda: RedisStreamSource(["s"], "a int", max_events_per_batch=0), "positive int"),
        (lambda: RedisStreamSource(["s"], "a int", dead_letter="dead"), "must contain"),
        (lambda: RedisStreamSource(["s", "s:dead-letter"], "a int"), "dead-letter stream is also read"),
        (lambda: RedisStreamSource(["s"], "a int", json_field=""), "json_field must name"),
        (lambda: RedisStreamSource(["s"], "a binary", json_field="event"), "cannot be binary"),
        (lambda: RedisSink("not a function"), "must be a function"),
        (lambda: RedisStreamSink(""), "non-empty name"),
        (lambda: RedisStreamSink("s", maxlen=0), "positive int"),
        (lambda: PostgresSink("drop table x;"), "must be a name"),
        (lambda: PostgresSink("t", mode="merge"), "mode must be one of"),
        (lambda: PostgresSink("t", mode="upsert"), "needs key"),
        (lambda: PostgresSink("t", key=["id"]), "only used with mode='upsert'"),
        (lambda: ProduceConfig("nexmark", events=10), "workload must be one of"),
        (lambda: ProduceConfig("statemachine"), "events, duration, or both"),
        (lambda: ProduceConfig("statemachine", events=10, rate=0), "rate must be > 0"),
        (lambda: ProduceConfig("statemachine", events=10, partitions=0), "partitions"),
        (lambda: ChaosConfig(kills=-1), "kills"),
        (lambda: ChaosConfig(rate=0), "rate"),
        (lambda: ChaosConfig(batch=0), "batch"),
        (lambda: ChaosConfig(workload="yahoo"), "workload"),
        (lambda: ChaosConfig(cluster=True, workers=0), "workers must be an int >= 1"),
        (lambda: ChaosConfig(workers=4), "applies to a cluster run"),
        (lambda: ChaosConfig(state_layout="rows"), "state layout must be"),
        (lambda: LocalCluster(workers=0), "workers"),
        (lambda: LocalCluster(cores=0), "cores"),
    ],
)
def test_configuration_errors_are_raised_when_declared(make, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_the_per_batch_bound_has_one_name_and_the_old_one_still_works():
    assert RedisStreamSource(["s"], "a int", max_events_per_batch=700).max_events_per_batch == 700
    with pytest.warns(DeprecationWarning, match="max_records_per_batch is now max_events_per_batch"):
        old = RedisStreamSource(["s"], "a int", max_records_per_batch=300)
    assert old.max_events_per_batch == 300 == old.max_records_per_batch
    with pytest.raises(ConfigError, match="give max_events_per_batch only"):
        RedisStreamSource(["s"], "a int", max_events_per_batch=1, max_records_per_batch=2)


def test_the_cluster_says_on_which_worker_each_state_bucket_ran_last(tmp_path):
    """Each worker has its own directory of working copies (its "disk"); a bucket that moved
    keeps a stale copy where it was, and counts only where its copy was written last."""
    import os

    cluster = LocalCluster(workers=3, work_dir=str(tmp_path))

    def copy(worker: int, bucket: str, mtime: float) -> None:
        where = tmp_path / f"worker-{worker}" / "ember-local-state" / "job" / "count" / bucket
        where.mkdir(parents=True, exist_ok=True)
        (where / "tag").write_text("t b")
        os.utime(where / "tag", (mtime, mtime))

    copy(0, "0", 100)
    copy(0, "1", 100)
    copy(1, "1", 200)  # bucket 1 moved from worker 0 to worker 1
    copy(1, "2", 50)
    assert cluster.state_copies() == {"worker-0": 1, "worker-1": 2, "worker-2": 0}
