"""Keyed steps chained by ``reinterpret_as_keyed`` (issue 17, Flink's operator chaining) on
Spark: one operator runs them, each record handed from step to step in Python — checked
against plain-Python models of what the steps emit, across a restart, with dead letters."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import timedelta

import flink_model as model
import pandas as pd
import pytest
from test_chains import CountSum, Dedupe, _fired  # a window's count and sum of v; each distinct record once; fired windows

from ember import (
    CollectSink,
    KeyedProcessFunction,
    OutputTag,
    ScriptedSource,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from ember.errors import JobFailedError, RestartError
from ember.functions import VectorizedKeyedFunction
from ember.savepoints import create_savepoint
from ember.state.descriptors import MapStateDescriptor, ValueStateDescriptor

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
ROWS = "kind string, k string, ts bigint, n bigint"
BOUND = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=1_000), "ts")


class DedupeTicking(KeyedProcessFunction):
    """Forwards each (key, ts) once ("rec") and, 500 ms of event time later, a "tick0"."""

    def open(self, ctx):
        self.state = ctx.get_state(MapStateDescriptor("state"))  # every step names its state "state"

    def process_element(self, value, ctx):
        if self.state.contains(value["ts"]):
            return
        self.state.put(value["ts"], True)
        ctx.register_event_time_timer(value["ts"] + 500)
        yield {"kind": "rec", "k": value["k"], "ts": value["ts"], "n": 0}

    def on_timer(self, timestamp, ctx):
        yield ("tick0", ctx.current_key, timestamp, 0)


class ForwardTicking(KeyedProcessFunction):
    """Forwards everything; 300 ms after each "rec" a "tick1"; counts what it saw in "state"."""

    def open(self, ctx):
        self.state = ctx.get_state(ValueStateDescriptor("state", default=0))

    def process_element(self, value, ctx):
        self.state.update(self.state.value() + 1)
        if value["kind"] == "rec":
            ctx.register_event_time_timer(ctx.timestamp + 300)
        yield value

    def on_timer(self, timestamp, ctx):
        yield {"kind": "tick1", "k": ctx.current_key, "ts": timestamp, "n": 0}


class Numbering(KeyedProcessFunction):
    """Emits each record with its running count per key (in "state")."""

    def open(self, ctx):
        self.state = ctx.get_state(ValueStateDescriptor("state", default=0))

    def process_element(self, value, ctx):
        self.state.update(self.state.value() + 1)
        yield {**value, "n": self.state.value()}


def test_three_chained_steps_with_timers_equal_the_model(env):
    batches = model.random_batches(11, batches=10)
    given = [b + b[:2] for b in batches]  # repeated records: the first step forwards each once
    sink = CollectSink()
    (env.from_source(ScriptedSource(given, SCHEMA), BOUND, name="events")
        .key_by("k").process(DedupeTicking(), ROWS, name="dedupe")
        .reinterpret_as_keyed("k").process(ForwardTicking(), ROWS, name="forward")
        .reinterpret_as_keyed("k").process(Numbering(), ROWS, name="number").sink_to(sink))
    assert "dedupe -> forward -> number: process DedupeTicking -> ForwardTicking -> Numbering" in env.explain(spark_plan=False)
    env.execute("chained", progress=False)
    distinct = {(k, ts) for b in batches for ts, k, _ in b}
    expected = Counter([("rec", k, ts) for k, ts in distinct]
                       + [("tick0", k, ts + 500) for k, ts in distinct]
                       + [("tick1", k, ts + 300) for k, ts in distinct])
    rows = sink.rows()
    assert Counter((r["kind"], r["k"], r["ts"]) for r in rows) == expected
    per_key = defaultdict(list)
    for r in rows:
        per_key[r["k"]].append(r["n"])
    inputs = Counter(k for _, k, _ in expected.elements())  # the last step's records per key, numbered 1..n
    assert {k: sorted(ns) for k, ns in per_key.items()} == {k: list(range(1, n + 1)) for k, n in inputs.items()}


class Tally(KeyedProcessFunction):
    def __init__(self, field="n"):
        self.field = field

    def open(self, ctx):
        self.state = ctx.get_state(ValueStateDescriptor("state", default=0))

    def process_element(self, value, ctx):
        self.state.update(self.state.value() + 1)
        yield {"k": value["k"], "n": value.get("m", 0), "m": self.state.value()}  # n: the step before's count


def test_a_chain_resumes_from_its_checkpoint_with_each_steps_state(spark, tmp_path):
    """Stopped after 3 or more of 6 batches and started again on its checkpoint: both steps' running
    counts go on, 1..n once each across the two runs, and equal each other on every row."""
    batches = [[(1_000 * i + j, "abc"[j % 3], 1) for j in range(7)] for i in range(1, 7)]
    per_key = Counter(k for b in batches for _, k, _ in b)
    rows = []

    def job(chained=True):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark,
                                max_events_per_batch=7)
        sink = CollectSink()
        first = (env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
                 .key_by("k").process(Tally(), "k string, n bigint, m bigint", name="first"))
        keyed = first.reinterpret_as_keyed("k") if chained else first.key_by("k")
        keyed.process(Tally(), "k string, n bigint, m bigint", name="second").sink_to(sink)
        return env, sink

    for stop in ({"max_events": 21}, {}):
        env, sink = job()
        result = env.execute("chained-restart", progress=False, **stop)
        rows.append((result.events, sink.rows()))
    (first_events, first_rows), (rest_events, rest_rows) = rows
    assert 21 <= first_events < 42 and first_events + rest_events == 42
    assert rest_rows and min(r["m"] for r in rest_rows) > 1  # the second run went on counting
    seen = defaultdict(list)
    for r in first_rows + rest_rows:
        assert r["n"] == r["m"]  # the first step's count reached the second step with its record
        seen[r["k"]].append(r["m"])
    assert {k: sorted(ms) for k, ms in seen.items()} == {k: list(range(1, n + 1)) for k, n in per_key.items()}
    # each step's state under its own name in the chained step's savepoint entry
    point = create_savepoint(str(tmp_path / "chained-restart"), root=str(tmp_path / "sp"))
    state = point.read_state("first -> second", spark)
    assert sorted(zip(state["k"], state["state"], state["value"])) == sorted(
        (k, name, n) for k, n in per_key.items() for name in ("first/state", "second/state"))
    # the steps apart are other operators: a restart that stops chaining them is refused before it runs
    with pytest.raises(RestartError, match="first -> second"):
        job(chained=False)[0].execute("chained-restart", progress=False)


class Rekeying(KeyedProcessFunction):
    """Emits every record; those with v == 0 under another key (breaking the promise)."""

    def process_element(self, value, ctx):
        yield {**value, "k": value["k"] + "!" if value["v"] == 0 else value["k"]}


class FailingOnNine(KeyedProcessFunction):
    def process_element(self, value, ctx):
        if value["v"] == 9:
            raise ValueError("nine")
        yield value


def test_a_chains_failures_and_broken_keys_are_the_last_steps_dead_letters(env):
    batches = [[(1_000, "a", 1), (1_100, "a", 9), (1_200, "b", 0)], [(2_000, "b", 2), (2_100, "c", 9)]]
    dead = OutputTag("dead")
    out, letters = CollectSink(), CollectSink()
    checked = (env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
               .key_by("k").process(Rekeying(), SCHEMA, name="rekey")
               .reinterpret_as_keyed("k").process(FailingOnNine(), SCHEMA, dead_letter=dead, name="check"))
    checked.sink_to(out)
    checked.get_side_output(dead).sink_to(letters)
    env.execute("chained-dead-letters", progress=False)
    assert sorted((r["k"], r["v"]) for r in out.rows()) == [("a", 1), ("b", 2)]
    errors = Counter(r["error"] for r in letters.rows())
    broken = ("step 'check' reads 'rekey' through reinterpret_as_keyed('k'), but 'rekey' emitted a record with key 'b!' "
              "while processing key 'b': a reinterpreted stream must keep each record's key (key_by re-partitions)")
    assert errors == {"step 'check': FailingOnNine.process_element raised ValueError: nine": 2, broken: 1}


def test_a_broken_key_without_dead_letters_fails_the_job_naming_it(env):
    (env.from_source(ScriptedSource([[(1_000, "a", 0)]], SCHEMA), BOUND, name="events")
        .key_by("k").process(Rekeying(), SCHEMA, name="rekey")
        .reinterpret_as_keyed("k").process(FailingOnNine(), SCHEMA, name="check").sink_to(CollectSink()))
    with pytest.raises(JobFailedError, match="'rekey' emitted a record with key 'a!' while processing key 'a'"):
        env.execute("chained-broken-key", progress=False)


class Validating(KeyedProcessFunction):
    """Reports odd values to a side output, then fails on 9 (what it reported is taken back)."""

    ODD = OutputTag("odd", "k string, v int")

    def process_element(self, value, ctx):
        if value["v"] % 2:
            ctx.output(self.ODD, {"k": value["k"], "v": value["v"]})
        if value["v"] == 9:
            raise ValueError("nine")
        yield value


class NumberingFailingOnSeven(KeyedProcessFunction):
    def open(self, ctx):
        self.state = ctx.get_state(ValueStateDescriptor("state", default=0))

    def process_element(self, value, ctx):
        if value["v"] == 7:
            raise ValueError("seven")
        self.state.update(self.state.value() + 1)
        yield {"k": value["k"], "v": value["v"], "n": self.state.value()}


def test_each_chained_steps_side_outputs_and_dead_letters_are_its_own(env):
    batches = model.random_batches(5, batches=6)
    first_dead, second_dead = OutputTag("first_dead"), OutputTag("second_dead")
    out, odd, dead1, dead2 = CollectSink(), CollectSink(), CollectSink(), CollectSink()
    first = (env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
             .key_by("k").process(Validating(), SCHEMA, dead_letter=first_dead, name="validate"))
    first.get_side_output(Validating.ODD).sink_to(odd, name="odd")
    first.get_side_output(first_dead).sink_to(dead1, name="validate-dead")
    numbered = first.reinterpret_as_keyed("k").process(NumberingFailingOnSeven(), "k string, v int, n bigint",
                                                       dead_letter=second_dead, name="number")
    numbered.get_side_output(second_dead).sink_to(dead2, name="number-dead")
    numbered.sink_to(out, name="numbered")
    assert "validate -> number" in env.explain(spark_plan=False)
    env.execute("chained-sides", progress=False)
    records = [r for b in batches for r in b]
    assert sorted((r["k"], r["v"]) for r in odd.rows()) == sorted((k, v) for _, k, v in records if v % 2 and v != 9)
    assert sorted(r["raw"] for r in dead1.rows()) == sorted(
        f'{{"ts": {ts}, "k": "{k}", "v": 9}}' for ts, k, v in records if v == 9)
    assert {r["error"] for r in dead1.rows()} <= {"step 'validate': Validating.process_element raised ValueError: nine"}
    assert sorted(r["raw"] for r in dead2.rows()) == sorted(
        f'{{"ts": {ts}, "k": "{k}", "v": 7}}' for ts, k, v in records if v == 7)
    kept = Counter(k for _, k, v in records if v not in (7, 9))
    per_key = defaultdict(list)
    for r in out.rows():
        per_key[r["k"]].append(r["n"])
    assert {k: sorted(ns) for k, ns in per_key.items()} == {k: list(range(1, n + 1)) for k, n in kept.items()}
    assert dead1.rows() and dead2.rows() and odd.rows()


class DedupePerKey(KeyedProcessFunction):
    """Forwards each (ts, v) of a key once."""

    def open(self, ctx):
        self.seen = ctx.get_state(MapStateDescriptor("seen"))

    def process_element(self, value, ctx):
        if not self.seen.contains((value["ts"], value["v"])):
            self.seen.put((value["ts"], value["v"]), True)
            yield value


@pytest.mark.parametrize("seed", [8, pytest.param(4, marks=pytest.mark.slow)])
def test_a_window_chained_to_a_dedupe_fires_as_flink_fires_it(env, seed):
    """A dedupe and a tumbling window on the same key in one operator (the job's one keyed
    step: the window fires in the batch whose records close it, Flink's periodic watermark),
    late records counted — equal to the model on the distinct records."""
    batches = model.random_batches(seed)
    given = [b + b[:2] for b in batches]
    distinct = [[r for r in b if not (r in seen or seen.add(r))] for seen in [set()] for b in given]
    expected = model.windows(distinct, 1_000, "tumbling", 4_000, in_batch=True)
    assert expected.late > 0
    sink, late = CollectSink(), CollectSink()
    late_tag = OutputTag("late", SCHEMA)
    windows = (env.from_source(ScriptedSource(given, SCHEMA), BOUND, name="events")
               .key_by("k").process(DedupePerKey(), SCHEMA, name="dedupe")
               .reinterpret_as_keyed("k").window(TumblingEventTimeWindows.of(4_000)).side_output_late_data(late_tag)
               .aggregate(CountSum(), output_schema="n bigint, v bigint", name="w"))
    windows.sink_to(sink)
    windows.get_side_output(late_tag).sink_to(late)
    assert "dedupe -> w: process DedupePerKey -> " in env.explain(spark_plan=False)
    env.execute("chained-window", progress=False)
    assert _fired(sink, batches, "v") == expected.fired  # (each window once, with its batch)
    assert len(late.rows()) == expected.late


def test_a_chained_window_with_built_in_aggregates_and_a_refused_processing_time_one(env):
    from ember import Agg, PipelineError, TumblingProcessingTimeWindows

    batches = [[(1_000, "a", 1), (1_000, "a", 1), (2_500, "b", 2)], [(9_000, "a", 3)]]
    sink = CollectSink()
    deduped = (env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
               .key_by("k").process(DedupePerKey(), SCHEMA, name="dedupe"))
    deduped.reinterpret_as_keyed("k").window(TumblingEventTimeWindows.of(5_000)).aggregate(
        n=Agg.count(), total=Agg.sum("v"), name="w").sink_to(sink)
    env.execute("chained-builtin", progress=False)
    assert sorted((r["k"], r["window_start"], r["n"], r["total"]) for r in sink.rows()) == [
        ("a", 0, 1, 1), ("a", 5_000, 1, 3), ("b", 0, 1, 2)]

    other = StreamEnvironment(master="local[2]", checkpoint_dir=env.config.checkpoint_dir, parallelism=2, spark=env.spark)
    (other.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
        .key_by("k").process(DedupePerKey(), SCHEMA, name="dedupe")
        .reinterpret_as_keyed("k").window(TumblingProcessingTimeWindows.of(5_000)).aggregate(n=Agg.count(), name="w")
        .sink_to(CollectSink()))
    with pytest.raises(PipelineError, match="a processing-time window cannot be chained to 'dedupe'"):
        other.execute("chained-processing-time", progress=False)


def test_a_chained_step_read_by_a_sink_and_a_keyed_step_fans_out(env):
    """A chain's output read twice — as it is, and by a step keyed by another field (a lane of
    the fan-out after the chain): running counts per key through both chained steps, then per
    count value."""
    batches = [[(1_000 + i, "abc"[i % 3], i) for i in range(9)], [(3_000 + i, "ab"[i % 2], i) for i in range(4)]]
    chained = (env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
               .key_by("k").process(Tally(), "k string, n bigint, m bigint", name="a")
               .reinterpret_as_keyed("k").process(Tally(), "k string, n bigint, m bigint", name="b"))
    raw, per_count = CollectSink(), CollectSink()
    chained.sink_to(raw, name="raw")
    chained.key_by("m").process(Tally(), "k string, n bigint, m bigint", name="per-count").sink_to(per_count)
    assert "lane 0 of the Spark operator shared by the steps reading 'a -> b'" in env.explain(spark_plan=False)
    env.execute("chained-fan-out", progress=False)
    per_key = Counter(k for b in batches for _, k, _ in b)
    assert sorted((r["k"], r["n"], r["m"]) for r in raw.rows()) == sorted(
        (k, m, m) for k, n in per_key.items() for m in range(1, n + 1))
    times = Counter(m for n in per_key.values() for m in range(1, n + 1))  # how often each count is reached
    assert sorted((r["n"], r["m"]) for r in per_count.rows()) == sorted(
        (m, i) for m, t in times.items() for i in range(1, t + 1))


def test_a_cep_step_chained_to_a_dedupe_finds_the_flows_of_the_distinct_events(env):
    """A dedupe and a CEP pattern on the same key in one operator (the pattern fed record by
    record, buffered to the watermark) — equal to a plain-Python scan of the distinct events:
    a flow opens with 1 or 3 and closes with 7 less than 2 s later (relaxed contiguity: each
    open starts a partial match; a close completes the earliest still within 2 s, and skipping
    past the match's last event drops the others)."""
    import random

    from ember.cep import CEP, Pattern, SkipStrategy

    rng = random.Random(3)
    events = [(1_000 + 50 * i, rng.choice("xyz"), rng.choice((1, 3, 7, 2, 4))) for i in range(400)]
    batches = [events[i:i + 50] + events[i:i + 50:7] for i in range(0, len(events), 50)]  # with repeats
    pattern = (Pattern.begin("open", skip=SkipStrategy.skip_past_last_event()).where(lambda e: e["v"] in (1, 3))
               .followed_by("close").where(lambda e: e["v"] == 7).within(timedelta(seconds=2)))
    sink = CollectSink()
    deduped = (env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
               .key_by("k").process(DedupePerKey(), SCHEMA, name="dedupe"))
    CEP.pattern(deduped.reinterpret_as_keyed("k"), pattern).select(
        lambda m: {"k": m["open"][0]["k"], "opened": m["open"][0]["ts"], "closed": m["close"][0]["ts"]},
        "k string, opened bigint, closed bigint", name="flows").sink_to(sink)
    assert "dedupe -> flows" in env.explain(spark_plan=False)
    env.execute("chained-cep", progress=False)
    expected, opens = [], defaultdict(list)
    for ts, k, v in events:
        if v in (1, 3):
            opens[k].append(ts)
        elif v == 7:
            alive = [o for o in opens[k] if ts - o < 2_000]
            if alive:
                expected.append((k, alive[0], ts))
                opens[k] = []
    assert len(expected) > 10
    assert sorted((r["k"], r["opened"], r["closed"]) for r in sink.rows()) == sorted(expected)


# --------------------------------------------------------------------------- process_batches beside other keyed steps
class BatchCounts(VectorizedKeyedFunction):
    """Per key and call: the key's records in it (``v``) and in all calls so far (``total``)."""

    state_schema = "total bigint"

    def process_batch(self, events, state, ctx):
        counts = events.groupby("k", sort=False).size()
        totals = state["total"].reindex(counts.index).fillna(0).to_numpy().astype("int64") + counts.to_numpy()
        out = pd.DataFrame({"k": counts.index, "v": counts.to_numpy().astype("int64"), "total": totals})
        return out, pd.DataFrame({"total": totals}, index=counts.index)


def test_process_batches_reads_a_keyed_step_with_event_time(env):
    """A vectorised step after a dedupe: its calls see the distinct records, its state counts them."""
    batches = model.random_batches(6, batches=6)
    given = [b + b[:3] for b in batches]
    sink = CollectSink()
    (env.from_source(ScriptedSource(given, SCHEMA), BOUND, name="events")
        .key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
        .key_by("k").process_batches(BatchCounts(), "k string, v bigint, total bigint", name="counts").sink_to(sink))
    env.execute("dedupe-then-batches", progress=False)
    distinct = Counter(k for k, _, _ in {(k, ts, v) for b in batches for ts, k, v in b})
    final = {}
    for r in sink.rows():
        final[r["k"]] = max(final.get(r["k"], 0), r["total"])
    assert final == dict(distinct)
    assert sum(r["v"] for r in sink.rows()) == sum(distinct.values())


def test_a_window_reads_process_batches_output_at_its_keys_latest_time(env):
    """A vectorised step read by a window with event time: each row it emits carries the latest
    event time of its key's records in the call — the window counts them there (the model: one
    record per key and batch, at that time; keys' latest times on both sides of window ends)."""
    # a and g share a state bucket (one call): a's row at 3,900, g's at 4,100 — not both at the call's 4,100
    assert env.spark.sql("SELECT pmod(xxhash64('a'), 128) = pmod(xxhash64('g'), 128)").first()[0]
    batches = [[(1_000, "a", 1), (3_900, "a", 1), (4_100, "g", 1)], [(6_000, "a", 1), (7_900, "g", 1), (8_100, "c", 1)],
               [(20_000, "a", 1)], *([(ts + 20_000, k, v) for ts, k, v in b] for b in model.random_batches(9, batches=5, keys="agc"))]
    sink = CollectSink()
    (env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
        .key_by("k").process_batches(BatchCounts(), "k string, v bigint, total bigint", name="counts")
        .key_by("k").window(TumblingEventTimeWindows.of(4_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="w").sink_to(sink))
    env.execute("batches-then-window", progress=False)
    stamped = []
    for b in batches:
        latest: dict = {}
        for ts, k, _ in b:
            latest[k] = max(latest.get(k, ts), ts)
        stamped.append([(t, k, sum(1 for _, kk, _ in b if kk == k)) for k, t in latest.items()])
    expected = model.windows(stamped, 1_000, "tumbling", 4_000)
    got = {}
    for b in sink.batches:
        for r in b.rows:
            got[(r["k"], r["window_start"], r["window_end"])] = (r["n"], r["v"])
    assert got == {w: (n, v) for w, (n, v, _) in expected.fired.items()}
    assert got[("a", 0, 4_000)] == (1, 2) and got[("g", 4_000, 8_000)] == (2, 2)
