"""The pipeline graph: building, validation and explain, without Spark."""

import pytest

from ember import (
    Agg,
    CollectSink,
    ConfigError,
    PipelineError,
    StreamEnvironment,
    TumblingEventTimeWindows,
    YahooSource,
)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"master": "locale[2]"}, "master must be"),
        ({"parallelism": 0}, "parallelism must be a positive int, got 0"),
        ({"max_events_per_batch": -1}, "max_events_per_batch must be a positive int, got -1"),
        ({"state_backend": "memory"}, "state_backend must be one of rocksdb, hdfs, got 'memory'"),
        ({"trigger_interval": -10}, "trigger_interval must be >= 0"),
    ],
)
def test_invalid_configuration_fails_before_start(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        StreamEnvironment(**kwargs)


def test_explain_shows_every_step(env, events):
    sink = CollectSink()
    (
        events()
        .filter("k = 'a'", name="only-a")
        .key_by("k")
        .window(TumblingEventTimeWindows.of(1000))
        .aggregate(n=Agg.count(), name="per-second")
        .sink_to(sink, name="out")
    )
    text = env.explain(spark_plan=False)  # the graph, with how the Spark runner runs each window
    lines = text.splitlines()
    assert lines[:2] == ["== Ember graph ==", "out: sink collect (driver memory)"]
    assert "per-second: window tumbling 1000 ms (event time) by k: n=count(*) (native)" in text
    assert "only-a: filter k = 'a' (native SQL)" in text
    assert "events: source scripted 1 batches, 1 rows; event time from 'ts', out-of-orderness 0 ms" in text


def test_graph_needs_a_sink(env, events):
    events()
    with pytest.raises(PipelineError, match="no sink"):
        env.graph()


def test_step_names_are_unique(env, events):
    events()
    with pytest.raises(PipelineError, match="two steps are named 'events'"):
        events()


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda s: s.map("not callable"), "step 'map': map takes a Python callable"),
        (lambda s: s.filter(42), "step 'filter': filter takes a SQL string"),
        (lambda s: s.select(), "select needs at least one expression"),
        (lambda s: s.key_by(lambda r: r["k"]), "key_by takes field names or Spark Columns"),
        (lambda s: s.map_batches(lambda b: b, batch_format="polars"), "batch_format must be one of arrow, pandas, got 'polars'"),
        (lambda s: s.join_lookup([{"k": "a"}], on="k", how="outer"), "how must be one of inner, left"),
        (lambda s: s.key_by("k").window("10s"), "window takes a window assigner"),
        (lambda s: s.key_by("k").window(TumblingEventTimeWindows.of(10)).aggregate(), "at least one named aggregate"),
        (lambda s: s.sink_to("console"), "sink_to takes an Ember sink"),
        (lambda s: s.union(), "union needs at least one other stream"),
    ],
)
def test_invalid_steps_name_the_step_and_value(env, build, message, events):
    with pytest.raises(PipelineError, match=message):
        build(events())


def test_source_validation():
    with pytest.raises(ConfigError, match="rate must be a positive number"):
        YahooSource(rate=-1)
    with pytest.raises(ConfigError, match="partitions must be a positive int, got 0"):
        YahooSource(partitions=0)
    with pytest.raises(PipelineError, match="from_source takes an Ember source"):
        StreamEnvironment().from_source("kafka://x")


def test_window_all_takes_what_needs_the_window_operator_and_runs_it_there(env, events):
    """Flink's ``windowAll`` takes any window function; what Spark's native windowing cannot run
    goes to Ember's window operator, one key (tests/integration/test_window_all.py runs them)."""
    from ember import AggregateFunction
    from ember.graph.nodes import WindowNode
    from ember.runner.spark.placement import native_window

    stream = events()
    windows = stream.window_all(TumblingEventTimeWindows.of(1000))
    windows.aggregate(AggregateFunction(), output_schema="n bigint", name="python").sink_to(CollectSink())
    windows.allowed_lateness(10).count(name="late").sink_to(CollectSink())
    stream.count_window_all(3).aggregate(n=Agg.count(), name="counted").sink_to(CollectSink())
    graph = env.graph()
    steps = {node.name: node for node in graph.nodes if isinstance(node, WindowNode)}
    assert {name: (node.keys, native_window(node, graph)) for name, node in steps.items()} == {
        "python": ((), False), "late": ((), False), "counted": ((), False)}
    with pytest.raises(PipelineError, match="count_window size must be a positive int, got 0"):
        stream.count_window_all(0)


def test_components_group_sinks_by_the_steps_they_share_even_through_other_sinks():
    from ember import ScriptedSource
    from ember.graph.graph import components

    env = StreamEnvironment(master="local[1]")
    a = env.from_source(ScriptedSource([[(1, "a")]], "ts bigint, k string"), name="a")
    b = env.from_source(ScriptedSource([[(1, "b")]], "ts bigint, k string"), name="b")
    c = env.from_source(ScriptedSource([[(1, "c")]], "ts bigint, k string"), name="c")
    b.sink_to(CollectSink(), name="b-only")
    a.sink_to(CollectSink(), name="a-only")
    c.sink_to(CollectSink(), name="c-only")
    a.union(b).sink_to(CollectSink(), name="a-and-b")  # joins the first two groups, found apart
    groups = components(env.graph())
    assert [[s.name for s in g] for g in groups] == [["b-only", "a-only", "a-and-b"], ["c-only"]]
