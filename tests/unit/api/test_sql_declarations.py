"""SQL steps declared: views named, the query's views found, checked before Spark starts."""

import pytest

from ember import CollectSink, KeyedProcessFunction, PipelineError
from ember.graph.nodes import SqlNode
from ember.runner.spark.planner import plan


class Pass(KeyedProcessFunction):
    def process_element(self, value, ctx):
        yield value


def test_the_sql_node_reads_the_views_its_query_names(env, events):
    clicks = events().create_view("clicks")
    out = env.sql("SELECT k FROM clicks WHERE k <> 'clicks_x'", name="q")
    assert isinstance(out.node, SqlNode) and out.node.views == ("clicks",) and out.node.inputs == (clicks.node,)


def test_bad_views_and_queries_are_refused(env, events):
    stream = events()
    with pytest.raises(PipelineError, match="SQL identifier"):
        stream.create_view("no spaces")
    stream.create_view("clicks")
    with pytest.raises(PipelineError, match="exists already"):
        stream.filter("k = 'a'").create_view("CLICKS")
    with pytest.raises(PipelineError, match="reads no view"):
        env.sql("SELECT 1 FROM elsewhere")
    with pytest.raises(PipelineError, match="needs a query"):
        env.sql("  ")


def test_a_keyed_step_before_a_sql_step_emits_its_rows_times_on_transform_with_state(env, events):
    events().key_by("k").process(Pass(), "ts bigint, k string", name="dedupe").create_view("deduped")
    env.sql("SELECT k FROM deduped", name="q").sink_to(CollectSink())
    planned = plan(env.graph())
    dedupe = next(n for n in env.graph().nodes if n.name == "dedupe")
    # Spark passes its watermark on after transformWithStateInPandas, not after applyInPandasWithState
    assert planned.sql_beside_steps and planned.chained and planned.read_by_step(dedupe)


def test_a_keyed_step_after_a_sql_step_reads_its_rows_on_transform_with_state(env, events):
    events().create_view("raw")
    (env.sql("SELECT ts, k FROM raw", name="q").key_by("k")
        .process(Pass(), "ts bigint, k string", name="dedupe").sink_to(CollectSink()))
    planned = plan(env.graph())
    q, dedupe = (next(n for n in env.graph().nodes if n.name == name) for name in ("q", "dedupe"))
    assert planned.chained and planned.upstream_sql(dedupe) is q and planned.read_by_step_after_sql(q)


def test_a_two_input_step_reads_sql_steps_on_both_inputs(env, events):
    from ember import KeyedCoProcessFunction

    class Both(KeyedCoProcessFunction):
        def process_element1(self, value, ctx):
            yield value

        def process_element2(self, value, ctx):
            yield value

    stream = events()
    stream.create_view("raw")
    q = env.sql("SELECT ts, k, rowtime FROM raw", name="q")
    r = env.sql("SELECT ts, k, rowtime FROM raw WHERE k <> 'x'", name="r")
    q.connect(r).key_by("k", "k").process(Both(), "ts bigint, k string", name="co").sink_to(CollectSink())
    planned = plan(env.graph())
    q, r, co = (next(n for n in env.graph().nodes if n.name == name) for name in ("q", "r", "co"))
    # each query's rows carry their event time (translators/sql.py), not only the first one's
    assert planned.read_by_step_after_sql(q) and planned.read_by_step_after_sql(r)
    assert planned.upstream_sql(co) is q and planned.chained


def test_a_keyed_step_reading_a_sql_step_and_a_keyed_step_through_a_union(env, events):
    stream = events()
    stream.create_view("raw")
    q = env.sql("SELECT ts, k, rowtime FROM raw", name="q").select("ts", "k")
    d = stream.key_by("k").process(Pass(), "ts bigint, k string", name="dedupe")
    q.union(d).key_by("k").process(Pass(), "ts bigint, k string", name="both").sink_to(CollectSink())
    planned = plan(env.graph())
    q, dedupe, both = (next(n for n in env.graph().nodes if n.name == name) for name in ("q", "dedupe", "both"))
    assert planned.read_by_step_after_sql(q) and planned.read_by_step(dedupe) and planned.upstream_sql(both) is q


def test_a_keyed_step_reads_the_last_of_two_sql_steps_in_a_row(env, events):
    """Only the query whose rows the step reads carries their event time (not the one before it)."""
    events().create_view("raw")
    env.sql("SELECT ts, k, rowtime FROM raw", name="first").create_view("firsts")
    (env.sql("SELECT ts, k, rowtime FROM firsts", name="second").key_by("k")
        .process(Pass(), "ts bigint, k string", name="step").sink_to(CollectSink()))
    planned = plan(env.graph())
    first, second = (next(n for n in env.graph().nodes if n.name == name) for name in ("first", "second"))
    assert planned.read_by_step_after_sql(second) and not planned.read_by_step_after_sql(first)


def test_a_sql_step_beside_keyed_steps_in_a_fan_out_is_refused_by_the_planner(env, events):
    events().create_view("raw")
    q = env.sql("SELECT ts, k, rowtime FROM raw", name="q")
    q.sink_to(CollectSink(), name="all")
    q.key_by("k").process(Pass(), "ts bigint, k string", name="dedupe").sink_to(CollectSink(), name="out")
    with pytest.raises(PipelineError, match="step 'q': the job's rows part into several readers .* SQL step in a fan-out"):
        plan(env.graph())


def test_a_sql_step_on_a_branch_of_its_own_runs_beside_the_rest_of_the_job(env, events):
    """One source read by a SQL view and, on another branch, by a keyed step and a raw sink: the
    query is a SQL branch, beside the rest (a fan-out at the source); every sink is written from
    the query's rows."""
    stream = events()
    stream.create_view("raw")
    env.sql("SELECT k, count(*) AS n FROM raw GROUP BY k", name="q").sink_to(CollectSink(), name="counts")
    stream.key_by("k").process(Pass(), "ts bigint, k string", name="dedupe").sink_to(CollectSink(), name="out")
    stream.sink_to(CollectSink(), name="all")
    planned = plan(env.graph())
    assert [n.name for n in planned.sql_branches] == ["q"]
    assert planned.fan_out is not None and [n.name for n in planned.fan_out.lanes] == ["dedupe"]
    assert sorted(s.name for s in planned.streamed_sinks) == ["all", "counts", "out"]


def test_a_sql_branch_whose_rows_meet_other_rows_is_refused_naming_the_step(env, events):
    stream = events()
    stream.create_view("raw")
    q = env.sql("SELECT ts, k FROM raw WHERE k = 'a'", name="q").select("ts", "k", name="again")
    q.union(stream.select("ts", "k", name="plain"), name="mixed").sink_to(CollectSink(), name="both")
    stream.sink_to(CollectSink(), name="all")
    with pytest.raises(PipelineError, match="step 'mixed'.*reads the rows of the SQL step 'q'.*and those of 'plain'"):
        plan(env.graph())


def test_a_sql_branch_beside_a_step_reading_two_stateful_steps_is_refused(env, events):
    stream = events()
    stream.create_view("raw")
    env.sql("SELECT ts, k FROM raw", name="q").sink_to(CollectSink(), name="rows")
    a = stream.key_by("k").process(Pass(), "ts bigint, k string", name="a")
    b = stream.key_by("k").process(Pass(), "ts bigint, k string", name="b")
    a.union(b).key_by("k").process(Pass(), "ts bigint, k string", name="both").sink_to(CollectSink(), name="out")
    with pytest.raises(PipelineError, match="step 'q'.*beside the rest of the job, and 'both' reads several stateful steps"):
        plan(env.graph())
