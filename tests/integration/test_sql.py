"""SQL on streams (issue 17): ``stream.create_view(name)`` and ``env.sql(query)`` compiled by
Spark SQL, mixing with DataStream steps — a windowed aggregation checked against the model
(tests/flink_model.py: ``windows``) on a stream within its bound, a stream-static mix, and
the query's mistakes reported before the job starts, naming the step."""

from __future__ import annotations

import random
from datetime import timedelta

import flink_model as model
import pytest

from ember import CollectSink, PipelineError, ScriptedSource, WatermarkStrategy

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
BOUND, SIZE = 1_000, 2_000


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
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND), "ts")
    env.from_source(ScriptedSource(data, SCHEMA), strategy, name="events").filter("v > 0").create_view("events")
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
