"""Redis Streams in, Redis / Redis Streams / PostgreSQL out, exactly once — on the real
Redis and PostgreSQL of this machine (EMBER_REDIS_URL, EMBER_POSTGRES_URL; a missing
service fails these tests, it does not skip them)."""

import collections
import os

import psycopg
import pytest

from ember import (
    CollectSink,
    PostgresSink,
    RedisSink,
    RedisStreamSink,
    RedisStreamSource,
    StreamEnvironment,
)
from ember.bench.jobs import ALERT_SCHEMA, StateMachine
from ember.connectors.external import postgres_url
from ember.errors import PipelineError
from ember.tools.produce import STATEMACHINE_SCHEMA, ProduceConfig, produce

pytestmark = pytest.mark.spark


def _pg_rows(table, columns="*"):
    with psycopg.connect(postgres_url()) as conn:
        return conn.execute(f'select {columns} from "{table}"').fetchall()


def test_stream_source_reads_every_entry_once_and_dead_letters_bad_ones(env, r, prefix):
    streams = [f"{prefix}:0", f"{prefix}:1"]
    expected = collections.Counter()
    for i in range(3_000):
        r.xadd(streams[i % 2], {"k": i % 7, "v": i, "note": f"n{i}"})
        expected[(i % 7, i)] += 1
    bad_id = r.xadd(streams[0], {"k": "seven", "v": 1})  # wrong type
    r.xadd(streams[1], {"k": 3})  # v is NOT NULL
    r.xadd(streams[1], {"k": 4, "v": 99_999_999_999})  # fits bigint
    expected[(4, 99_999_999_999)] += 1
    r.xadd(streams[0], {"k": 2**40, "v": 5})  # overflows int
    sink = CollectSink()
    source = RedisStreamSource(streams, "k int, v bigint not null", max_events_per_batch=700, stop_at_end=True)
    env.from_source(source, name="entries").sink_to(sink)
    result = env.execute("redis-source", progress=False)
    got = collections.Counter((row["k"], row["v"]) for row in sink.rows())
    assert got == expected
    assert result.events == sum(expected.values())
    # Admission control: no batch above the bound (700 split over two streams).
    assert max(p["numInputRows"] for p in result.progress) <= 700
    assert result.batches >= 3_001 // 700
    dead0 = r.xrange(source.dead_letter_stream(streams[0]))
    dead1 = r.xrange(source.dead_letter_stream(streams[1]))
    assert [e[0] for e in dead0][0] == bad_id  # same id as the bad entry
    reasons = sorted(f[b"error"].decode() for _, f in dead0 + dead1)
    assert reasons == [
        "field 'k': cannot read '1099511627776' as int",
        "field 'k': cannot read 'seven' as int",
        "field 'v' is missing (declared NOT NULL)",
    ]
    assert dead0[0][1][b"k"] == b"seven"  # the raw record is kept


@pytest.mark.parametrize("reads", ["driver", "tasks"])
def test_stream_source_reports_lag(env, r, prefix, monkeypatch, reads):
    """Small batches are read in the driver's source process (Spark's simple reader, which
    Spark asks for no latest offset): the backlog then travels in the end offset."""
    if reads == "tasks":
        monkeypatch.setenv("EMBER_SOURCE_READS", "tasks")
    stream = f"{prefix}:0"
    for i in range(500):
        r.xadd(stream, {"v": i})
    reports = []
    source = RedisStreamSource(stream, "v int", max_events_per_batch=100, stop_at_end=True)
    sink = CollectSink()
    env.from_source(source).sink_to(sink)
    env.execute("redis-lag", progress=reports.append)
    # lag = entries added to the streams and not yet read, after each batch
    assert [p["lag"] for p in reports if p["numInputRows"]] == [400, 300, 200, 100, 0]
    assert sorted(row["v"] for row in sink.rows()) == list(range(500))
    reported_in = {"driver" if "added" in p["sources"][0]["endOffset"] else "tasks" for p in reports if p["numInputRows"]}
    assert reported_in == {reads}


@pytest.mark.parametrize("reads", ["driver", "tasks"])
def test_a_stream_added_on_restart_is_read_from_its_first_entry(spark, tmp_path, r, prefix, monkeypatch, reads):
    if reads == "tasks":
        monkeypatch.setenv("EMBER_SOURCE_READS", "tasks")
    first, second = f"{prefix}:a", f"{prefix}:b"

    def run(streams):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark)
        sink = CollectSink()
        env.from_source(RedisStreamSource(streams, "v int", max_events_per_batch=100, stop_at_end=True)).sink_to(sink)
        env.execute("redis-more-streams", progress=False)
        return sorted(row["v"] for row in sink.rows())

    for i in range(150):
        r.xadd(first, {"v": i})
        r.xadd(second, {"v": 1_000 + i})
    assert run([first]) == list(range(150))
    for i in range(150, 160):
        r.xadd(first, {"v": i})
    # restarted from the checkpoint: the first stream goes on after its last entry read, the
    # added one starts at its first (it was a KeyError before)
    assert run([first, second]) == list(range(150, 160)) + [1_000 + i for i in range(150)]


def test_unreachable_redis_fails_before_the_job_starts(env):
    source = RedisStreamSource("s", "v int", url="redis://127.0.0.1:1/0")
    env.from_source(source, name="entries").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'entries': cannot reach Redis"):
        env.execute("redis-down", progress=False)


def _alerts_job(env, streams, table, alerts_stream):
    source = RedisStreamSource(streams, STATEMACHINE_SCHEMA, max_events_per_batch=20_000)
    alerts = (
        env.from_source(source, name="events")  # no event time: no watermark-only batches
        .key_by("address")
        .process(StateMachine(), ALERT_SCHEMA, name="state-machine")
    )
    alerts.sink_to(PostgresSink(table), name="alerts-pg")
    alerts.sink_to(RedisStreamSink(alerts_stream), name="alerts-redis")


def test_sinks_write_a_replayed_batch_once(env, r, prefix, table, tmp_path):
    """Spark re-runs a batch whose commit it did not record (a crash after the sinks wrote);
    the fences make the replay write nothing new."""
    cfg = ProduceConfig("statemachine", prefix=prefix, partitions=2, rate=None, events=100_000, invalid_rate=0.002)
    produce(cfg)
    streams = [f"{prefix}:0", f"{prefix}:1"]
    ckpt = tmp_path / "replayed"
    _alerts_job(env, streams, table, f"{prefix}:alerts")
    first = env.execute("alerts", checkpoint=ckpt, progress=False, max_events=100_000)
    assert first.events == 100_000 and first.batches >= 5
    expected = collections.Counter(cfg.source().expected_alerts(100_000))
    assert len(expected) > 50
    assert collections.Counter(tuple(row) for row in _pg_rows(table, "address, state, type")) == expected
    # Roll the checkpoint back to just after the last batch with input was planned and its
    # sinks wrote, before Spark recorded its commit (a driver killed at that moment): the
    # restarted query runs that batch again. (Later batches had no input: the keyed
    # operator's timer checks.)
    last = [int(p["batchId"]) for p in first.progress if p["numInputRows"]][-1]
    for log in ("commits", "offsets"):
        for f in os.listdir(ckpt / log):
            b = f.strip(".").removesuffix(".crc")  # the log files and their checksums
            if b.isdigit() and (int(b) > last or (log == "commits" and int(b) == last)):
                os.remove(ckpt / log / f)
    again = StreamEnvironment(master="local[2]", parallelism=2, spark=env.spark)
    _alerts_job(again, streams, table, f"{prefix}:alerts")
    second = again.execute("alerts", checkpoint=ckpt, progress=False, stop_when_idle_s=2)
    assert second.progress[0]["batchId"] == last  # the batch really ran again
    assert second.events == next(p["numInputRows"] for p in first.progress if p["batchId"] == last)
    pg = collections.Counter(tuple(row) for row in _pg_rows(table, "address, state, type"))
    rs = collections.Counter(
        (int(f[b"address"]), f[b"state"].decode(), int(f[b"type"])) for _, f in r.xrange(f"{prefix}:alerts")
    )
    assert pg == expected
    assert rs == expected


def test_postgres_upsert_and_redis_sink_with_user_commands(env, r, prefix, table):
    streams = [f"{prefix}:in"]
    for i in range(1_000):
        r.xadd(streams[0], {"user": f"u{i % 10}", "amount": i})

    def total(pipe, row):  # user Redis commands, queued on the fenced transaction
        pipe.hincrby(f"{prefix}:totals", row["user"], row["amount"])

    events = env.from_source(RedisStreamSource(streams, "user string, amount int", max_events_per_batch=150, stop_at_end=True))
    events.sink_to(PostgresSink(table, mode="upsert", key="user"), name="latest")
    events.sink_to(RedisSink(total), name="totals")
    env.execute("upsert", progress=False)
    rows = dict(_pg_rows(table, "\"user\", amount"))
    assert rows == {f"u{u}": max(i for i in range(1_000) if i % 10 == u) for u in range(10)}  # the last write wins
    totals = {k.decode(): int(v) for k, v in r.hgetall(f"{prefix}:totals").items()}
    assert totals == {f"u{u}": sum(i for i in range(1_000) if i % 10 == u) for u in range(10)}


def test_a_redis_write_function_that_raises_fails_the_job_naming_the_sink_and_the_row(env, r, prefix):
    from ember import ScriptedSource
    from ember.errors import JobFailedError

    def bump(pipe, row):
        pipe.incr(f"{prefix}:n")
        if row["v"] == 2:
            raise KeyError("no such campaign")

    env.from_source(ScriptedSource([[(1, 1), (2, 2)]], "ts bigint, v int")).sink_to(RedisSink(bump), name="counts")
    with pytest.raises(JobFailedError, match=r"step 'counts': the sink's write function bump raised KeyError: "
                                             r"'no such campaign' on the row \{'ts': 2, 'v': 2\}"):
        env.execute("redis-write-raises", progress=False)
    assert r.get(f"{prefix}:n") is None  # the partition's transaction was not executed


def test_postgres_sink_checks_the_table_before_starting(env, r, prefix, table):
    with psycopg.connect(postgres_url(), autocommit=True) as conn:
        conn.execute(f'create table "{table}" (other text)')
    r.xadd(f"{prefix}:0", {"v": 1})
    env.from_source(RedisStreamSource(f"{prefix}:0", "v int", stop_at_end=True)).sink_to(PostgresSink(table), name="pg")
    with pytest.raises(Exception, match=r"has no column\(s\) \['v'\]"):
        env.execute("pg-check", progress=False)


def test_yahoo_windows_in_redis_with_the_benchmark_layout(env, r, prefix):
    from datetime import timedelta

    import pandas as pd

    from ember import TumblingEventTimeWindows, WatermarkStrategy, YahooSource
    from ember.connectors.external import yahoo_window_writer

    source = YahooSource(partitions=2, max_events=40_000, nominal_rate=10_000, skew_ms=50, seed=5, start_ms=1_700_000_000_000)
    campaigns = pd.DataFrame(source.campaign_table(), columns=["ad_id", "campaign_id"])
    (
        env.from_source(source, WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "event_time"))
        .filter("event_type = 'view'")
        .select("ad_id", "CAST(event_time AS BIGINT) AS event_time")
        .join_lookup(campaigns, on="ad_id")
        .key_by("campaign_id")
        .window(TumblingEventTimeWindows.of(timedelta(seconds=1)))
        .count()
        .sink_to(RedisSink(yahoo_window_writer(prefix=f"{prefix}:")), name="yahoo-redis")
    )
    env.execute("yahoo-redis", progress=False)
    expected = source.expected_window_counts(0, 40_000, source.start_ms, 1_000)
    got = {}
    for campaign in {c for c, _ in expected}:
        windows = r.hgetall(f"{prefix}:{campaign}")
        list_id = windows.pop(b"windows")
        assert sorted(r.lrange(list_id, 0, -1)) == sorted(windows)  # each window listed once
        for ts, window_id in windows.items():
            state = r.hgetall(window_id)
            got[(campaign, int(ts))] = int(state[b"seen_count"])
            assert int(state[b"time_updated"]) > 1_700_000_000_000
    assert got == expected and len(got) > 300
