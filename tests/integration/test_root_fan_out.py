"""A stream read by several keyed steps, or by a keyed step and by a sink of its raw records,
before any keyed step (issue 17: a DAG, not a line): the job fans out at the source
(fan_out_plan.root_fan_out), its first keyed steps run as lanes of one Spark operator and the
raw records pass it. Checked against the independent model (tests/flink_model.py)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import timedelta

import flink_model as model
import pytest
from test_chains import BOUND, SCHEMA, CountSum, Dedupe, _distinct, _fired

from ember import (
    Agg,
    CollectSink,
    CountSink,
    KeyedProcessFunction,
    OutputTag,
    ScriptedSource,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
    YahooSource,
)
from ember.state.descriptors import ValueStateDescriptor

pytestmark = pytest.mark.spark


def _positive(r):
    if (r["k"], r["v"]) == ("c", 9):
        raise ValueError("c 9 is unsure")
    return r["v"] > 0


def test_a_dedupe_two_windows_and_a_raw_sink_reading_one_source_equal_the_flink_model(env):
    """The dedupe forwards each record's first occurrence; a Python window (through a Python
    filter, whose failures are dead letters) and a built-in count (which alone would run
    natively) read the raw records and fire in the micro-batch Flink fires them, each dropping
    its own late records; the raw sink gets every record as read, the dead letters' sink each
    record the filter raised on."""
    batches = model.random_batches(5)
    with_duplicates = [b + b[:2] for b in batches]
    sums = model.windows(with_duplicates, 1_000, "tumbling", 2_000, keep=lambda r: r[2] > 0 and r[1:] != ("c", 9))
    failed = Counter(r for b in with_duplicates for r in b if r[1:] == ("c", 9))
    assert failed
    counts = model.windows(with_duplicates, 1_000, "tumbling", 4_000)
    assert sums.late > 0 and counts.late > 0
    distinct, small, large, raw, dead = CollectSink(), CollectSink(), CollectSink(), CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(with_duplicates, SCHEMA), BOUND, name="events")
    src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe").sink_to(distinct, name="distinct")
    positive = src.filter(_positive, dead_letter=OutputTag("unsure"), name="positive")
    positive.get_side_output(OutputTag("unsure")).sink_to(dead, name="dead")
    (positive.key_by("k").window(TumblingEventTimeWindows.of(2_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="sums").sink_to(small))
    src.key_by("k").window(TumblingEventTimeWindows.of(4_000)).aggregate(n=Agg.count(), v=Agg.sum("v"), name="counts") \
        .sink_to(large)
    src.sink_to(raw, name="raw")
    plan = env.explain(spark_plan=False)
    assert "counts: window tumbling 4000 ms (event time) by k" in plan and "lane 2 of the Spark operator shared" in plan
    result = env.execute("root-fan-out", progress=False)
    assert Counter((r["ts"], r["k"], r["v"]) for r in distinct.rows()) == Counter(r for b in _distinct(with_duplicates) for r in b)
    assert _fired(small, batches, "v") == sums.fired
    assert _fired(large, batches, "v") == counts.fired
    assert Counter((r["ts"], r["k"], r["v"]) for r in raw.rows()) == Counter(r for b in with_duplicates for r in b)
    assert result.late_dropped == sums.late + counts.late
    assert Counter(tuple(json.loads(r["raw"]).values()) for r in dead.rows()) == failed
    assert {r["error"] for r in dead.rows()} == {"step 'positive': _positive raised ValueError: c 9 is unsure"}


def test_one_window_beside_a_raw_sink_fires_as_flink_fires_it(env):
    """One keyed step and a raw sink: the job's one Spark stateful operator (Spark then judges
    late rows by the current batch's watermark); the window still fires in Flink's batch."""
    batches = model.random_batches(3)
    expected = model.windows(batches, 1_000, "tumbling", 2_000)
    assert expected.late > 0
    windows, raw = CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
    src.key_by("k").window(TumblingEventTimeWindows.of(2_000)).aggregate(CountSum(), output_schema="n bigint, v bigint",
                                                                          name="sums").sink_to(windows)
    src.sink_to(raw, name="raw")
    result = env.execute("root-fan-out-one-lane", progress=False)
    assert _fired(windows, batches, "v") == expected.fired and result.late_dropped == expected.late
    assert Counter((r["ts"], r["k"], r["v"]) for r in raw.rows()) == Counter(r for b in batches for r in b)


class Tally(KeyedProcessFunction):
    """Per key of the step: the running count, with every record."""

    def __init__(self, field):
        self.field = field

    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

    def process_element(self, value, ctx):
        n = self.n.value() + 1
        self.n.update(n)
        yield {"key": str(value[self.field]), "n": n}


ADS = YahooSource(partitions=2, max_events=12_000, nominal_rate=4_000, skew_ms=50, seed=5, start_ms=1_700_000_000_000)


def _ads_job(env, counts, views, raw, **execute):
    ads = env.from_source(ADS, WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=200), "event_time"),
                          name="ads")
    ads.key_by("ad_id").process(Tally("ad_id"), "key string, n bigint", name="per-ad").sink_to(counts)
    ads.filter("event_type = 'view'").key_by("ad_id").window(TumblingEventTimeWindows.of(1_000)).count(name="views") \
        .sink_to(views)
    ads.sink_to(raw, name="raw")
    return env.execute("ads-fan-out", progress=False, **execute)


def test_a_root_fan_out_resumes_from_its_checkpoint_with_every_lanes_state(spark, tmp_path):
    """Stopped after 4,000 events and started again on its checkpoint: each ad's running
    count goes on from where it was (1..n once each, across both runs), each window counts
    its views once, and every event reaches the raw sink once."""
    r = ADS.reference(0, 12_000, ADS.start_ms)
    names = ADS.ids["ads"]
    per_ad = Counter(names[a] for a in r["ad"].tolist())
    views = r["event_type"] == 0
    expected_views = Counter((names[a], t - t % 1_000) for a, t in zip(r["ad"][views].tolist(), r["event_time"][views].tolist()))
    runs = []
    for stop in ({"max_events": 4_000}, {}):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark,
                                max_events_per_batch=4_000)
        sinks = (CollectSink(), CollectSink(), CountSink())
        runs.append((sinks, _ads_job(env, *sinks, **stop)))
    (first, result), (second, rest) = runs
    assert 4_000 <= result.events < 12_000 and result.events + rest.events == 12_000
    seen = defaultdict(list)
    for r_ in first[0].rows() + second[0].rows():
        seen[r_["key"]].append(r_["n"])
    assert {ad: sorted(ns) for ad, ns in seen.items()} == {ad: list(range(1, n + 1)) for ad, n in per_ad.items()}
    assert any(ns and min(ns) > 1 for ns in (
        [r_["n"] for r_ in second[0].rows() if r_["key"] == ad] for ad in per_ad))  # the second run went on counting
    got = Counter()
    for r_ in first[1].rows() + second[1].rows():
        got[(r_["ad_id"], r_["window_start"])] += r_["count"]
    assert got == expected_views
    assert first[2].count + second[2].count == 12_000


def test_two_keyed_steps_on_one_stream_without_event_time_each_keep_their_own_state(env):
    batches = [[(i, "abc"[i % 3], i % 4) for i in range(b * 10, b * 10 + 10)] for b in range(3)]
    by_k, by_v, by_label, raw = CollectSink(), CollectSink(), CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(batches, SCHEMA), name="plain")  # no watermark: processing time
    src.key_by("k").process(Tally("k"), "key string, n bigint", name="by-k").sink_to(by_k)
    src.key_by("v").process(Tally("v"), "key string, n bigint", name="by-v").sink_to(by_v)
    # a branch's own select (its records reshaped on its copies only), keyed by what it made
    (src.select("ts", "concat(upper(k), '-', CAST(v % 2 AS STRING)) AS k", name="label").key_by("k")
        .process(Tally("k"), "key string, n bigint", name="by-label").sink_to(by_label))
    src.sink_to(raw, name="raw")
    env.execute("root-fan-out-processing-time", progress=False)
    records = [r for b in batches for r in b]
    labelled = [(ts, f"{k.upper()}-{v % 2}", v) for ts, k, v in records]
    for sink, field, rows in ((by_k, 1, records), (by_v, 2, records), (by_label, 1, labelled)):
        expected = Counter(str(r[field]) for r in rows)
        got = defaultdict(list)
        for row in sink.rows():
            got[row["key"]].append(row["n"])
        assert {k: sorted(ns) for k, ns in got.items()} == {k: list(range(1, n + 1)) for k, n in expected.items()}
    assert sorted((r["ts"], r["k"], r["v"]) for r in raw.rows()) == sorted(records)
