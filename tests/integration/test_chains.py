"""Several keyed steps in one job (issue 17): chains of process functions and Python
windows, event time flowing between them as in Flink, checked batch by batch against
the independent model (tests/flink_model.py)."""

from __future__ import annotations

import json
import os
import re
from datetime import timedelta

import flink_model as model
import pyarrow.compute as pc
import pytest

from ember import (
    AggregateFunction,
    CollectSink,
    KeyedProcessFunction,
    OutputTag,
    ScriptedSource,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from ember.errors import JobFailedError, PipelineError, RestartError
from ember.savepoints import create_savepoint
from ember.state.descriptors import ValueStateDescriptor

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
BOUND = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=1_000), "ts")


class CountSum(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, acc):
        return (acc[0] + 1, acc[1] + value["v"])

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])

    def get_result(self, acc):
        return {"n": acc[0], "v": acc[1]}  # "v": the next window sums it like a record's value


class SumCounts(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, acc):
        return (acc[0] + value["n"], acc[1] + value["v"])

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])

    def get_result(self, acc):
        return {"n": acc[0], "total": acc[1]}


class Dedupe(KeyedProcessFunction):
    """Forwards the first record of each key (the whole record is the key)."""

    def open(self, ctx):
        self.seen = ctx.get_state(ValueStateDescriptor("seen"))

    def process_element(self, value, ctx):
        if self.seen.value() is None:
            self.seen.update(True)
            yield value


class Report(KeyedProcessFunction):
    """Reports each window result with the timestamp and watermark it arrives with, and
    sets a timer ``delay`` ms after it."""

    def __init__(self, delay):
        self.delay = delay

    def process_element(self, value, ctx):
        ctx.register_event_time_timer(ctx.timestamp + self.delay)
        yield {"k": value["k"], "what": "result", "end": value["window_end"], "n": value["n"],
               "ts": ctx.timestamp, "wm": ctx.current_watermark}

    def on_timer(self, timestamp, ctx):
        yield {"k": ctx.current_key, "what": "timer", "end": None, "n": None, "ts": timestamp, "wm": None}


def _distinct(batches):
    """The batches with each record's first occurrence only (what ``Dedupe`` forwards)."""
    seen: set = set()
    return [[r for r in b if not (r in seen or seen.add(r))] for b in batches]


def _label(batch_id, batches):
    return batch_id if batch_id < len(batches) else model.END


def _reported(sink, batches):
    """What ``Report`` emitted: the window results it saw and the timers it fired, each with
    its batch (sorted as model.window_then_timers returns them)."""
    got_seen, got_fired = [], []
    for b in sink.batches:
        label = _label(b.batch_id, batches)
        for r in b.rows:
            if r["what"] == "result":
                got_seen.append((r["k"], r["end"], r["n"], r["ts"], "?" if label == model.END else r["wm"], label))
            else:
                got_fired.append((r["k"], r["ts"], label))
    return sorted(got_seen, key=str), sorted(got_fired, key=str)


def _fired(sink, batches, total="total"):
    fired = {}
    for b in sink.batches:
        for r in b.rows:
            window = (r["k"], r["window_start"], r["window_end"])
            assert window not in fired, f"window {window} emitted twice"
            fired[window] = (r["n"], r[total], _label(b.batch_id, batches))
    return fired


def test_dedupe_then_window_equals_the_window_of_the_distinct_records(env):
    batches = model.random_batches(8)
    with_duplicates = [b + b[:2] for b in batches]  # every batch repeats records: dedupe removes them
    expected = model.windows(_distinct(with_duplicates), 1_000, "tumbling", 4_000)
    assert expected.late > 0
    sink = CollectSink()
    src = env.from_source(ScriptedSource(with_duplicates, SCHEMA), BOUND, name="events")
    (src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
        .filter("v > 0")  # a Spark-side filter between two keyed steps keeps the rows' event time
        .key_by("k").window(TumblingEventTimeWindows.of(4_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="w").sink_to(sink))
    result = env.execute("dedupe-window", progress=False)
    assert _fired(sink, batches, "v") == expected.fired
    assert result.late_dropped == expected.late


def test_a_window_reads_the_union_of_two_dedupes_and_a_source(env, tmp_path):
    """A one-input step reading two stateful steps through a union, and a plain stream beside
    them: every row keeps its own event time, the watermark is the least of the three
    sources' (Spark's one per query), and the window fires per batch what the model fires
    on the union of what each input passes. A savepoint reads each dedupe's state as its own
    (Spark numbers the operators branch by branch: restart.spark_operator_ids)."""
    a, b, c = (model.random_batches(seed, keys=keys) for seed, keys in ((11, "ab"), (12, "bc"), (13, "ac")))
    a, b = ([x + x[:2] for x in batches] for batches in (a, b))  # each dedupe removes what its batches repeat
    sources = [env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name=name) for batches, name in ((a, "a"), (b, "b"), (c, "c"))]
    deduped = [s.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name=f"dedupe-{n}") for s, n in zip(sources, "ab")]
    sink = CollectSink()
    (deduped[0].union(deduped[1], sources[2]).key_by("k").window(TumblingEventTimeWindows.of(2_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="w").sink_to(sink))
    result = env.execute("union-of-steps", progress=False)
    union = [x + y + z for x, y, z in zip(_distinct(a), _distinct(b), c)]
    fired, late = model.tumbling_results(union, 1_000, 2_000, model.least_watermarks([a, b, c], 1_000, after_last=True))
    expected = sorted((r[0], r[1], r[2], r[3], k if k < len(a) else model.END)
                      for k, results in enumerate(fired) for r in results)
    got = sorted((r["k"], r["window_end"] - 1, r["n"], r["v"], _label(bt.batch_id, a)) for bt in sink.batches for r in bt.rows)
    assert late > 0 and len({e[-1] for e in expected}) > 3
    assert got == expected
    assert result.late_dropped == late

    point = create_savepoint(os.path.join(env.config.checkpoint_dir, "union-of-steps"), root=str(tmp_path / "sp"))
    for name, batches in (("dedupe-a", a), ("dedupe-b", b)):
        seen = point.read_state(name, env.spark)
        assert sorted(seen[["ts", "k", "v"]].itertuples(index=False, name=None)) == sorted(r for x in _distinct(batches) for r in x)


@pytest.mark.parametrize("seed", [8, pytest.param(3, marks=pytest.mark.slow)])
def test_window_of_windows_fires_in_the_batch_flink_fires_it(env, seed):
    batches = model.random_batches(seed)
    expected = model.window_of_windows(batches, 1_000, 2_000, 6_000)
    assert any(b != model.END for *_, b in expected.fired.values())
    sink = CollectSink()
    src = env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
    (src.key_by("k").window(TumblingEventTimeWindows.of(2_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="small")
        .key_by("k").window(TumblingEventTimeWindows.of(6_000))
        .aggregate(SumCounts(), output_schema="n bigint, total bigint", name="large").sink_to(sink))
    result = env.execute("window-of-windows", progress=False)
    assert _fired(sink, batches) == expected.fired
    assert result.late_dropped == expected.late


@pytest.mark.parametrize("dedupe", [pytest.param(False, marks=pytest.mark.slow), True], ids=["two-steps", "three-steps"])
def test_window_results_reach_a_process_function_with_flinks_timestamps_and_watermark(env, dedupe):
    batches = model.random_batches(8)
    given = [b + b[:1] for b in batches] if dedupe else batches  # dedupe drops the repeated records
    seen, fired = model.window_then_timers(_distinct(given), 1_000, 2_000, 1_500)
    sink = CollectSink()
    src = env.from_source(ScriptedSource(given, SCHEMA), BOUND, name="events")
    if dedupe:  # a first step forwarding each record once, with its timestamp
        src = src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    (src.key_by("k").window(TumblingEventTimeWindows.of(2_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="w")
        .key_by("k").process(Report(1_500), "k string, what string, end bigint, n bigint, ts bigint, wm bigint",
                             name="report").sink_to(sink))
    env.execute("window-report", progress=False)
    assert _reported(sink, batches) == (seen, fired)


class RunningCount(KeyedProcessFunction):
    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n"))

    def process_element(self, value, ctx):
        n = (self.n.value() or 0) + 1
        self.n.update(n)
        yield {"k": value["k"], "n": n}


def test_processing_time_chain_of_process_functions(env):
    batches = [[(1, "a", 1), (2, "b", 1)], [(3, "a", 1)], [(4, "a", 1), (5, "b", 1), (6, "c", 1)]]
    sink = CollectSink()
    src = env.from_source(ScriptedSource(batches, SCHEMA), name="events")
    (src.key_by("k").process(RunningCount(), "k string, n bigint", name="per-key")
        .key_by("n").process(RunningCount(), "k string, n bigint", name="per-count").sink_to(sink))
    env.execute("counts-of-counts", progress=False)
    rows = sorted((r["k"], r["n"]) for r in sink.rows())
    # per-key emits (a,1) (b,1) (a,2) (a,3) (b,2) (c,1); per-count counts by n: n=1 x3, n=2 x2, n=3 x1
    assert sorted(n for _, n in rows) == [1, 1, 1, 2, 2, 3]
    assert len(rows) == 6


@pytest.mark.parametrize("between", [pytest.param("map", marks=pytest.mark.slow), "flat_map"])
def test_python_steps_between_two_windows_keep_each_records_event_time(env, between):
    """A Python map / flat_map between two keyed steps passes every output on with its input
    record's timestamp (Flink's rule), so the window of windows still fires as the model says;
    the functions never see the rows' hidden columns."""
    batches = model.random_batches(8)
    expected = model.window_of_windows(batches, 1_000, 2_000, 6_000)
    sink = CollectSink()

    def scaled(r):  # the small window's result, its sum scaled by 10 (undone below)
        assert not any(name.startswith("__ember") for name in r), r
        return {**r, "v": r["v"] * 10}

    def split(r):  # two halves of the small window's result: the large window adds them up again
        assert not any(name.startswith("__ember") for name in r), r
        return [{**r, "n": r["n"], "v": r["v"] * 5}, {**r, "n": 0, "v": r["v"] * 5}]

    step = (lambda s: s.map(scaled, name="scale")) if between == "map" else (lambda s: s.flat_map(split, name="split"))
    src = env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
    small = (src.key_by("k").window(TumblingEventTimeWindows.of(2_000))
             .aggregate(CountSum(), output_schema="n bigint, v bigint", name="small"))
    (step(small).key_by("k").window(TumblingEventTimeWindows.of(6_000))
        .aggregate(SumCounts(), output_schema="n bigint, total bigint", name="large").sink_to(sink))
    result = env.execute(f"window-{between}-window", progress=False)
    fired = {w: (n, total // 10, label) for w, (n, total, label) in _fired(sink, batches).items()}
    assert fired == expected.fired
    assert result.late_dropped == expected.late


# join_lookup runs inside join_lookup_unmatched (a select after it), and Arrow map_batches between keyed
# steps in test_map_batches_with_dead_letters_between_keyed_steps_keeps_the_others_event_time: make test-all
# runs them alone
@pytest.mark.parametrize("between", [pytest.param("select", marks=pytest.mark.slow),
                                     pytest.param("join_lookup", marks=pytest.mark.slow), "join_lookup_unmatched",
                                     pytest.param("map_batches_arrow", marks=pytest.mark.slow), "map_batches_pandas"])
def test_sql_steps_between_two_windows_keep_each_records_event_time(env, between):
    """A projection (``select``), and a lookup join followed by one, between two keyed steps:
    each output row keeps its input row's event time, so the window of windows fires as the
    model says. With ``unmatched=``, key 'c' has no match: its small windows are dead letters
    (their records as the user sees them, no hidden column), the other keys' large windows
    are the model's."""
    batches = model.random_batches(8)
    expected = model.window_of_windows(batches, 1_000, 2_000, 6_000)
    sink, dead = CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
    small = (src.key_by("k").window(TumblingEventTimeWindows.of(2_000))
             .aggregate(CountSum(), output_schema="n bigint, v bigint", name="small"))
    if between == "select":
        scaled = small.select("k", "window_start", "window_end", "n", "v * 10 AS v", name="scale")
    elif between == "map_batches_arrow":  # one row per input row: each keeps its record's event time
        def scale(batch):
            assert not any(name.startswith("__ember") for name in batch.schema.names), batch.schema
            return batch.set_column(batch.schema.get_field_index("v"), "v", pc.multiply(batch.column("v"), 10))

        scaled = small.map_batches(scale, name="scale")
    elif between == "map_batches_pandas":
        def scale_frame(pdf):
            assert not any(name.startswith("__ember") for name in pdf.columns), pdf.columns
            return pdf.assign(v=pdf["v"] * 10)

        scaled = small.map_batches(scale_frame, batch_format="pandas", name="scale")
    else:
        tag = OutputTag("unmatched") if between == "join_lookup_unmatched" else None
        factors = [{"k": k, "factor": 10} for k in ("ab" if tag else "abc")]
        joined = small.join_lookup(factors, on="k", unmatched=tag, name="factors")
        if tag is not None:
            joined.get_side_output(tag).sink_to(dead, name="dead")
        scaled = joined.select("k", "window_start", "window_end", "n", "v * factor AS v", name="scale")
    (scaled.key_by("k").window(TumblingEventTimeWindows.of(6_000))
        .aggregate(SumCounts(), output_schema="n bigint, total bigint", name="large").sink_to(sink, name="out"))
    result = env.execute(f"window-{between}-window", progress=False)
    fired = {w: (n, total // 10, label) for w, (n, total, label) in _fired(sink, batches).items()}
    if between == "join_lookup_unmatched":
        assert fired == {w: r for w, r in expected.fired.items() if w[0] != "c"}
        letters = [json.loads(r["raw"]) for r in dead.rows()]
        assert letters and all(set(r) == {"k", "window_start", "window_end", "n", "v"} and r["k"] == "c" for r in letters)
        assert sum(r["n"] for r in letters) == sum(n for (k, *_), (n, *_) in expected.fired.items() if k == "c")
    else:
        assert fired == expected.fired
        assert result.late_dropped == expected.late


def test_map_batches_between_keyed_steps_that_changes_the_row_count_fails_naming_the_step(env):
    """Which output row came from which record could only be guessed: a function returning
    another number of rows than it was given fails the job, naming the step and the rule."""
    batches = model.random_batches(8)
    src = env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
    small = (src.key_by("k").window(TumblingEventTimeWindows.of(2_000))
             .aggregate(CountSum(), output_schema="n bigint, v bigint", name="small"))
    (small.map_batches(lambda batch: batch.slice(0, batch.num_rows // 2), name="halve")
        .key_by("k").window(TumblingEventTimeWindows.of(6_000))
        .aggregate(SumCounts(), output_schema="n bigint, total bigint", name="large").sink_to(CollectSink()))
    with pytest.raises(JobFailedError, match=r"step 'halve'.*must return one row per input row.*returned \d+ rows for \d+"):
        env.execute("halving", progress=False)


@pytest.mark.parametrize("how", ["arrow-raises", "arrow-drops", pytest.param("pandas-raises", marks=pytest.mark.slow)])
def test_map_batches_with_dead_letters_between_keyed_steps_keeps_the_others_event_time(env, how):
    """A dedupe, then ``map_batches`` that fails on the records with v == 7 (it raises, or
    leaves their rows out: another row count), then a window: the batch is narrowed down to
    those records, which become dead letters with the reason; every other row keeps its
    record's event time, so the window equals the model's over the distinct records but those."""
    batches = model.random_batches(8)
    given = [b + b[:1] for b in batches]
    distinct = _distinct(given)
    sevens = sorted(r for b in distinct for r in b if r[2] == 7)
    expected = model.windows(distinct, 1_000, "tumbling", 4_000, keep=lambda r: r[2] != 7)
    assert sevens and expected.late > 0
    fmt, fails = how.split("-")

    def arrow_fn(batch):
        if fails == "raises" and 7 in batch.column("v").to_pylist():
            raise ValueError("sevens are not allowed")
        return batch.filter(pc.not_equal(batch.column("v"), 7)) if fails == "drops" else batch

    def pandas_fn(pdf):
        if (pdf["v"] == 7).any():
            raise ValueError("sevens are not allowed")
        return pdf

    bad, sink, letters = OutputTag("bad"), CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(given, SCHEMA), BOUND, name="events")
    mapped = (src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
              .map_batches(arrow_fn if fmt == "arrow" else pandas_fn, batch_format=fmt, dead_letter=bad, name="check"))
    mapped.get_side_output(bad).sink_to(letters, name="bad-out")
    (mapped.key_by("k").window(TumblingEventTimeWindows.of(4_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="w").sink_to(sink, name="out"))
    result = env.execute(f"map-batches-dead-{how}", progress=False)
    assert _fired(sink, given, total="v") == expected.fired
    assert result.late_dropped == expected.late
    got = sorted(tuple(json.loads(r["raw"])[f] for f in ("ts", "k", "v")) for r in letters.rows())
    assert got == sevens
    reason = "sevens are not allowed" if fails == "raises" else "must return one row per input row.*returned 0 rows for 1"
    assert all(re.search(f"step 'check'.*{reason}", r["error"]) for r in letters.rows())


def test_map_batches_dead_letters_read_by_a_keyed_step_between_keyed_steps_are_refused(env):
    src = env.from_source(ScriptedSource([[(1, "a", 1)]], SCHEMA), BOUND, name="events")
    bad = OutputTag("bad")
    first = src.key_by("k").process(Dedupe(), SCHEMA, name="dedupe")
    mapped = first.map_batches(lambda batch: batch, dead_letter=bad, name="reshape")
    mapped.get_side_output(bad).key_by("raw").process(Dedupe(), "raw string, error string", name="letters").sink_to(
        CollectSink(), name="bad-out")
    mapped.key_by("k").process(Dedupe(), SCHEMA, name="again").sink_to(CollectSink(), name="out")
    with pytest.raises(PipelineError, match="reshape"):
        env.execute("refused", progress=False)


def test_explain_shows_each_keyed_step_on_transform_with_state(env):
    src = env.from_source(ScriptedSource([[(1, "a", 1)]], SCHEMA), BOUND, name="events")
    (src.key_by("k").process(Dedupe(), SCHEMA, name="dedupe")
        .key_by("k").process(Dedupe(), SCHEMA, name="again").sink_to(CollectSink()))
    text = env.explain()
    assert "dedupe: process Dedupe" in text and "again: process Dedupe" in text
    assert text.count("TransformWithStateInPySpark transformWithStateUDF") >= 2 and "FlatMapGroupsInPandasWithState" not in text


def test_a_checkpoint_of_one_operator_kind_is_refused_by_the_other(spark, tmp_path):
    def job(**options):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark, **options)
        src = env.from_source(ScriptedSource([[(1, "a", 1)]], SCHEMA), BOUND, name="events")
        src.key_by("k").process(Dedupe(), SCHEMA, name="dedupe").sink_to(CollectSink())
        return env

    job().execute("one", progress=False)
    with pytest.raises(RestartError, match="'dedupe'.*held by Spark's applyInPandasWithState.*transformWithStateInPandas"):
        job(keyed_operator="transform_with_state").execute("one", progress=False)
