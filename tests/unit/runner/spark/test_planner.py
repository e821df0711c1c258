"""The Spark runner's plan of a graph: where sinks split, which side outputs detour,
and what one Spark query cannot run — all without a SparkSession."""

import pytest

from ember import (
    CollectSink,
    KeyedProcessFunction,
    OutputTag,
    PipelineError,
    ScriptedSource,
    TumblingEventTimeWindows,
    YahooSource,
)
from ember.runner.spark.planner import native_window, plan


def test_one_sink_needs_no_split(env, events):
    sink = events().filter("k = 'a'").sink_to(CollectSink(), name="out")
    p = plan(env.graph())
    assert p.fork is None and p.detours == () and p.streamed_sinks == (sink,)


def test_several_sinks_split_after_their_last_shared_step(env, events):
    s = events().filter("k = 'a'", name="only-a")
    s.sink_to(CollectSink(), name="all")
    s.select("k", name="keys").sink_to(CollectSink(), name="keys-out")
    assert plan(env.graph()).fork.name == "only-a"


def test_a_stateful_step_after_the_split_is_refused(env, events):
    s = events()
    s.sink_to(CollectSink(), name="raw")
    s.key_by("k").window(TumblingEventTimeWindows.of(1000)).count(name="counts").sink_to(CollectSink(), name="out")
    graph = env.graph()  # a valid graph ...
    with pytest.raises(PipelineError, match="'counts' .* comes after the point where the job's sinks .* split at 'events'"):
        plan(graph)  # ... that one Spark query cannot run


def test_sinks_of_unrelated_pipelines_are_refused(env, events):
    events().sink_to(CollectSink(), name="one")
    env.from_source(ScriptedSource([[(1, "b")]], "ts bigint, k string"), name="other").sink_to(CollectSink(), name="two")
    with pytest.raises(PipelineError, match="unrelated pipelines"):
        plan(env.graph())


def test_a_window_after_a_window_runs_both_on_the_window_operator_chained(env, events):
    w = TumblingEventTimeWindows.of(1000)
    (
        events().key_by("k").window(w).count(name="first")
        .key_by("k").window(w).count(name="second").sink_to(CollectSink())
    )
    graph = env.graph()
    p = plan(graph)
    first, second = (next(n for n in graph.nodes if n.name == name) for name in ("first", "second"))
    assert not native_window(first, graph) and not native_window(second, graph)
    assert p.chained and p.upstream_step(second) is first and p.read_by_step(first) and not p.read_by_step(second)


def test_dead_letters_beside_a_window_detour_instead_of_splitting(env):
    bad = OutputTag("bad_json")
    decoded = env.from_source(YahooSource(as_json=True), name="ad-events").parse_json(
        "event", "ad_id string, event_time bigint", dead_letter=bad, name="decode")
    counts = (decoded.key_by("ad_id").window(TumblingEventTimeWindows.of(1000)).count(name="per-ad")
              .sink_to(CollectSink(), name="counts"))
    dead = decoded.get_side_output(bad).sink_to(CollectSink(), name="dead")
    p = plan(env.graph())
    assert p.fork is None  # the window's sink alone is streamed
    assert [d.tag for d in p.detours] == [bad] and p.detoured_sinks(p.detours[0]) == [dead]
    assert p.streamed_sinks == (counts,)


class _Count(KeyedProcessFunction):
    def process_element(self, value, ctx):
        yield value


def test_two_keyed_state_steps_chain(env, events):
    first = events().key_by("k").process(_Count(), "ts bigint, k string", name="first")
    first.key_by("k").process(_Count(), "ts bigint, k string", name="second").sink_to(CollectSink())
    p = plan(env.graph())
    assert p.chained and p.upstream_step(next(n for n in p.graph.nodes if n.name == "second")).name == "first"


def test_one_keyed_step_is_not_chained(env, events):
    events().key_by("k").process(_Count(), "ts bigint, k string", name="only").sink_to(CollectSink())
    assert not plan(env.graph()).chained


def test_a_python_map_between_two_keyed_steps_is_chained(env, events):
    first = events().key_by("k").process(_Count(), "ts bigint, k string", name="first")
    (first.map(lambda r: r, name="reshape").key_by("k").process(_Count(), "ts bigint, k string", name="second")
     .sink_to(CollectSink()))
    p = plan(env.graph())
    assert p.chained and p.upstream_step(next(n for n in p.graph.nodes if n.name == "second")).name == "first"


def test_a_vectorised_map_between_two_keyed_steps_is_refused_naming_it(env, events):
    first = events().key_by("k").process(_Count(), "ts bigint, k string", name="first")
    (first.map_batches(lambda pdf: pdf, name="reshape").key_by("k").process(_Count(), "ts bigint, k string", name="second")
     .sink_to(CollectSink()))
    with pytest.raises(PipelineError, match="step 'reshape'.*between the stateful steps 'first' and 'second'"):
        plan(env.graph())


def test_a_step_reading_two_stateful_streams_is_refused(env, events):
    src = events()
    a = src.key_by("k").process(_Count(), "ts bigint, k string", name="a")
    b = src.key_by("k").process(_Count(), "ts bigint, k string", name="b")
    a.union(b).key_by("k").process(_Count(), "ts bigint, k string", name="both").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'both'.*several stateful steps"):
        plan(env.graph())


def test_execute_refuses_an_unrunnable_plan_before_touching_the_checkpoint(env, tmp_path, events):
    s = events()
    s.sink_to(CollectSink(), name="raw")
    s.key_by("k").window(TumblingEventTimeWindows.of(1000)).count(name="counts").sink_to(CollectSink(), name="out")
    with pytest.raises(PipelineError, match="'counts' .* comes after the point"):
        env.execute("refused", checkpoint=tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_the_planner_runs_plain_windows_natively_and_the_rest_on_the_window_operator(env, events):
    from ember import Agg
    from ember.windowing.triggers import CountTrigger

    keyed = events().key_by("k")
    keyed.window(TumblingEventTimeWindows.of(1000)).aggregate(n=Agg.count(), name="plain").sink_to(CollectSink())
    (keyed.window(TumblingEventTimeWindows.of(1000)).trigger(CountTrigger.of(2)).count(name="triggered")
     .sink_to(CollectSink()))
    graph = env.graph()
    by_name = {n.name: n for n in graph.nodes}
    assert native_window(by_name["plain"], graph) and not native_window(by_name["triggered"], graph)
    text = env.explain(spark_plan=False)
    assert "plain: window tumbling 1000 ms (event time) by k: n=count(*) (native)" in text
    assert "triggered: window tumbling 1000 ms (event time); trigger CountTrigger(2) by k: count=count(*) (python, keyed state)" in text


def test_a_plain_window_next_to_another_stateful_step_runs_on_the_operator(env, events):
    from ember import Agg

    plain = events().key_by("k").window(TumblingEventTimeWindows.of(1000)).aggregate(n=Agg.count(), name="plain")
    plain.key_by("k").process(_Count(), "k string, n bigint", name="after").sink_to(CollectSink())
    graph = env.graph()
    assert not native_window(next(n for n in graph.nodes if n.name == "plain"), graph)
    assert "plain: window tumbling 1000 ms (event time) by k: n=count(*) (python, keyed state)" in env.explain(spark_plan=False)
