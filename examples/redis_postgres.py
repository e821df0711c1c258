"""Yahoo ad events from Redis Streams to PostgreSQL, exactly once, with dead letters.

The events arrive as JSON strings in Redis streams (written by ``ember produce``'s
producer, plus a few malformed records). The job decodes them (``parse_json``),
joins each ad to its campaign (``join_lookup`` — unknown ads become dead letters
too), keeps the views and appends them to a PostgreSQL table exactly once; the
dead letters, each with its raw text and reason, go to a Redis stream. At the end
the views per campaign in PostgreSQL are checked against the generator.

    python examples/redis_postgres.py [--events 200000]

Needs the Redis and PostgreSQL servers of this machine (EMBER_REDIS_URL,
EMBER_POSTGRES_URL; defaults 127.0.0.1:6379 and postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import uuid

import numpy as np

from ember import OutputTag, PostgresSink, RedisStreamSink, RedisStreamSource, StreamEnvironment
from ember.connectors.external import postgres_url, redis_url
from ember.tools.produce import ProduceConfig, produce, stream_names

EVENT_JSON = "user_id string, ad_id string not null, event_type string not null, event_time string not null"


def build(env: StreamEnvironment, streams: list[str], campaigns: list[dict], table: str, dead_stream: str) -> None:
    bad_json, unknown_ad = OutputTag("bad_json"), OutputTag("unknown_ad")
    events = env.from_source(
        RedisStreamSource(streams, "event string not null", max_events_per_batch=100_000, stop_at_end=True),
        None, name="events",
    )
    decoded = events.parse_json("event", EVENT_JSON, dead_letter=bad_json, name="decode")
    joined = decoded.join_lookup(campaigns, on="ad_id", unmatched=unknown_ad, name="campaigns")
    (
        joined.filter("event_type = 'view'", name="views")
        .select("campaign_id", "ad_id", "CAST(event_time AS BIGINT) AS event_time")
        .sink_to(PostgresSink(table), name="views-postgres")
    )
    dead = decoded.get_side_output(bad_json).union(joined.get_side_output(unknown_ad))
    dead.sink_to(RedisStreamSink(dead_stream), name="dead-letters")


def main(argv: list[str] | None = None) -> int:
    import psycopg
    import redis

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    client = redis.Redis.from_url(redis_url())
    tag = uuid.uuid4().hex[:8]
    prefix, table = f"ember:example:{tag}", f"ember_example_views_{tag}"
    checkpoint = tempfile.mkdtemp(prefix="ember-redis-postgres-")
    try:
        produced = ProduceConfig("yahoo", prefix=prefix, partitions=2, events=args.events, rate=None)
        report = produce(produced)
        streams = stream_names(prefix, 2)
        for raw in ("{not json", '{"ad_id": 7, "event_type": "view", "event_time": "1"}',
                    '{"ad_id": "no-such-ad", "event_type": "view", "event_time": "1"}'):
            client.xadd(streams[0], {"event": raw})
        source = produced.source()
        campaigns = [{"ad_id": ad, "campaign_id": c} for ad, c in source.campaign_table()]
        env = StreamEnvironment(master=args.master, checkpoint_dir=checkpoint)
        build(env, streams, campaigns, table, f"{prefix}:dead")
        result = env.execute("redis-postgres")
        with psycopg.connect(postgres_url()) as conn:
            got = dict(conn.execute(f'select campaign_id, count(*) from "{table}" group by campaign_id').fetchall())
        ref = source.reference(0, report.events, report.origin_ms)
        camps = np.array(source.ids["campaigns"], dtype=object)
        expected = collections.Counter(camps[ref["ad"][ref["event_type"] == 0] // source.ads_per_campaign].tolist())
        dead = client.xrange(f"{prefix}:dead")
        print(result.summary())
        print(f"views in PostgreSQL: {sum(got.values()):,} over {len(got)} campaigns; generator: {sum(expected.values()):,} — "
              + ("EXACT" if got == dict(expected) else "MISMATCH"))
        print(f"dead letters: {len(dead)}")
        for _, fields in dead:
            print(f"  {fields[b'error'].decode()}  <-  {fields[b'raw'].decode()[:60]}")
        return 0 if got == dict(expected) and len(dead) == 3 else 1
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        with psycopg.connect(postgres_url(), autocommit=True) as conn:
            conn.execute(f'drop table if exists "{table}"')


if __name__ == "__main__":
    sys.exit(main())
