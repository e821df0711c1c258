"""A savepoint restored into the other state layout (issue 18: savepoints/convert.py,
runner/spark/conversion.py): the keyed steps' values and timers carry over, the sources go
on where the savepoint left them, and the results equal the independent model's of one
uninterrupted run — nothing lost, nothing twice."""

from __future__ import annotations

import os
import random
from datetime import timedelta

import flink_model as model
import numpy as np
import pandas as pd
import pytest

from ember import (
    CollectSink,
    KeyedProcessFunction,
    RateSource,
    ScriptedSource,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from ember.bench.jobs import CountAggregate
from ember.errors import JobFailedError, RestartError, SavepointError
from ember.functions import VectorizedKeyedFunction
from ember.runner.spark.checkpoint import CheckpointLayout, read_json
from ember.savepoints import create_savepoint
from ember.state.descriptors import ValueStateDescriptor

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
BOUND = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts")
DELAY = 700


class TotalAndTimer(KeyedProcessFunction):
    """Per record: the key's running total of v out, and a timer DELAY ms later that reports
    the key's timer firing (its value not compared: it depends on the order of a batch's
    records and timers, which the model leaves open)."""

    def open(self, ctx):
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    def process_element(self, value, ctx):
        total = self.total.value() + value["v"]
        self.total.update(total)
        ctx.register_event_time_timer(ctx.timestamp + DELAY)
        yield {"kind": "record", "k": ctx.current_key, "at": ctx.timestamp, "total": total}

    def on_timer(self, timestamp, ctx):
        yield {"kind": "timer", "k": ctx.current_key, "at": timestamp, "total": 0}


OUT = "kind string, k string, at bigint, total bigint"


def batches_of(seed: int, n: int = 8) -> list[list[tuple]]:
    """Records with distinct timestamps (a key's order in a batch is then its time order),
    shuffled within each batch: up to 1 s out of order, never behind the watermark."""
    rng = random.Random(seed)
    ts, out = 1_000, []
    for _ in range(n):
        batch = []
        for _ in range(rng.randint(1, 7)):
            ts += rng.randint(1, 500)
            batch.append((ts, rng.choice("abcd"), rng.randint(1, 9)))
        rng.shuffle(batch)
        out.append(batch)
    return out


def running_totals(batches: list[list[tuple]]) -> list[tuple]:
    """The model of TotalAndTimer's records: per key a running total, in time order."""
    totals: dict[str, int] = {}
    out = []
    for batch in batches:
        for ts, k, v in sorted(batch):
            totals[k] = totals.get(k, 0) + v
            out.append(("record", k, ts, totals[k]))
    return out


def _env(spark, root, layout):
    return StreamEnvironment(master="local[2]", checkpoint_dir=str(root), parallelism=2, spark=spark, state_layout=layout)


def _timer_job(env, batches, sink):
    src = env.from_source(ScriptedSource(batches, SCHEMA, ends=False), BOUND, name="events")
    src.key_by("k").process(TotalAndTimer(), OUT, name="totals").sink_to(sink)


def _rows(sink):
    return sorted((r["kind"], r["k"], r["at"], r["total"]) for b in sink.batches for r in b.rows)


def around_a_savepoint(spark, tmp_path, build, first=None, total=None, layouts=("blob", "delta"), name="job"):
    """Run the job ``build(env, run)`` declares (returning its sinks) on ``layouts[0]`` until
    ``first`` events were read (None: until its sources end), take a savepoint, and restore it
    on ``layouts[1]`` — converted — for the rest of ``total``. Returns each run's sinks; run
    ``i``'s checkpoint is ``<tmp_path>/<name>-<i>``."""
    runs, read, point = [], 0, None
    for run, layout in enumerate(layouts):
        env = _env(spark, tmp_path, layout)
        sinks = build(env, run)
        limit = first if point is None else (None if total is None else total - read)
        read += env.execute(f"{name}-{run}", progress=False, max_events=limit, from_savepoint=point).events
        point = create_savepoint(os.path.join(str(tmp_path), f"{name}-{run}"), root=str(tmp_path / "sp")).path
        runs.append(sinks)
    return runs


def _manifest(tmp_path, name):
    return read_json(CheckpointLayout(os.path.join(str(tmp_path), name)).pipeline)


def _closed_counts(batches, size, delay=0):
    """Per (key, window start) of ``size`` ms windows: the records' count, for the windows the
    last record's watermark (1 s bound) closed (``delay``: their input comes that much later)."""
    counts: dict[tuple, int] = {}
    for ts, k, _ in sum(batches, []):
        counts[(k, ts // size * size)] = counts.get((k, ts // size * size), 0) + 1
    last = max(ts for ts, _, _ in sum(batches, []))
    return sorted((k, s, n) for (k, s), n in counts.items() if s + size <= last - 1_000 - delay)


def _fired_once(got, closed):
    """``got`` (key, window start, count) holds the closed windows with their counts, each once."""
    assert [g for g in got if g[:2] in {c[:2] for c in closed}] == closed
    assert len(got) == len({g[:2] for g in got}), "a window fired twice"


@pytest.mark.parametrize(("before", "after"), [("blob", "delta"), ("delta", "blob")])
def test_a_savepoint_restored_into_the_other_layout_goes_on_as_one_run(spark, tmp_path, before, after):
    batches = batches_of(7)

    def build(env, run):
        sink = CollectSink()
        _timer_job(env, batches, sink)
        return sink

    first, second = around_a_savepoint(spark, tmp_path, build, sum(len(b) for b in batches[:4]),
                                       sum(len(b) for b in batches), (before, after))
    records = running_totals(batches)
    timers = sorted(("timer", k, at, 0) for k, at, b in model.timer_firings(batches, 1_000, DELAY, in_batch=True)
                    if b != model.END)
    assert sorted(_rows(first) + _rows(second)) == sorted(records + timers)
    # The cut left state behind that the second run needed: totals carried on, timers set before it fired after it.
    read_first = {(r[1], r[2]) for r in _rows(first) if r[0] == "record"}
    assert any(r[0] == "timer" and (r[1], r[2] - DELAY) in read_first for r in _rows(second)), \
        "no timer set before the savepoint fired after it: the test would not see lost timers"
    assert any(r[0] == "record" and r[1] in {k for k, _ in read_first} for r in _rows(second)), \
        "no key read before the cut was read after it: the test would not see lost totals"
    manifest = _manifest(tmp_path, "job-1")
    assert manifest["operators"][0].get("state layout", "blob") == after
    assert manifest["operators"][0]["spark operator"] == "transformWithStateInPandas"


class VectorTotals(VectorizedKeyedFunction):
    """Per key a running total of v (a vectorised step's table, numbers only), each record out
    with it."""

    state_schema = "total bigint"

    def process_batch(self, events, state, ctx):
        keys = events["k"].to_numpy()
        prior = state["total"].reindex(keys).fillna(0).to_numpy()
        running = events.groupby("k", sort=False)["v"].cumsum().to_numpy() + prior
        out = pd.DataFrame({"kind": "record", "k": keys, "at": events["ts"], "total": running.astype(np.int64)})
        return out, out.groupby("k", sort=False).tail(1).set_index("k")[["total"]]


@pytest.mark.parametrize(("before", "after"), [("blob", "delta"), pytest.param("delta", "blob", marks=pytest.mark.slow)])
def test_a_vectorised_step_s_table_converts(spark, tmp_path, before, after):
    batches = batches_of(5)
    ints = [[(ts, ord(k), v) for ts, k, v in b] for b in batches]  # (the delta layout keeps integer keys)

    def build(env, run):
        sink = CollectSink()
        src = env.from_source(ScriptedSource(ints, "ts bigint, k bigint, v int", ends=False), BOUND, name="events")
        src.key_by("k").process_batches(VectorTotals(), "kind string, k bigint, at bigint, total bigint",
                                        name="totals").sink_to(sink)
        return sink

    runs = around_a_savepoint(spark, tmp_path, build, sum(len(b) for b in ints[:4]), sum(len(b) for b in ints),
                              (before, after))
    rows = [(r["kind"], chr(r["k"]), r["at"], r["total"]) for sink in runs for r in sink.rows()]
    assert sorted(rows) == sorted(running_totals(batches))


def test_a_window_after_a_process_function_converts_with_its_panes_and_timers(spark, tmp_path):
    """Two keyed steps (a process function, then a 2 s tumbling window counting its output
    records per key), the second renamed in the restored job: both handed their state; every
    window's count is the model's."""
    batches = batches_of(11, 9)

    def build(env, run):
        sink = CollectSink()
        src = env.from_source(ScriptedSource(batches, SCHEMA, ends=False), BOUND, name="events")
        (src.key_by("k").process(TotalAndTimer(), OUT, name="totals")
         .filter(lambda r: r["kind"] == "record", name="records")
         .key_by("k").window(TumblingEventTimeWindows.of(timedelta(seconds=2)))
         .aggregate(CountAggregate(), output_schema="n bigint", name=f"counts-{run}")
         .sink_to(sink))
        return sink

    runs = around_a_savepoint(spark, tmp_path, build, sum(len(b) for b in batches[:5]), sum(len(b) for b in batches))
    _fired_once(sorted((r["k"], r["window_start"], r["n"]) for sink in runs for r in sink.rows()),
                _closed_counts(batches, 2_000, DELAY))


class Seen(KeyedProcessFunction):
    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

    def process_element(self, value, ctx):
        self.n.update(self.n.value() + 1)
        yield {"value": value["value"], "n": self.n.value()}


def test_a_conversion_that_cannot_be_made_is_refused_before_anything_is_copied(spark, tmp_path):
    env = _env(spark, tmp_path, "blob")
    src = env.from_source(RateSource(rows_per_second=50), name="rate")
    src.key_by("value").process(Seen(), "value bigint, n bigint", name="seen").sink_to(CollectSink())
    env.execute("rate-job", progress=False, duration_s=4)
    point = create_savepoint(os.path.join(str(tmp_path), "rate-job"), root=str(tmp_path / "sp"))
    env = _env(spark, tmp_path, "delta")
    src = env.from_source(RateSource(rows_per_second=50), name="rate")
    src.key_by("value").process(Seen(), "value bigint, n bigint", name="seen").sink_to(CollectSink())
    with pytest.raises(SavepointError, match=r"source 'rate' \(RateSource\).*cannot start at the savepoint's position"):
        env.execute("rate-restored", progress=False, from_savepoint=point.path, duration_s=2)
    assert not os.path.exists(os.path.join(str(tmp_path), "rate-restored", "offsets"))


def test_a_checkpoint_s_layout_change_names_the_way_to_convert_it(spark, tmp_path):
    batches = batches_of(3, 2)
    env = _env(spark, tmp_path, "blob")
    _timer_job(env, batches, CollectSink())
    env.execute("kept", progress=False, max_events=len(batches[0]))
    env = _env(spark, tmp_path, "delta")
    _timer_job(env, batches, CollectSink())
    with pytest.raises(RestartError, match=r"ember savepoint create <job> --stop.*--state-layout L --from-savepoint"):
        env.execute("kept", progress=False, max_events=1)


@pytest.mark.parametrize(("before", "after"), [("blob", "delta"), pytest.param("delta", "blob", marks=pytest.mark.slow)])
def test_broadcast_state_and_the_keyed_state_beside_it_convert(spark, tmp_path, before, after):
    """Two sources (events, rules) that end: the rule a first run read still checks the events
    the restored, converted run reads, and the alert counts go on."""
    from test_broadcast import EVENTS, LIMITS, RULES, RuleCheckWithoutTimers

    events = [[], [(1, "a", 7)], [(3, "c", 7), (4, "a", 8)]]
    rules = [[(0, "r1", 5)], [], []]

    def build(env, run):
        sink = CollectSink()
        a = env.from_source(ScriptedSource(events[:run + 2], EVENTS), name="events")
        b = env.from_source(ScriptedSource(rules[:run + 2], RULES), name="rules")
        a.key_by("k").connect(b.broadcast(LIMITS)).process(RuleCheckWithoutTimers(), "what string, name string, ts bigint, n int",
                                                           name="check").sink_to(sink)
        return sink

    runs = around_a_savepoint(spark, tmp_path, build, layouts=(before, after))
    assert [sorted((r["what"], r["name"], r["n"]) for r in sink.rows()) for sink in runs] == \
        [[("alert", "a:r1", 1), ("rule", "r1", 1)], [("alert", "a:r1", 2), ("alert", "c:r1", 1)]]


def test_a_window_join_converts_with_both_sides_waiting_records(spark, tmp_path):
    """Two event-time inputs joined per 2 s window on Ember's runtime: the records either side
    left in open windows at the cut are joined after it, every pair as the model says."""
    from test_window_joins import PAIR, _pair, _streams

    left, right = _streams(1)

    def build(env, run):
        sink = CollectSink()
        a = env.from_source(ScriptedSource(left, SCHEMA, ends=False), BOUND, name="left")
        b = env.from_source(ScriptedSource(right, SCHEMA, ends=False), BOUND, name="right")
        a.join(b).where("k").equal_to("k").window(TumblingEventTimeWindows.of(2_000)).apply(_pair, PAIR, name="joined") \
            .sink_to(sink)
        return sink

    runs = around_a_savepoint(spark, tmp_path, build, sum(len(x) for x in left[:4] + right[:4]),
                              sum(len(b) for b in left + right))
    rows = [sorted((r["k"], r["lts"], r["lv"], r["rts"], r["rv"]) for r in sink.rows()) for sink in runs]
    expected, _late = model.window_join(left, right, 1_000, 2_000, 2_000, "inner")
    assert rows[0] and rows[1], "both runs should join pairs"
    assert sorted(rows[0] + rows[1]) == sorted(e[1:] for e in expected if e[0] != model.END)
    # a savepoint of the converted job leaves out the conversion's files (needed until its batch 0 committed)
    converted = create_savepoint(os.path.join(str(tmp_path), "job-1"), root=str(tmp_path / "sp2"))
    assert "'joined': window join, key (k, k), state layout 'delta' on transformWithStateInPandas" in converted.describe()
    kept = list(converted.manifest["files"])
    assert any(f.startswith("ember/") for f in kept)
    assert not [f for f in kept if f.startswith(("ember/initial-state", "ember/start-offsets"))]


def test_the_lanes_of_a_fan_out_convert_each_with_its_own_state(spark, tmp_path):
    """A dedupe read by two running aggregates keyed differently (lanes of one operator) and a
    sink: each lane's counts and sums go on across the conversion as the plain-Python ones."""
    from collections import defaultdict

    from test_fan_out import RUNNING, Dedupe, Running, _expected, _records

    batches = _records(10)

    def build(env, run):
        by_k, by_g = CollectSink(), CollectSink()
        src = env.from_source(ScriptedSource(batches, "i bigint, k string, v bigint, g bigint", ends=False), name="events")
        first = src.key_by("i").process(Dedupe(), "i bigint, k string, v bigint, g bigint", name="first")
        first.key_by("k").process(Running("k"), RUNNING, name="by-k").sink_to(by_k, name="by-k-out")
        first.key_by("g").process(Running("g"), RUNNING, name="by-g").sink_to(by_g, name="by-g-out")
        first.select("i", name="ids").sink_to(CollectSink(), name="raw")
        return by_k, by_g

    runs = around_a_savepoint(spark, tmp_path, build, sum(len(b) for b in batches[:5]), 120)
    assert {op["name"]: ("lane" in op, op.get("state layout")) for op in _manifest(tmp_path, "job-1")["operators"]} == \
        {"first": (False, "delta"), "by-k": (True, "delta"), "by-g": (True, "delta")}
    records = [r for b in batches for r in b]

    def running(sinks):
        seqs = defaultdict(list)
        for sink in sinks:
            for r in sink.rows():
                seqs[r["key"]].append((r["n"], r["total"]))
        return {k: ([n for n, _ in sorted(v)], max(v)[1]) for k, v in seqs.items()}

    assert running([k for k, _ in runs]) == _expected(records, 1)[0]
    assert running([g for _, g in runs]) == _expected(records, 3)[0]


def test_event_time_windows_on_the_lanes_of_a_fan_out_fire_after_the_conversion(spark, tmp_path):
    """Two windows reading one dedupe (lanes of one operator, on event time): a window a key
    left open at the cut fires after it though that key reads nothing more — through the
    timer the conversion registered for its bucket — with the model's count."""
    from test_chains import Dedupe

    head = batches_of(13, 4)
    tail, ts = [], max(t for b in head for t, _, _ in b)
    for i in range(4):  # key d reads nothing after the cut; time goes on
        batch = [(ts + 300 * j + 1, "abc"[(i + j) % 3], j + 1) for j in range(1, 6)]
        ts = max(t for t, _, _ in batch)
        tail.append(batch)
    batches = head + tail
    assert any(k == "d" for b in head for _, k, _ in b)

    def build(env, run):
        small, large = CollectSink(), CollectSink()
        src = env.from_source(ScriptedSource(batches, SCHEMA, ends=False), BOUND, name="events")
        deduped = src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
        (deduped.key_by("k").window(TumblingEventTimeWindows.of(timedelta(seconds=2)))
         .aggregate(CountAggregate(), output_schema="n bigint", name="small").sink_to(small, name="small-out"))
        (deduped.key_by("k").window(TumblingEventTimeWindows.of(timedelta(seconds=3)))
         .aggregate(CountAggregate(), output_schema="n bigint", name="large").sink_to(large, name="large-out"))
        return small, large

    runs = around_a_savepoint(spark, tmp_path, build, sum(len(b) for b in head), sum(len(b) for b in batches))
    for i, size in ((0, 2_000), (1, 3_000)):
        _fired_once(sorted((r["k"], r["window_start"], r["n"]) for run in runs for r in run[i].rows()),
                    _closed_counts(batches, size))
    assert [r for r in runs[1][0].rows() if r["k"] == "d"], "key d's last window should fire in the converted run, on its timer"


def test_a_converted_job_that_fails_in_its_first_micro_batch_hands_the_state_in_again(spark, tmp_path, monkeypatch):
    """The converted query's micro-batch 0 fails after its state was written (its sink raises):
    the restarted job runs that batch again, handing the state in anew, and goes on as one run."""
    batches = batches_of(9)
    first_sink, second_sink = CollectSink(), CollectSink()
    env = _env(spark, tmp_path, "blob")
    _timer_job(env, batches, first_sink)
    read = env.execute("c-first", progress=False, max_events=sum(len(b) for b in batches[:4])).events
    point = create_savepoint(os.path.join(str(tmp_path), "c-first"), root=str(tmp_path / "sp")).path

    accept = CollectSink.accept_batch
    failed = []

    def once(self, batch_id, *args):
        if batch_id == 0 and not failed:
            failed.append(batch_id)
            raise RuntimeError("the sink fails once, in the converted query's first micro-batch")
        return accept(self, batch_id, *args)

    monkeypatch.setattr(CollectSink, "accept_batch", once)
    env = _env(spark, tmp_path, "delta")
    _timer_job(env, batches, second_sink)
    with pytest.raises(JobFailedError, match="fails once"):
        env.execute("c-second", progress=False, from_savepoint=point, max_events=1)
    assert failed and CheckpointLayout(os.path.join(str(tmp_path), "c-second")).converting()
    env = _env(spark, tmp_path, "delta")
    _timer_job(env, batches, second_sink)
    env.execute("c-second", progress=False, max_events=sum(len(b) for b in batches) - read)
    timers = [("timer", k, at, 0) for k, at, b in model.timer_firings(batches, 1_000, DELAY, in_batch=True) if b != model.END]
    assert sorted(_rows(first_sink) + _rows(second_sink)) == sorted(running_totals(batches) + timers)


@pytest.mark.slow  # (the window join's test runs the same two-input path in the quick set)
def test_an_interval_join_after_a_dedupe_converts_with_both_sides_buffered_records(spark, tmp_path):
    """An interval join beside another keyed step runs on Ember's runtime: the records each side
    buffered at the cut still join after it, every pair as the model says."""
    from test_chains import Dedupe, _distinct
    from test_two_input_chains import BOUND_MS, JOIN_LOWER_MS, JOIN_UPPER_MS, STRATEGY, _join_sides, join_into

    left, right = _join_sides(1)

    def build(env, run):
        sink = CollectSink()
        a = env.from_source(ScriptedSource(left, SCHEMA, ends=False), STRATEGY, name="left")
        b = env.from_source(ScriptedSource(right, SCHEMA, ends=False), STRATEGY, name="right")
        join_into(a.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe").key_by("k"), b.key_by("k"), sink)
        return sink

    runs = around_a_savepoint(spark, tmp_path, build, sum(len(x) for x in left[:4] + right[:4]),
                              sum(len(b) for b in left + right))
    assert [op["kind"] for op in _manifest(tmp_path, "job-1")["operators"]] == ["process function", "keyed interval join"]
    rows = [sorted((r["k"], r["lts"], r["lv"], r["rts"], r["rv"]) for r in sink.rows()) for sink in runs]
    expected = model.interval_join(_distinct(left), right, BOUND_MS, JOIN_LOWER_MS, JOIN_UPPER_MS)
    assert rows[0] and rows[1]
    assert sorted(rows[0] + rows[1]) == sorted(p[1:] for p in expected.pairs)
