"""Two-input steps as lanes of a fan-out (issue 17): a keyed step read by a sink *and* by a
broadcast-state or co-process step whose other input comes from its own source. The lane runs
in the fan-out's shared operator (translators/fanout.py), the other input's rows joining it
there; results are checked against the model (tests/flink_model.py) as for the same steps in
a chain, and the sink reading the keyed step gets its rows unchanged."""

from __future__ import annotations

import os
from datetime import timedelta

import flink_model as model
import pytest
from test_broadcast import EVENTS, LIMITS, OUT, RULES, RuleCheck
from test_broadcast import _streams as broadcast_streams
from test_chains import Dedupe, _distinct, _label
from test_connect import SCHEMA, Thresholds
from test_connect import _streams as connect_streams
from test_two_input_chains import JOIN_LOWER_MS, JOIN_UPPER_MS, _join_sides, alerts, join_into, pairs, sums_as_events

from ember import CollectSink, KeyedProcessFunction, ScriptedSource, WatermarkStrategy
from ember.savepoints import create_savepoint

pytestmark = pytest.mark.spark

BOUND_MS, EXPIRY_MS = 1_000, 3_000
STRATEGY = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND_MS), "ts")


def _records(sink):
    """The (ts, k, v) records ``sink`` received, sorted."""
    return sorted((r["ts"], r["k"], r["v"]) for bt in sink.batches for r in bt.rows)


def _every(batches):
    """The records of ``batches``, sorted."""
    return sorted(r for b in batches for r in b)


def _one_stream(seed):
    """Random batches, the first with a record every run of the join pairs."""
    events = model.random_batches(seed, keys="ab")
    events[0] = [(2_000, "a", 5), *events[0]]
    return events


def _odd_and_even(batches):
    """The odd and the even records of ``batches``: the two sides of a join of one stream with itself."""
    return [[r for r in b if r[2] % 2] for b in batches], [[r for r in b if not r[2] % 2] for b in batches]


def test_a_dedupe_read_by_a_broadcast_step_and_a_sink(env, tmp_path):
    """And a savepoint reads each step's state as its own: the lane's broadcast state, the
    dedupe's keys."""
    events, rules = broadcast_streams(7)
    with_duplicates = [b + b[:3] for b in events]
    distinct = _distinct(with_duplicates)
    a = env.from_source(ScriptedSource(with_duplicates, EVENTS), STRATEGY, name="events")
    b = env.from_source(ScriptedSource(rules, RULES), STRATEGY, name="rules")
    checks, raw = CollectSink(), CollectSink()
    deduped = a.key_by("k", "ts", "v").process(Dedupe(), EVENTS, name="dedupe")
    deduped.key_by("k").connect(b.broadcast(LIMITS)).process(RuleCheck(), OUT, name="check").sink_to(checks)
    deduped.sink_to(raw, name="raw")
    env.execute("dedupe-rules-lane", progress=False)
    got = sorted(((_label(bt.batch_id, events), r["what"], r["name"], r["ts"], r["n"])
                  for bt in checks.batches for r in bt.rows), key=repr)
    expected = sorted(model.broadcast_rules(distinct, rules, BOUND_MS, EXPIRY_MS), key=repr)
    assert {e[1] for e in expected} == {"rule", "alert", "summary"}
    assert got == expected
    assert _records(raw) == _every(distinct)

    point = create_savepoint(os.path.join(env.config.checkpoint_dir, "dedupe-rules-lane"), root=str(tmp_path / "sp"))
    assert [(op["name"], op.get("lane")) for op in point.operators] == [("dedupe", None), ("check", 0)]
    seen = point.read_state("dedupe", env.spark)
    assert sorted(seen[["ts", "k", "v"]].itertuples(index=False, name=None)) == sorted(r for b in distinct for r in b)
    limits: dict[str, int] = {}
    for batch in rules:
        for _ts, name, limit in sorted(batch):
            if name != "reset":
                limits.pop(name, None) if limit < 0 else limits.__setitem__(name, limit)
    assert point.read_broadcast_state("check", env.spark) == {"limits": limits} and limits
    assert point.read_state("check", env.spark).empty  # every summary timer fired at the end


class RulesFirst(Thresholds):
    """Thresholds with the rules on the first input and the events on the second."""

    def process_element1(self, rule, ctx):
        return super().process_element2(rule, ctx)

    def process_element2(self, event, ctx):
        return super().process_element1(event, ctx)


@pytest.mark.parametrize("events_on", ["first", pytest.param("second", marks=pytest.mark.slow)])
def test_a_dedupe_read_by_a_co_process_step_and_a_sink(env, events_on):
    """The deduped events on either input of the co-process step, rules from their own source
    on the other: alerts and expiries in the batches the model says on the distinct events."""
    events, rules = connect_streams(5)
    with_duplicates = [b + b[:2] for b in events]
    distinct = _distinct(with_duplicates)
    a = env.from_source(ScriptedSource(with_duplicates, SCHEMA), STRATEGY, name="events")
    b = env.from_source(ScriptedSource(rules, SCHEMA), STRATEGY, name="rules")
    found, raw = CollectSink(), CollectSink()
    deduped = a.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    connected = deduped.connect(b) if events_on == "first" else b.connect(deduped)
    connected.key_by("k", "k").process(Thresholds() if events_on == "first" else RulesFirst(),
                                       "what string, k string, ts bigint", name="thresholds").sink_to(found)
    deduped.sink_to(raw, name="raw")
    env.execute(f"dedupe-thresholds-lane-{events_on}", progress=False)
    got = alerts(found, events)
    expected = sorted(model.thresholds(distinct, rules, BOUND_MS, EXPIRY_MS), key=repr)
    assert expected != sorted(model.thresholds(with_duplicates, rules, BOUND_MS, EXPIRY_MS), key=repr)
    assert any(e[1] == "alert" for e in expected) and any(e[1] == "expired" for e in expected)
    assert got == expected
    assert _records(raw) == _every(distinct)


def test_a_dedupe_read_by_an_interval_join_and_a_sink(env):
    """The join on Ember's keyed runtime (another stateful step is in the job): the pairs in
    the batches the model says on the distinct records, and their late records counted."""
    left, right = _join_sides(1)
    with_duplicates = [b + b[:2] for b in left]
    distinct = _distinct(with_duplicates)
    joined, raw = CollectSink(), CollectSink()
    a = env.from_source(ScriptedSource(with_duplicates, SCHEMA), STRATEGY, name="left")
    b = env.from_source(ScriptedSource(right, SCHEMA), STRATEGY, name="right")
    deduped = a.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    join_into(deduped.key_by("k"), b.key_by("k"), joined)
    deduped.sink_to(raw, name="raw")
    result = env.execute("dedupe-join-lane", progress=False)
    rows = pairs(joined)
    expected = model.interval_join(distinct, right, BOUND_MS, JOIN_LOWER_MS, JOIN_UPPER_MS)
    assert expected.late > 0 and len(expected.pairs) > 5
    assert rows == sorted(expected.pairs, key=repr)
    assert result.late_dropped == expected.late
    assert _records(raw) == _every(distinct)


def test_a_source_read_by_a_co_process_step_and_a_sink(env):
    """The stream parts before any keyed step (a root fan-out): its rows get their event time
    once, at the stem, and the co-process lane equals the model on the source's events."""
    events, rules = connect_streams(6)
    a = env.from_source(ScriptedSource(events, SCHEMA), STRATEGY, name="events")
    b = env.from_source(ScriptedSource(rules, SCHEMA), STRATEGY, name="rules")
    found, raw = CollectSink(), CollectSink()
    a.connect(b).key_by("k", "k").process(Thresholds(), "what string, k string, ts bigint",
                                          name="thresholds").sink_to(found)
    a.sink_to(raw, name="raw")
    env.execute("source-thresholds-lane", progress=False)
    got = alerts(found, events)
    expected = sorted(model.thresholds(events, rules, BOUND_MS, EXPIRY_MS), key=repr)
    assert any(e[1] == "alert" for e in expected) and any(e[1] == "expired" for e in expected)
    assert got == expected
    assert _records(raw) == _every(events)


def test_a_co_process_step_reading_a_window_lane_after_a_dedupe(env):
    """A second level: the dedupe is read by a raw sink and a window (the first level's lane),
    whose results are a co-process step's first input (a lane of the next level), rules from
    their own source its second: alerts and expiries in the batches the model says."""
    events, rules = connect_streams(3, batches=10)
    with_duplicates = [b + b[:2] for b in events]
    distinct = _distinct(with_duplicates)
    size = 1_000
    a = env.from_source(ScriptedSource(with_duplicates, SCHEMA), STRATEGY, name="events")
    b = env.from_source(ScriptedSource(rules, SCHEMA), STRATEGY, name="rules")
    found, raw = CollectSink(), CollectSink()
    deduped = a.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    deduped.sink_to(raw, name="raw")
    results = sums_as_events(deduped, size)
    results.connect(b).key_by("k", "k").process(Thresholds(), "what string, k string, ts bigint",
                                                name="thresholds").sink_to(found)
    env.execute("dedupe-window-thresholds-lanes", progress=False)
    got = alerts(found, events)
    ahead = model.tumbling_sums(distinct, BOUND_MS, size, model.two_input_watermarks(distinct, rules, BOUND_MS, after_last=True))
    expected = sorted(model.thresholds(distinct, rules, BOUND_MS, EXPIRY_MS, ahead=ahead), key=repr)
    assert any(e[1] == "alert" for e in expected) and any(e[1] == "expired" for e in expected)
    assert got == expected
    assert _records(raw) == _every(distinct)


@pytest.mark.parametrize("raw_sink", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_one_dedupe_on_both_inputs_of_an_interval_join(env, raw_sink):
    """Impressions and clicks of one stream, deduped once, joined: the join reads the dedupe on
    both inputs, each through a filter of its own — one lane of the dedupe's fan-out with two
    copies of a row, one per input (before, the dedupe ran twice, once per input, each copy
    with state of its own). Pairs and late records as the model says with the one source's
    watermark; beside a raw sink or alone."""
    with_duplicates = [b + b[:2] for b in _one_stream(2)]
    distinct = _distinct(with_duplicates)
    raw = CollectSink()
    a = env.from_source(ScriptedSource(with_duplicates, SCHEMA), STRATEGY, name="events")
    deduped = a.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    if raw_sink:
        deduped.sink_to(raw, name="raw")
    _odd_even_join_equals_the_model(env, deduped, distinct, f"dedupe-self-join-{raw_sink}")
    if raw_sink:
        assert _records(raw) == _every(distinct)
    assert len(os.listdir(os.path.join(env.config.checkpoint_dir, f"dedupe-self-join-{raw_sink}", "state"))) == 2


class Forward(KeyedProcessFunction):
    """Forwards each record (a keyed step of its own between the dedupe and the co-process step)."""

    def process_element(self, record, ctx):
        yield record


def _two_lanes_job(env, data, name, shared):
    """Deduped events -> {1 s window sums as events, the records above 5 forwarded} -> the
    co-process step with the sums on its first input and the forwarded records as rules on its
    second. ``shared``: one source and one dedupe read by both (two lanes of its fan-out), else a
    source and a dedupe per input (a chain on each input)."""
    size = 1_000
    sinks = CollectSink(), CollectSink()
    streams = []
    for part in ((0,) if shared else (0, 1)):
        src = env.from_source(ScriptedSource(data, SCHEMA), STRATEGY, name=f"{name}-events-{part}")
        streams.append(src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name=f"{name}-dedupe-{part}"))
    first, second = (streams[0], streams[0]) if shared else streams
    sums = sums_as_events(first, size, prefix=f"{name}-")
    limits = second.filter("v > 5", name=f"{name}-high").key_by("k").process(Forward(), SCHEMA, name=f"{name}-limits")
    sums.connect(limits).key_by("k", "k").process(Thresholds(), "what string, k string, ts bigint",
                                                  name=f"{name}-thresholds").sink_to(sinks[0])
    if shared:
        first.sink_to(sinks[1], name=f"{name}-raw")
    env.execute(name, progress=False)
    return sinks


def test_a_co_process_step_reading_two_lanes_of_a_fan_out(env):
    """A second-level lane reading two lanes of the level before, one on each input: the same
    alerts and expiries, batch by batch, as the job with a source and a dedupe of its own per
    input (each a chain, the shape tests/integration/test_two_input_chains.py checks against the
    model) — the one source's watermark is the two identical sources' least."""
    events, _ = connect_streams(3, batches=10)
    data = [b + b[:2] for b in events]
    lanes, raw = _two_lanes_job(env, data, "two-lanes", shared=True)
    chains, _ = _two_lanes_job(env, data, "two-chains", shared=False)

    def rows(sink):  # (what the end of input flushes comes a batch later with two sources to end: END for both)
        return sorted(((_label(bt.batch_id, data), r["what"], r["k"], r["ts"]) for bt in sink.batches for r in bt.rows),
                      key=repr)

    assert {r[1] for r in rows(chains)} == {"alert", "expired"}
    assert rows(lanes) == rows(chains)
    assert _records(raw) == _every(_distinct(data))


@pytest.mark.parametrize("beside", ["raw-sink", pytest.param("dedupe", marks=pytest.mark.slow)])
def test_a_source_on_both_inputs_of_an_interval_join_beside_other_readers(env, beside):
    """Odd and even records of one source joined, the source also read by a raw sink (or by a
    keyed step): the join is not read by every sink, so it runs on Ember's runtime as a lane of
    the source's fan-out (before: refused) — pairs and late records as the model says with the
    one source's watermark."""
    events = _one_stream(2)
    other = CollectSink()
    a = env.from_source(ScriptedSource(events, SCHEMA), STRATEGY, name="events")
    reader = a if beside == "raw-sink" else a.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    reader.sink_to(other, name="other")
    _odd_even_join_equals_the_model(env, a, events, f"source-self-join-{beside}")
    assert _records(other) == _every(events)


def _odd_even_join_equals_the_model(env, stream, records, name):
    """Joins the odd and even records of ``stream`` (whose records are the batches ``records``),
    runs the job ``name``, and checks its pairs and late records against the model with the one
    stream's watermarks."""
    joined = CollectSink()
    join_into(stream.filter("v % 2 = 1", name="odd").key_by("k"), stream.filter("v % 2 = 0", name="even").key_by("k"),
              joined)
    result = env.execute(name, progress=False)
    left, right = _odd_and_even(records)
    expected = model.interval_join(left, right, BOUND_MS, JOIN_LOWER_MS, JOIN_UPPER_MS,
                                   watermarks=model.least_watermarks([records], BOUND_MS))
    assert len(expected.pairs) > 5 and expected.late > 0
    assert pairs(joined) == sorted(expected.pairs, key=repr)
    assert result.late_dropped == expected.late
