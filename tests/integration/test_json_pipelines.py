"""JSON events into event-time windows in one job: parse_json's dead letters detour
through a spool (spool.py) so a window can follow the decoding step; with a JSON
generator right before it, the decoding runs inside the source's reader."""

import os

import pandas as pd
import pytest

from ember import CollectSink, OutputTag, TumblingEventTimeWindows, WatermarkStrategy, YahooSource

pytestmark = pytest.mark.spark

START = 1_700_000_000_000
SCHEMA = "ad_id string not null, event_type string not null, event_time string not null"


def test_decoded_json_feeds_a_window_and_dead_letters_reach_their_sink(env):
    """A decoding step of its own (examples/json_campaigns.py runs the fused one, test below)."""
    src = YahooSource(as_json=True, partitions=2, max_events=30_000, max_events_per_batch=10_000, nominal_rate=10_000,
                      seed=5, start_ms=START, malformed_every=997)
    bad = OutputTag("bad_json")
    events = env.from_source(src, WatermarkStrategy.for_bounded_out_of_orderness(1000, "event_time"), name="ad-events")
    events = events.select("event", name="as-is")  # a step between: decoded by parse_json's own Python step
    decoded = events.parse_json("event", SCHEMA, dead_letter=bad, name="decode")
    campaigns = pd.DataFrame(src.campaign_table(), columns=["ad_id", "campaign_id"])
    windows, dead = CollectSink(), CollectSink()
    (decoded.filter("event_type = 'view'").select("ad_id", "CAST(event_time AS BIGINT) AS event_time")
     .join_lookup(campaigns, on="ad_id").key_by("campaign_id").window(TumblingEventTimeWindows.of(1000))
     .count(name="views").sink_to(windows))
    decoded.get_side_output(bad).sink_to(dead, name="dead-letters")
    assert "MapInArrow" in env.explain()

    result = env.execute("json-windows")

    assert result.events == 30_000  # malformed events are input too
    expected = src.expected_window_counts(0, 30_000, START, 1000)
    assert {(r["campaign_id"], r["window_start"]): r["count"] for r in windows.rows()} == expected
    malformed = [r["event"] for r in src.records(src.seqs(0, 30_000), START) if not r["event"].endswith("}")]
    assert len(malformed) == 30 and sorted(r["raw"] for r in dead.rows()) == sorted(malformed)
    assert all(r["error"].startswith("invalid JSON: Expecting ',' delimiter") for r in dead.rows())
    spool = os.path.join(result.checkpoint_dir, "ember", "spool", "decode")
    assert os.path.isdir(spool) and os.listdir(spool) == []  # every micro-batch's spool written out and cleared


def test_a_keyed_step_on_the_dead_letters_beside_one_on_the_records(env):
    """Count windows on the decoded records and on the dead letters of the same decode step: the
    job fans out at the decode (fan_out_plan.root_fan_out), one lane reading its side output."""
    from collections import Counter

    from ember.connectors.generators import EVENT_TYPES

    src = YahooSource(as_json=True, partitions=2, max_events=1_000, malformed_every=7)
    bad = OutputTag("bad_json")
    per_type, errors, letters = CollectSink(), CollectSink(), CollectSink()
    decoded = env.from_source(src, name="ad-events").parse_json("event", SCHEMA, dead_letter=bad, name="decode")
    decoded.key_by("event_type").count_window(10).count(name="per-type").sink_to(per_type)
    dead = decoded.get_side_output(bad)
    dead.key_by("error").count_window(2).count(name="errors").sink_to(errors)
    dead.sink_to(letters, name="letters")
    result = env.execute("json-fan-out", progress=False)
    assert result.events == 1_000
    ref = src.reference(0, 1_000, 0)
    assert len(letters.rows()) == int(ref["malformed"].sum()) > 0
    valid = Counter(EVENT_TYPES[t] for t, cut in zip(ref["event_type"].tolist(), ref["malformed"].tolist()) if not cut)
    expected = {kind: n // 10 for kind, n in valid.items() if n // 10}
    assert Counter(r["event_type"] for r in per_type.rows()) == expected and {r["count"] for r in per_type.rows()} == {10}
    per_error = Counter(r["error"] for r in letters.rows())
    assert Counter(r["error"] for r in errors.rows()) == {e: n // 2 for e, n in per_error.items() if n // 2}
    assert {r["count"] for r in errors.rows()} == {2}


@pytest.mark.parametrize("predicate, pushed", [
    ("event_type = 'view'", ("event_type", ("view",))),
    ("'view' == EVENT_TYPE", ("event_type", ("view",))),
    ("event_type IN ('view', 'click')", ("event_type", ("view", "click"))),
    ("event_type = 5", None),                 # not a string literal: Spark's cast rules, not pushed
    ("upper(event_type) = 'VIEW'", None),     # a function of the field
    ("event_time = '17'", ("event_time", ("17",))),
    ("event_type = 'view' AND ad_id = 'x'", None),
])
def test_which_filters_the_source_applies_before_the_jvm(env, predicate, pushed):
    from ember.runner.spark.compilation import Compilation
    from ember.runner.spark.translators.decoding import _pushed_filter

    bad = OutputTag("bad_json")
    decoded = env.from_source(YahooSource(as_json=True), name="ad-events").parse_json("event", SCHEMA, dead_letter=bad,
                                                                                    name="decode")
    decoded.filter(predicate).sink_to(CollectSink())
    decoded.get_side_output(bad).sink_to(CollectSink())
    graph = env.graph()
    comp = Compilation(graph, env.spark, env.config, "pushdown", None)
    node = next(n for n in graph.nodes if n.name == "decode")
    assert _pushed_filter(comp, node) == pushed


def test_json_campaigns_example_decodes_in_the_source_and_is_exact(env, capsys, load_example):
    example = load_example("json_campaigns")
    example.build(env, YahooSource(as_json=True, max_events=10))
    assert "MapInArrow" not in env.explain()  # decoded inside the source's reader: no Python step of its own
    assert example.main(["--events", "40000", "--master", "local[2]"]) == 0
    out = capsys.readouterr().out
    assert "RESULT                EXACT" in out
    assert "dead letters          8 (malformed events generated: 8)" in out


def test_a_replayed_micro_batch_writes_its_detoured_dead_letters_once(env, r, prefix, tmp_path):
    """Spark re-runs a batch whose commit it did not record (a driver killed after the sinks
    wrote): its tasks spool the same dead letters again, and the fenced sink skips them."""
    from ember import NoopSink, RedisStreamSink, StreamEnvironment

    src = YahooSource(as_json=True, partitions=2, max_events=12_000, max_events_per_batch=4_000, nominal_rate=4_000,
                      seed=3, start_ms=START, malformed_every=500)

    def job(environment):
        bad = OutputTag("bad_json")
        decoded = environment.from_source(src, WatermarkStrategy.for_bounded_out_of_orderness(1000, "event_time"),
                                          name="ad-events").parse_json("event", SCHEMA, dead_letter=bad, name="decode")
        decoded.key_by("ad_id").window(TumblingEventTimeWindows.of(1000)).count(name="per-ad").sink_to(NoopSink())
        decoded.get_side_output(bad).sink_to(RedisStreamSink(f"{prefix}:dead"), name="dead-letters")

    ckpt = tmp_path / "replayed"
    job(env)
    first = env.execute("replay", checkpoint=ckpt, progress=False)
    malformed = sorted(r["event"] for r in src.records(src.seqs(0, 12_000), START) if not r["event"].endswith("}"))
    assert len(malformed) == 24 and sorted(f[b"raw"].decode() for _, f in r.xrange(f"{prefix}:dead")) == malformed
    last = [int(p["batchId"]) for p in first.progress if p["numInputRows"]][-1]
    for log in ("commits", "offsets"):  # roll back to just before Spark recorded batch `last`'s commit
        for f in os.listdir(ckpt / log):
            b = f.strip(".").removesuffix(".crc")
            if b.isdigit() and (int(b) > last or (log == "commits" and int(b) == last)):
                os.remove(ckpt / log / f)
    again = StreamEnvironment(master="local[2]", parallelism=2, spark=env.spark)
    job(again)
    second = again.execute("replay", checkpoint=ckpt, progress=False)
    assert second.progress[0]["batchId"] == last  # the batch really ran again
    assert sorted(f[b"raw"].decode() for _, f in r.xrange(f"{prefix}:dead")) == malformed  # each once
