"""SQL on streams (issue 17): ``stream.create_view(name)`` and ``env.sql(query)`` compiled by
Spark SQL, mixing with DataStream steps — a windowed aggregation checked against the model
(tests/flink_model.py: ``windows``) on a stream within its bound, a stream-static mix, SQL
windows over a keyed step's output (its records' timestamps, Flink's watermark: batch by
batch against the model, late records counted), an Ember window and a second SQL step over
a SQL window's results (the query's ``rowtime``), savepoints of such jobs (Spark's operator
numbering), and the query's mistakes reported before the job starts, naming the step."""

from __future__ import annotations

import os
import random
from datetime import timedelta

import flink_model as model
import pytest
from test_chains import CountSum, Dedupe, SumCounts, _distinct, _fired

from ember import (
    CollectSink,
    PipelineError,
    ScriptedSource,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from ember.errors import SavepointError
from ember.savepoints import create_savepoint

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
BOUND, SIZE = 1_000, 2_000
STRATEGY = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND), "ts")


def _in_bound(seed: int, batches: int = 8) -> list[list[tuple]]:
    """Out of order, each record at most the bound behind the front: none is late."""
    rng = random.Random(seed)
    front, out = 1_000, []
    for _ in range(batches):
        batch = []
        for _ in range(rng.randint(0, 6)):
            front += rng.randint(0, 300)
            batch.append((front - rng.randint(0, BOUND), rng.choice("ab"), rng.randint(1, 9)))
        out.append(batch)
    return out


def test_a_windowed_sql_aggregation_equals_the_model_batch_by_batch(env):
    data = _in_bound(5)
    env.from_source(ScriptedSource(data, SCHEMA), STRATEGY, name="events").filter("v > 0").create_view("events")
    sink = CollectSink()
    env.sql(f"""
        SELECT k, unix_millis(window.start) AS ws, unix_millis(window.end) AS we, count(*) AS n, sum(v) AS s
        FROM events GROUP BY k, window(rowtime, '{SIZE} milliseconds')
    """, name="per-window").sink_to(sink)
    result = env.execute("sql-windows", progress=False)
    got = {(r["k"], r["ws"], r["we"]): (r["n"], r["s"], b.batch_id if b.batch_id < len(data) else model.END)
           for b in sink.batches for r in b.rows}
    expected = model.windows(data, BOUND, "tumbling", SIZE)
    assert expected.late == 0 == result.late_dropped and len(expected.fired) > 3
    assert got == expected.fired


def test_a_where_clause_moves_no_row_out_of_the_watermarks_sight(env):
    """A ``WHERE`` on a field that is not the event time: Spark would push it below the view's
    watermark, so the rows it rejects would not move the watermark and the end-of-input row
    (null fields) would never pass it — the last windows would never fire. The watermark
    follows every record of the view (the model's ``keep``), and every window fires."""
    data = model.random_batches(3, keys="ab")
    expected = model.windows(data, BOUND, "tumbling", SIZE, keep=lambda r: r[2] % 3 != 0)
    assert expected != model.windows([[r for r in b if r[2] % 3 != 0] for b in data], BOUND, "tumbling", SIZE)
    assert any(b == model.END for *_, b in expected.fired.values())
    env.from_source(ScriptedSource(data, SCHEMA), STRATEGY, name="events").create_view("events")
    sink = CollectSink()
    env.sql(QUERY.format(what="count(*) AS n, sum(v) AS s", view="events WHERE v % 3 <> 0", size=SIZE),
            name="per-window").sink_to(sink)
    result = env.execute("sql-where", progress=False)
    assert _windows(sink, data) == expected.fired
    assert result.late_dropped == expected.late


def test_sql_mixes_with_datastream_steps_before_and_after(env):
    env.from_source(ScriptedSource([[(1, "a", 2), (2, "b", 3)], [(3, "a", 4)]], SCHEMA), None, name="events") \
        .map(lambda r: {**r, "v": r["v"] * 10}, name="tenfold").create_view("tenfold_events")
    sink = CollectSink()
    (env.sql("SELECT k, v + 1 AS v FROM tenfold_events WHERE k = 'a'", name="only-a")
        .filter(lambda r: r["v"] > 25, name="big").sink_to(sink))
    env.execute("sql-mix", progress=False)
    assert sorted((r["k"], r["v"]) for r in sink.rows()) == [("a", 41)]


def test_a_mistake_in_the_query_fails_before_the_job_starts_naming_the_step(env):
    env.from_source(ScriptedSource([[(1, "a", 2)]], SCHEMA), None, name="events").create_view("events")
    env.sql("SELECT no_such_field FROM events", name="broken").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'broken': Spark SQL refused the query: .*no_such_field"):
        env.execute("sql-broken", progress=False)


def test_an_aggregation_without_a_window_is_refused_naming_the_step(env):
    env.from_source(ScriptedSource([[(1, "a", 2)]], SCHEMA), None, name="events").create_view("events")
    env.sql("SELECT k, count(*) AS n FROM events GROUP BY k", name="counts").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'counts': Spark refused the job: .*must group by a window"):
        env.execute("sql-no-window", progress=False)


def _windows(sink, batches, names=("n", "s")):
    fired = {}
    for b in sink.batches:
        for r in b.rows:
            window = (r["k"], r["ws"], r["we"])
            assert window not in fired, f"window {window} emitted twice"
            fired[window] = (*(r[n] for n in names), b.batch_id if b.batch_id < len(batches) else model.END)
    return fired


QUERY = """SELECT k, unix_millis(window.start) AS ws, unix_millis(window.end) AS we, {what}
           FROM {view} GROUP BY k, window(rowtime, '{size} milliseconds')"""


def test_sql_windows_over_a_process_functions_output_equal_the_model_batch_by_batch(env):
    """A dedupe forwards each record once with its timestamp; the SQL window over its output
    fires in the batches Flink's window over the distinct records fires. Its late records are
    Spark's (judged by the previous batch's watermark in a query of several stateful
    operators, docs/sql.md), dropped and counted."""
    batches = model.random_batches(8)
    with_duplicates = [b + b[:2] for b in batches]
    expected = model.windows(_distinct(with_duplicates), BOUND, "tumbling", 4_000, late_by_previous=True)
    assert expected.late > 0 and any(b != model.END for *_, b in expected.fired.values())
    (env.from_source(ScriptedSource(with_duplicates, SCHEMA), STRATEGY, name="events")
        .key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe").create_view("distinct_events"))
    sink = CollectSink()
    env.sql(QUERY.format(what="count(*) AS n, sum(v) AS s", view="distinct_events", size=4_000),
            name="per-window").sink_to(sink)
    result = env.execute("sql-after-dedupe", progress=False)
    assert _windows(sink, with_duplicates) == expected.fired
    assert result.late_dropped == expected.late


def test_sql_windows_over_a_windows_results_read_their_flink_timestamps(env):
    """An Ember window's results carry ``window_end - 1`` as their timestamp (no field of theirs
    holds it): a larger SQL window over them equals the model's window of windows, batch by
    batch."""
    batches = model.random_batches(3)
    expected = model.window_of_windows(batches, BOUND, 2_000, 6_000)
    assert any(b != model.END for *_, b in expected.fired.values())
    (env.from_source(ScriptedSource(batches, SCHEMA), STRATEGY, name="events")
        .key_by("k").window(TumblingEventTimeWindows.of(2_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="small")
        .select("k", "n", "v").create_view("small_windows"))
    sink = CollectSink()
    env.sql(QUERY.format(what="sum(n) AS n, sum(v) AS s", view="small_windows", size=6_000),
            name="large").sink_to(sink)
    result = env.execute("sql-window-of-windows", progress=False)
    assert _windows(sink, batches) == expected.fired
    assert result.late_dropped == expected.late


@pytest.mark.parametrize("query", [
    "SELECT k, v FROM distinct_events WHERE v > 3",  # no stateful operator of Spark's
    pytest.param(QUERY.format(what="count(*) AS n, sum(v) AS s", view="distinct_events", size=4_000),
                 marks=pytest.mark.slow),  # one
    """SELECT k, count(*) AS m FROM (
           SELECT k, window AS w FROM distinct_events GROUP BY k, window(rowtime, '2 seconds'))
       GROUP BY k, window(w, '4 seconds')""",  # two
], ids=["stateless", "window", "window-of-windows"])
def test_a_savepoint_reads_the_keyed_steps_state_whatever_the_sql_step_after_it_plans(env, tmp_path, query):
    """Spark numbers stateful operators from the sink back, so the keyed step's operator id
    depends on how many the query after it plans (none, one, two): recorded when the job
    compiles, the savepoint reads and writes the dedupe's own state."""
    batches = model.random_batches(2, batches=4)
    with_duplicates = [b + b[:1] for b in batches]
    (env.from_source(ScriptedSource(with_duplicates, SCHEMA), STRATEGY, name="events")
        .key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe").create_view("distinct_events"))
    env.sql(query, name="q").sink_to(CollectSink())
    env.execute("sql-savepoint", progress=False)
    point = create_savepoint(os.path.join(env.config.checkpoint_dir, "sql-savepoint"), root=str(tmp_path / "sp"))
    seen = point.read_state("dedupe", env.spark)
    assert sorted(seen[["ts", "k", "v"]].itertuples(index=False, name=None)) == sorted(r for b in _distinct(batches) for r in b)
    # writing it: Spark's rewriter visits every operator the query plans, the dedupe's changed
    written = point.write_state("dedupe", lambda f: f[f["k"] != "a"], str(tmp_path / "sp" / "w"), env.spark)
    kept = written.read_state("dedupe", env.spark)
    assert sorted(kept[["ts", "k", "v"]].itertuples(index=False, name=None)) == sorted(
        r for b in _distinct(batches) for r in b if r[1] != "a")
    text = point.describe(env.spark)
    if "GROUP BY" not in query:
        assert "no state" in text
        with pytest.raises(SavepointError, match="'q' holds no state"):
            point.read_state("q", env.spark)


def test_an_ember_window_over_a_sql_windows_results_equals_the_window_of_windows(env):
    """A SQL window's results, stamped by the query's ``rowtime`` (Flink's ``window_end - 1``),
    feed an Ember window: batch by batch the model's window of windows (each result judged by
    the watermark before its batch, as a window's results are along a chain of keyed steps)."""
    batches = model.random_batches(3)
    expected = model.window_of_windows(batches, BOUND, 2_000, 6_000)
    assert expected.late > 0 and any(b != model.END for *_, b in expected.fired.values())
    env.from_source(ScriptedSource(batches, SCHEMA), STRATEGY, name="events").create_view("events")
    sink = CollectSink()
    (env.sql("""SELECT k, window.end - INTERVAL 1 MILLISECOND AS rowtime, count(*) AS n, sum(v) AS v
                FROM events GROUP BY k, window(rowtime, '2 seconds')""", name="small")
        .key_by("k").window(TumblingEventTimeWindows.of(6_000))
        .aggregate(SumCounts(), output_schema="n bigint, total bigint", name="large").sink_to(sink))
    result = env.execute("sql-then-window", progress=False)
    assert _fired(sink, batches) == expected.fired
    assert result.late_dropped == expected.late


def test_an_ember_window_over_the_union_of_a_sql_window_and_a_dedupe(env):
    """A keyed step reads a SQL step's rows and a keyed step's through a union: the SQL
    window's results (stamped by its ``rowtime``, emitted ahead of the watermark that fired
    them) and the dedupe's records (their own timestamps) meet in one Ember window, on the
    query's one watermark (the least of both sources'), batch by batch as the model says."""
    a, b = model.random_batches(3, keys="ab"), model.random_batches(103, keys="bc")
    with_duplicates = [x + x[:2] for x in b]
    watermarks = model.least_watermarks([a, b], BOUND, after_last=True)
    # Spark judges the SQL window's records by the batch before's watermark (several stateful operators)
    small, small_late = model.tumbling_results(a, BOUND, 2_000, watermarks, late_by_previous=True)
    expected = model.window_of_results_and_records(small, _distinct(with_duplicates), watermarks, 6_000, len(a))
    assert small_late > 0 and expected.late > 0 and len({b for *_, b in expected.fired.values()}) > 2
    env.from_source(ScriptedSource(a, SCHEMA), STRATEGY, name="a").create_view("a")
    windows = env.sql("""SELECT k, window.end - INTERVAL 1 MILLISECOND AS rowtime, count(*) AS n, sum(v) AS v
                         FROM a GROUP BY k, window(rowtime, '2 seconds')""", name="small")
    deduped = (env.from_source(ScriptedSource(with_duplicates, SCHEMA), STRATEGY, name="b")
               .key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe"))
    sink = CollectSink()
    (windows.select("k", "n", "CAST(v AS BIGINT) AS v")
        .union(deduped.select("k", "CAST(1 AS BIGINT) AS n", "CAST(v AS BIGINT) AS v"))
        .key_by("k").window(TumblingEventTimeWindows.of(6_000))
        .aggregate(SumCounts(), output_schema="n bigint, total bigint", name="large").sink_to(sink))
    result = env.execute("sql-and-dedupe", progress=False)
    assert _fired(sink, a) == expected.fired
    # (Spark counts the SQL window's late rows after combining a key's rows per window in a
    # partition: this input has no two late records of one key and window in one batch)
    assert result.late_dropped == small_late + expected.late


def test_a_keyed_step_after_a_sql_step_needs_the_querys_rowtime(env):
    env.from_source(ScriptedSource([[(1, "a", 2)]], SCHEMA), STRATEGY, name="events").create_view("events")
    (env.sql("SELECT k, v FROM events", name="picked").key_by("k")
        .process(Dedupe(), "k string, v int", name="dedupe").sink_to(CollectSink()))
    with pytest.raises(PipelineError, match="step 'picked': a keyed step reads this SQL step's rows, so the query must "
                                            "select each row's event time as a timestamp column 'rowtime' \\(found none"):
        env.execute("sql-then-keyed", progress=False)


def test_a_sql_window_over_a_sql_windows_results_equals_the_window_of_windows(env):
    """A second SQL step reads the first's rows by the ``rowtime`` the first selects: a 6 s
    window summing a 2 s window's results fires as the model's window of windows, batch by
    batch."""
    batches = model.random_batches(3)
    expected = model.window_of_windows(batches, BOUND, 2_000, 6_000)
    env.from_source(ScriptedSource(batches, SCHEMA), STRATEGY, name="events").create_view("events")
    (env.sql("""SELECT k, window.end - INTERVAL 1 MILLISECOND AS rowtime, count(*) AS n, sum(v) AS s
                FROM events GROUP BY k, window(rowtime, '2 seconds')""", name="small").create_view("small"))
    sink = CollectSink()
    env.sql(QUERY.format(what="sum(n) AS n, sum(s) AS s", view="small", size=6_000), name="large").sink_to(sink)
    result = env.execute("sql-then-sql", progress=False)
    assert _windows(sink, batches) == expected.fired
    assert result.late_dropped == expected.late


def test_the_sql_peaks_example_equals_its_plain_python_figures(load_example):
    example = load_example("sql_peaks")
    batches = example.clicks(seed=3, batches=5, per_batch=25)
    got = example.run(batches)
    assert [{k: r[k] for k in ("user", "start_ms", "peak", "total", "record")} for r in got] == example.expected(batches)
    assert len(got) >= 3


@pytest.mark.parametrize("beside", ["raw sink", pytest.param("dedupe", marks=pytest.mark.slow), "dedupe and raw sink"])
def test_a_sql_window_on_a_branch_of_its_own_equals_the_model_beside_the_rest(env, beside):
    """A SQL window over a source that other sinks read too — its raw records, a dedupe of it
    (a keyed step), or both (a fan-out): the query runs beside the rest of the job in the one
    streaming query (translators/parts.py) and fires each window in the batch Flink's
    window fires it; the other sinks get what they would alone. Refused before ("comes after
    the point where the job's sinks split")."""
    data = _in_bound(7)
    given = [b + b[:1] for b in data]
    expected = model.windows(given, BOUND, "tumbling", SIZE)
    assert expected.late == 0 and len(expected.fired) > 3
    src = env.from_source(ScriptedSource(given, SCHEMA), STRATEGY, name="events")
    src.create_view("events")
    windows, raw, deduped = CollectSink(), CollectSink(), CollectSink()
    env.sql(QUERY.format(what="count(*) AS n, sum(v) AS s", view="events", size=SIZE), name="per-window").sink_to(
        windows, name="windows")
    if "raw" in beside:
        src.sink_to(raw, name="raw")
    if "dedupe" in beside:
        src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe").sink_to(deduped, name="deduped")
    env.execute(f"sql-beside-{beside.replace(' ', '-')}", progress=False)
    assert _windows(windows, given) == expected.fired
    if "raw" in beside:
        assert sorted((r["ts"], r["k"], r["v"]) for r in raw.rows()) == sorted(r for b in given for r in b)
    if "dedupe" in beside:
        assert sorted((r["ts"], r["k"], r["v"]) for r in deduped.rows()) == sorted(r for b in _distinct(given) for r in b)


def test_a_job_with_a_sql_branch_restarts_from_its_checkpoint_and_savepoint_reads_each_step(spark, tmp_path):
    """Stopped after half its records and run again, a job with a SQL window beside a dedupe
    writes what one uninterrupted run writes; its savepoint reads the dedupe's state and the
    SQL window's (Spark numbers the query's operators the rest's first, then the branch's)."""
    data = model.random_batches(4, batches=8)
    given = [b + b[:1] for b in data]
    total = sum(len(b) for b in given)

    def run(name, max_events):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=str(tmp_path / "ckpt"), parallelism=2, spark=spark)
        windows, deduped = CollectSink(), CollectSink()
        src = env.from_source(ScriptedSource(given, SCHEMA), STRATEGY, name="events")
        src.create_view("events")
        env.sql(QUERY.format(what="count(*) AS n, sum(v) AS s", view="events", size=SIZE), name="per-window").sink_to(
            windows, name="windows")
        src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe").sink_to(deduped, name="deduped")
        env.execute(name, progress=False, max_events=max_events)  # (None: to the end of the input)
        return ([(r["k"], r["ws"], r["we"], r["n"], r["s"]) for r in windows.rows()],
                [(r["ts"], r["k"], r["v"]) for r in deduped.rows()])

    whole = run("sql-branch-whole", None)
    head = run("sql-branch-halves", total // 2)
    point = create_savepoint(str(tmp_path / "ckpt" / "sql-branch-halves"), root=str(tmp_path / "sp"))
    assert [op["name"] for op in point.operators] == ["per-window", "dedupe"]
    seen = point.read_state("dedupe", spark)
    assert sorted(seen[["ts", "k", "v"]].itertuples(index=False, name=None)) == sorted(set(head[1]))
    assert len(point.read_state("per-window", spark)) > 0
    tail = run("sql-branch-halves", None)
    assert 0 < len(head[0]) < len(whole[0])
    assert sorted(head[0] + tail[0]) == sorted(whole[0]) and sorted(head[1] + tail[1]) == sorted(whole[1])


def test_a_sql_window_on_a_branch_of_its_own_drops_late_records_as_it_does_alone(spark, tmp_path):
    """With late records (and a duplicate per batch), a SQL window beside a raw sink fires the
    model's windows in the model's batches and drops as many late rows as the same query alone:
    the branch runs Spark's one-stateful-operator late-row rule, not the previous batch's
    watermark of a query with several (``late_by_previous``). The raw sink gets every record."""
    data = model.random_batches(4, batches=8)
    given = [b + b[:1] for b in data]
    expected = model.windows(given, BOUND, "tumbling", SIZE)
    assert expected.late > 0 and expected.fired != model.windows(given, BOUND, "tumbling", SIZE,
                                                                  late_by_previous=True).fired

    def run(name, beside):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=str(tmp_path / name), parallelism=2, spark=spark)
        src = env.from_source(ScriptedSource(given, SCHEMA), STRATEGY, name="events")
        src.create_view("events")
        windows, raw = CollectSink(), CollectSink()
        env.sql(QUERY.format(what="count(*) AS n, sum(v) AS s", view="events", size=SIZE), name="per-window").sink_to(
            windows, name="windows")
        if beside:
            src.sink_to(raw, name="raw")
        result = env.execute(name, progress=False)
        return _windows(windows, given), result.late_dropped, raw

    alone, late_alone, _ = run("sql-late-alone", False)
    beside, late_beside, raw = run("sql-late-beside", True)
    assert alone == expected.fired == beside
    assert 0 < late_beside == late_alone <= expected.late
    assert sorted((r["ts"], r["k"], r["v"]) for r in raw.rows()) == sorted(r for b in given for r in b)
