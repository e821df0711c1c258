"""The Spark runner's plan of a graph: where sinks split, which side outputs detour,
and what one Spark query cannot run — all without a SparkSession."""

import json
import os

import pytest

from ember import (
    CollectSink,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    OutputTag,
    PipelineError,
    ScriptedSource,
    TumblingEventTimeWindows,
    YahooSource,
)
from ember.graph.nodes import KeyByNode
from ember.runner.spark.placement import native_window
from ember.runner.spark.planner import plan


def test_one_sink_needs_no_split(env, events):
    sink = events().filter("k = 'a'").sink_to(CollectSink(), name="out")
    p = plan(env.graph())
    assert p.fork is None and p.detours == () and p.streamed_sinks == (sink,)


def test_several_sinks_split_after_their_last_shared_step(env, events):
    s = events().filter("k = 'a'", name="only-a")
    s.sink_to(CollectSink(), name="all")
    s.select("k", name="keys").sink_to(CollectSink(), name="keys-out")
    assert plan(env.graph()).fork.name == "only-a"


def test_a_window_beside_a_sink_of_the_raw_stream_fans_out_at_the_source(env, events):
    s = events()
    s.sink_to(CollectSink(), name="raw")
    s.key_by("k").window(TumblingEventTimeWindows.of(1000)).count(name="counts").sink_to(CollectSink(), name="out")
    p = plan(env.graph())  # the window runs as a lane of Ember's operator, the raw rows pass it
    fan = p.fan_out
    assert p.fork is None and p.chained and fan.root and fan.through
    assert fan.source.name == fan.stem.name == "events" and [n.name for n in fan.seeds] == ["counts", "events"]
    assert not native_window(_node(p, "counts"), p.graph)


def test_an_unrelated_stateless_pipeline_runs_beside_the_one_holding_state(env, events):
    """The pipeline holding state is the query's rest (planned alone), whichever sink comes
    first; the other splits after its last shared step, or is read at its one sink's input."""
    other = env.from_source(ScriptedSource([[(1, "b")]], "ts bigint, k string"), name="other")
    picked = other.filter("k = 'b'", name="picked")
    picked.sink_to(CollectSink(), name="two")
    picked.select("k", name="keys").sink_to(CollectSink(), name="three")
    env.from_source(ScriptedSource([[(2, "c")]], "ts bigint, k string"), name="third").sink_to(CollectSink(), name="four")
    events().key_by("k").window(TumblingEventTimeWindows.of(1000)).count(name="counts").sink_to(CollectSink(), name="one")
    p = plan(env.graph())
    assert p.fork is None and p.fan_out is None
    assert [(b.seed.name, [s.name for s in b.sinks]) for b in p.beside] == [("picked", ["two", "three"]), ("third", ["four"])]
    assert [s.name for s in p.streamed_sinks] == ["one", "two", "three", "four"]


def test_unrelated_pipelines_whose_stateful_steps_both_follow_a_watermark_are_refused_naming_them(env, events):
    from ember import TumblingProcessingTimeWindows

    events().key_by("k").window(TumblingEventTimeWindows.of(1000)).count(name="counts").sink_to(CollectSink(), name="one")
    other = env.from_source(ScriptedSource([[(1, "b")]], "ts bigint, k string"), name="other")
    other.key_by("k").process(_Count(), "ts bigint, k string", name="count-other").sink_to(CollectSink(), name="two")
    p = plan(env.graph())  # without event time the process function's timers are processing-time: no watermark
    assert [(b.seed.name, [s.name for s in b.sinks]) for b in p.beside] == [("count-other", ["two"])]
    assert native_window(_node(p, "counts"), p.graph) and not p.chained  # as alone: the other's sink reads apart
    third = env.from_source(ScriptedSource([[(1, "c")]], "ts bigint, k string"), name="third")
    third.key_by("k").window(TumblingProcessingTimeWindows.of(1000)).count(name="ticks").sink_to(CollectSink(), name="three")
    with pytest.raises(PipelineError, match="step 'ticks'.*the sinks one and three read from unrelated pipelines whose "
                                            r"stateful steps both follow a watermark \('counts', 'ticks'\)"):
        plan(env.graph())


def test_unrelated_pipelines_that_both_need_more_than_a_split_are_refused(env, events):
    for name in ("a", "b"):
        src = env.from_source(ScriptedSource([[(1, name)]], "ts bigint, k string"), name=f"src-{name}")
        counted = src.key_by("k").process(_Count(), "ts bigint, k string", name=f"count-{name}")
        counted.sink_to(CollectSink(), name=f"raw-{name}")  # a keyed step's output read by a sink and a keyed step:
        counted.key_by("k").process(_Count(), "ts bigint, k string", name=f"again-{name}").sink_to(  # a fan-out
            CollectSink(), name=f"again-out-{name}")
    with pytest.raises(PipelineError, match="step 'count-b'.*both need more than one split"):
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


def test_map_and_filter_dead_letters_beside_a_keyed_step_detour(env, events):
    bad_map, bad_filter = OutputTag("bad_map"), OutputTag("bad_filter")
    parsed = events().map(lambda r: r, "ts bigint, k string", dead_letter=bad_map, name="parse")
    kept = parsed.filter(lambda r: True, dead_letter=bad_filter, name="check")
    out = kept.key_by("k").process(_Count(), "ts bigint, k string", name="count").sink_to(CollectSink(), name="out")
    a = parsed.get_side_output(bad_map).sink_to(CollectSink(), name="a")
    b = kept.get_side_output(bad_filter).sink_to(CollectSink(), name="b")
    p = plan(env.graph())
    assert sorted(d.tag.name for d in p.detours) == ["bad_filter", "bad_map"]
    assert p.streamed_sinks == (out,) and {id(s) for d in p.detours for s in p.detoured_sinks(d)} == {id(a), id(b)}


def test_unmatched_records_of_a_lookup_join_beside_a_window_detour(env, events):
    unknown = OutputTag("unknown")
    joined = events().join_lookup([{"k": "a", "region": "north"}], on="k", unmatched=unknown, name="regions")
    out = (joined.key_by("region").window(TumblingEventTimeWindows.of(1000)).count(name="per-region")
           .sink_to(CollectSink(), name="out"))
    dead = joined.get_side_output(unknown).sink_to(CollectSink(), name="dead")
    p = plan(env.graph())
    assert [d.tag for d in p.detours] == [unknown] and p.detoured_sinks(p.detours[0]) == [dead]
    assert p.streamed_sinks == (out,)


def test_detoured_dead_letters_unioned_with_another_stream_are_refused_naming_both(env, events):
    bad_map, bad_filter = OutputTag("bad_map"), OutputTag("bad_filter")
    parsed = events().map(lambda r: r, "ts bigint, k string", dead_letter=bad_map, name="parse")
    kept = parsed.filter(lambda r: True, dead_letter=bad_filter, name="check")
    kept.key_by("k").process(_Count(), "ts bigint, k string", name="count").sink_to(CollectSink(), name="out")
    parsed.get_side_output(bad_map).union(kept.get_side_output(bad_filter), name="all-bad").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'all-bad': 'all-bad' reads the dead letters of 'parse', which leave the "
                                            "query beside it .*, and the side output 'bad_filter' of 'check' too; read "
                                            "each such dead-letter output into its own sink"):
        plan(env.graph())


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


@pytest.mark.parametrize("between", ["select", "join_lookup"])
def test_a_projection_or_lookup_between_two_keyed_steps_is_chained(env, events, between):
    first = events().key_by("k").process(_Count(), "ts bigint, k string", name="first")
    if between == "select":
        middle = first.select("ts", "upper(k) AS k", name="reshape")
    else:
        middle = first.join_lookup([{"k": "a", "x": 1}], on="k", name="reshape")
    middle.key_by("k").process(_Count(), "ts bigint, k string", name="second").sink_to(CollectSink())
    p = plan(env.graph())
    assert p.chained and p.upstream_step(next(n for n in p.graph.nodes if n.name == "second")).name == "first"


def test_a_vectorised_map_between_two_keyed_steps_is_chained(env, events):
    first = events().key_by("k").process(_Count(), "ts bigint, k string", name="first")
    (first.map_batches(lambda pdf: pdf, name="reshape").key_by("k").process(_Count(), "ts bigint, k string", name="second")
     .sink_to(CollectSink()))
    p = plan(env.graph())
    assert p.chained and p.upstream_step(next(n for n in p.graph.nodes if n.name == "second")).name == "first"


def test_a_step_reading_the_union_of_two_stateful_streams_reads_both(env, events):
    src = events()
    a = src.key_by("k").process(_Count(), "ts bigint, k string", name="a")
    b = src.key_by("k").process(_Count(), "ts bigint, k string", name="b")
    a.union(b).key_by("k").process(_Count(), "ts bigint, k string", name="both").sink_to(CollectSink())
    p = plan(env.graph())
    both = next(n for n in p.graph.nodes if n.name == "both")
    assert p.chained and [n.name for n in p.upstream_steps(both)] == ["a", "b"]
    assert p.read_by_step(next(n for n in p.graph.nodes if n.name == "b"))


def test_a_step_between_a_stateful_step_and_a_union_is_checked_like_any_step_between(env, events):
    src = events()
    a = src.key_by("k").process(_Count(), "ts bigint, k string", name="a")
    b = src.key_by("k").process(_Count(), "ts bigint, k string", name="b")
    reshaped = b.parse_json("k", "x string", dead_letter=OutputTag("bad"), name="reshape")
    a.union(reshaped).key_by("k").process(_Count(), "ts bigint, k string", name="both").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'reshape'.*between the stateful steps 'b' and 'both'"):
        plan(env.graph())


def test_execute_refuses_an_unrunnable_plan_before_touching_the_checkpoint(env, tmp_path, events):
    events().key_by("k").window(TumblingEventTimeWindows.of(1000)).count(name="counts").sink_to(CollectSink(), name="out")
    from ember import TumblingProcessingTimeWindows

    (env.from_source(ScriptedSource([[(1, "b")]], "ts bigint, k string"), name="other").key_by("k")
        .window(TumblingProcessingTimeWindows.of(1000)).count(name="other-counts").sink_to(CollectSink(), name="raw"))
    with pytest.raises(PipelineError, match="unrelated pipelines"):
        env.execute("refused", checkpoint=tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_the_planner_runs_plain_windows_natively_and_the_rest_on_the_window_operator(env, events, tmp_path):
    from ember import Agg, StreamEnvironment, WatermarkStrategy
    from ember.windowing.triggers import CountTrigger

    events().key_by("k").window(TumblingEventTimeWindows.of(1000)).aggregate(n=Agg.count(), name="plain").sink_to(CollectSink())
    graph = env.graph()
    assert native_window(next(n for n in graph.nodes if n.name == "plain"), graph)
    assert "plain: window tumbling 1000 ms (event time) by k: n=count(*) (native)" in env.explain(spark_plan=False)
    other = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path / "other")
    (other.from_source(ScriptedSource([[(1, "a")]], "ts bigint, k string"), WatermarkStrategy.for_bounded_out_of_orderness(0, "ts"))
     .key_by("k").window(TumblingEventTimeWindows.of(1000)).trigger(CountTrigger.of(2)).count(name="triggered")
     .sink_to(CollectSink()))
    graph = other.graph()
    assert not native_window(next(n for n in graph.nodes if n.name == "triggered"), graph)
    text = other.explain(spark_plan=False)
    assert "triggered: window tumbling 1000 ms (event time); trigger CountTrigger(2) by k: count=count(*) (python, keyed state)" in text


def test_a_plain_window_not_every_sink_reads_runs_on_the_operator(env, events):
    """Its stream is read by another branch too: the job fans out before it (fan_out_plan.root_fan_out)."""
    from ember import Agg

    src = events()
    src.key_by("k").window(TumblingEventTimeWindows.of(1000)).aggregate(n=Agg.count(), name="plain").sink_to(CollectSink())
    src.sink_to(CollectSink(), name="raw")
    graph = env.graph()
    assert not native_window(next(n for n in graph.nodes if n.name == "plain"), graph)


def test_a_plain_window_next_to_another_stateful_step_runs_on_the_operator(env, events):
    from ember import Agg

    plain = events().key_by("k").window(TumblingEventTimeWindows.of(1000)).aggregate(n=Agg.count(), name="plain")
    plain.key_by("k").process(_Count(), "k string, n bigint", name="after").sink_to(CollectSink())
    graph = env.graph()
    assert not native_window(next(n for n in graph.nodes if n.name == "plain"), graph)
    assert "plain: window tumbling 1000 ms (event time) by k: n=count(*) (python, keyed state)" in env.explain(spark_plan=False)


# -- fan-out: a keyed step read by several steps (fan_out_plan.FanOut) ---------------------------------

KEYED = "ts bigint, k string"


def _node(p, name):
    return next(n for n in p.graph.nodes if n.name == name)


def test_a_keyed_step_read_by_two_keyed_steps_and_a_sink_fans_out(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    first.filter("k <> 'x'", name="not-x").key_by("k").process(_Count(), KEYED, name="left").sink_to(CollectSink(), name="l")
    first.key_by("ts").window(TumblingEventTimeWindows.of(1000)).count(name="right").sink_to(CollectSink(), name="r")
    first.sink_to(CollectSink(), name="raw")
    p = plan(env.graph())
    fan = p.fan_out
    assert p.fork is None and fan is not None and p.chained
    assert fan.source.name == "first" and [n.name for n in fan.lanes] == ["left", "right"] and fan.through
    assert [type(s).__name__ for s in fan.paths[0]] == ["FilterNode", "KeyByNode"] and fan.paths[0][0].name == "not-x"
    assert [type(s).__name__ for s in fan.paths[1]] == ["KeyByNode"]
    assert [n.name for n in fan.seeds] == ["left", "right", "first"]
    assert p.read_by_step(_node(p, "first")) and p.upstream_step(_node(p, "right")) is fan.source


def test_a_fan_out_into_keyed_steps_only_has_no_pass_through_lane(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    a = first.key_by("k").process(_Count(), KEYED, name="a")
    b = first.key_by("ts").process(_Count(), KEYED, name="b")
    a.union(b).sink_to(CollectSink(), name="both")  # the lanes' outputs meet again after the split
    fan = plan(env.graph()).fan_out
    assert fan is not None and not fan.through and [n.name for n in fan.seeds] == ["a", "b"]


def test_a_chain_without_fan_out_plans_as_before(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    first.key_by("k").process(_Count(), KEYED, name="second").sink_to(CollectSink())
    assert plan(env.graph()).fan_out is None


def test_a_readers_own_map_after_its_filters_is_part_of_its_lanes_path(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    (first.filter("k <> 'x'", name="not-x").map(lambda r: r, name="reshape").key_by("k")
     .process(_Count(), KEYED, name="a").sink_to(CollectSink()))
    first.key_by("k").process(_Count(), KEYED, name="b").sink_to(CollectSink())
    fan = plan(env.graph()).fan_out
    assert [s.name for s in fan.paths[0]][:2] == ["not-x", "reshape"] and len(fan.paths[1]) == 1


def test_a_readers_own_path_may_chain_filters_maps_flat_maps_and_selects_in_any_order(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    (first.filter("k <> 'x'", name="f1").map(lambda r: r, name="m1").filter(lambda r: True, name="f2")
     .flat_map(lambda r: [r], name="fm").join_lookup([{"k": "a", "w": 1}], "k", name="lk").select("k", "ts", name="sel").key_by("k")
     .process(_Count(), KEYED, name="a").sink_to(CollectSink()))
    first.key_by("k").process(_Count(), KEYED, name="b").sink_to(CollectSink())
    fan = plan(env.graph()).fan_out
    assert [s.name for s in fan.paths[0] if not isinstance(s, KeyByNode)] == ["f1", "m1", "f2", "fm", "lk", "sel"]


def test_dead_letters_of_a_step_on_a_readers_own_path_detour(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    bad, worse = OutputTag("bad"), OutputTag("worse")
    m = first.map(lambda r: r, dead_letter=bad, name="m")
    f = m.filter(lambda r: True, dead_letter=worse, name="f")
    lookup = f.join_lookup([{"k": "a", "w": 1}], "k", unmatched=OutputTag("unknown"), name="lookup")
    lookup.key_by("k").process(_Count(), KEYED, name="a").sink_to(CollectSink(), name="a-out")
    lookup.get_side_output(OutputTag("unknown")).sink_to(CollectSink(), name="unknown")
    dead = m.get_side_output(bad).select("raw", name="raw-only").sink_to(CollectSink(), name="dead")
    also = f.get_side_output(worse).sink_to(CollectSink(), name="also-dead")
    first.key_by("k").process(_Count(), KEYED, name="b").sink_to(CollectSink(), name="b-out")
    p = plan(env.graph())
    assert [d.tag.name for d in p.detours] == ["bad", "worse", "unknown"] and p.fan_out.detours == p.detours
    assert p.detoured_sinks(p.detours[0]) == [dead] and p.detoured_sinks(p.detours[1]) == [also]
    assert [s.name for s in p.streamed_sinks] == ["a-out", "b-out"] and not p.fan_out.through


def test_a_step_with_dead_letters_on_several_lanes_paths_is_refused_naming_it(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    first.sink_to(CollectSink(), name="raw")  # (so the lanes part at 'first', before the map)
    m = first.map(lambda r: r, dead_letter=OutputTag("bad"), name="m")
    m.get_side_output(OutputTag("bad")).sink_to(CollectSink(), name="dead")
    m.key_by("k").process(_Count(), KEYED, name="a").sink_to(CollectSink(), name="a-out")
    m.key_by("ts").process(_Count(), KEYED, name="b").sink_to(CollectSink(), name="b-out")
    with pytest.raises(PipelineError, match="step 'm'.*on the paths of several keyed steps \\('a', 'b'\\).*once for each"):
        plan(env.graph())


@pytest.mark.parametrize("shape", ["map with unread dead letters", "dead letters meeting another stream"])
def test_other_steps_on_a_readers_own_path_are_refused_naming_them(env, events, shape):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    letters = OutputTag("bad")
    if shape == "map with unread dead letters":
        path = first.map(lambda r: r, dead_letter=letters, name="reshape")
    else:
        path = first.map(lambda r: r, name="m").filter(lambda r: True, dead_letter=letters, name="reshape")
        other = first.select("CAST(ts AS STRING) AS raw", "k AS error", name="other")
        path.get_side_output(letters).union(other).sink_to(CollectSink(), name="mixed")
    path.key_by("k").process(_Count(), KEYED, name="a").sink_to(CollectSink())
    first.key_by("k").process(_Count(), KEYED, name="b").sink_to(CollectSink())
    said = "only filter, map, flat_map, select, join_lookup and map_batches steps \\(their dead letters read by sinks"
    with pytest.raises(PipelineError, match=f"step 'reshape'.*between the stateful steps? 'first' and 'a'.*{said}"):
        plan(env.graph())


@pytest.mark.parametrize("beside", [True, False])
def test_a_reader_through_a_union_of_branches_gets_a_copy_per_path(env, events, beside):
    """A union of branches of the fanned-out rows: one path per branch (the union left out,
    the steps after it on each), each run on a copy of its own — also with no other reader,
    where the keyed step would otherwise be planned once per branch of the union."""
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    left = first.filter("k = 'x'", name="x")
    right = first.filter("k = 'y'", name="y").map(lambda r: r, name="m")
    left.union(right, name="both").filter("ts > 0", name="later").key_by("k").process(_Count(), KEYED, name="a").sink_to(
        CollectSink())
    if beside:
        first.sink_to(CollectSink(), name="raw")
    fan = plan(env.graph()).fan_out
    assert [n.name for n in fan.lanes] == ["a"] and fan.through == beside
    named = [[s.name for s in path if not isinstance(s, KeyByNode)] for path in (fan.paths[0], *(p for _, p in fan.unions))]
    assert named == [["x", "later"], ["y", "m", "later"]]
    assert all(isinstance(path[-1], KeyByNode) for path in (fan.paths[0], *(p for _, p in fan.unions)))
    assert [i for i, _ in fan.unions] == [0]


def test_a_union_with_rows_from_outside_a_fan_out_is_refused_naming_it(env, events):
    src = events()
    first = src.key_by("k").process(_Count(), KEYED, name="first")
    first.filter("k = 'x'", name="x").union(src, name="mixed").key_by("k").process(_Count(), KEYED, name="a").sink_to(
        CollectSink())
    first.sink_to(CollectSink(), name="raw")
    with pytest.raises(PipelineError, match="step 'mixed'.*merges rows of 'events' that do not pass 'first' with rows that do"):
        plan(env.graph())


def test_dead_letters_of_a_step_on_several_paths_of_a_union_are_refused(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    shared = first.map(lambda r: r, dead_letter=OutputTag("bad"), name="shared")
    shared.get_side_output(OutputTag("bad")).sink_to(CollectSink(), name="letters")
    (shared.filter("k = 'x'", name="x").union(shared.filter("k = 'y'", name="y"), name="both")
        .key_by("k").process(_Count(), KEYED, name="a").sink_to(CollectSink()))
    first.sink_to(CollectSink(), name="raw")
    with pytest.raises(PipelineError, match="step 'shared'.*several paths to 'a' \\(a union merges them\\)"):
        plan(env.graph())


def test_keyed_steps_after_the_lanes_run_as_further_levels(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    first.key_by("k").process(_Count(), KEYED, name="a").key_by("ts").process(_Count(), KEYED, name="a2").sink_to(CollectSink())
    b = first.key_by("k").process(_Count(), KEYED, name="b")
    b.sink_to(CollectSink(), name="b-out")  # b is read by a sink and by b2: a fan-out inside the fan-out
    b.key_by("k").process(_Count(), KEYED, name="b2").key_by("k").process(_Count(), KEYED, name="b3").sink_to(CollectSink())
    p = plan(env.graph())
    fan = p.fan_out
    assert [[n.name for n in level] for level in fan.levels] == [["a", "b"], ["a2", "b2"], ["b3"]]
    assert [lv.reads for lv in fan.after] == [((0, None), (1, None)), ((1, None),)]
    assert fan.where(_node(p, "b3")) == (2, 0) and fan.where(_node(p, "first")) is None


def test_the_steps_between_two_levels_are_the_lanes_own_in_graph_order(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    a = first.key_by("k").process(_Count(), KEYED, name="a")
    (a.filter("ts > 0", name="later").map(lambda r: r, name="reshape").filter(lambda r: True, name="any")
        .map(lambda r: r, name="again").key_by("k").process(_Count(), KEYED, name="a2").sink_to(CollectSink()))
    first.key_by("k").process(_Count(), KEYED, name="b").sink_to(CollectSink())
    (level,) = plan(env.graph()).fan_out.after
    assert [[s.name for s in own] for own in level.steps] == [["later", "reshape", "any", "again"]]


def test_a_union_between_two_levels_of_a_fan_out_gives_a_copy_per_path(env, events):
    """A second-level step reading lanes of the first through a union: one path per branch,
    each from the lane it starts after (here both branches of 'a', and one of 'b')."""
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    a = first.key_by("k").process(_Count(), KEYED, name="a")
    b = first.key_by("k").process(_Count(), KEYED, name="b")
    reshaped = a.map_batches(lambda pdf: pdf, name="reshape")
    (reshaped.filter("k = 'x'", name="x").union(reshaped.filter("k = 'y'", name="y"), b.filter("ts > 0", name="z"), name="again")
        .key_by("k").process(_Count(), KEYED, name="a2").sink_to(CollectSink()))
    b.sink_to(CollectSink(), name="b-out")
    (level,) = plan(env.graph()).fan_out.after
    assert [n.name for n in level.lanes] == ["a2"] and level.second == ()
    assert [(level.reads[0], [s.name for s in level.steps[0]])] + [(read, [s.name for s in own]) for _, read, own in level.unions] == [
        ((0, None), ["reshape", "x"]), ((0, None), ["reshape", "y"]), ((1, None), ["z"])]


@pytest.mark.parametrize("other", ["a", "b"])
def test_a_union_of_lanes_of_two_levels_is_refused_naming_it(env, events, other):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    a = first.key_by("k").process(_Count(), KEYED, name="a")
    a2 = a.key_by("k").process(_Count(), KEYED, name="a2")
    b = first.key_by("k").process(_Count(), KEYED, name="b")
    a2.union(a if other == "a" else b, name="mixed").key_by("k").process(_Count(), KEYED, name="c").sink_to(CollectSink())
    said = ("step 'mixed'.*merges rows of 'a' that do not pass 'a2' with rows that do" if other == "a"
            else "step 'c'.*reads stateful steps \\(a2, b\\) of different levels")
    with pytest.raises(PipelineError, match=said):
        plan(env.graph())


def test_fan_outs_on_separate_branches_fan_out_at_their_shared_source(env, events):
    src = events()
    for name in ("x", "y"):
        step = src.key_by("k").process(_Count(), KEYED, name=name)
        step.sink_to(CollectSink(), name=f"{name}-raw")
        step.key_by("k").process(_Count(), KEYED, name=f"{name}2").sink_to(CollectSink(), name=f"{name}-out")
    fan = plan(env.graph()).fan_out
    assert fan.root and not fan.through and fan.stem.name == "events"
    assert [[n.name for n in level] for level in fan.levels] == [["x", "y"], ["x2", "y2"]]
    assert [lv.reads for lv in fan.after] == [((0, None), (1, None))]


def test_a_sink_beside_a_keyed_steps_fan_out_moves_the_fan_out_to_the_source(env, events):
    src = events()
    src.sink_to(CollectSink(), name="raw")
    first = src.key_by("k").process(_Count(), KEYED, name="first")
    first.key_by("k").process(_Count(), KEYED, name="a").sink_to(CollectSink())
    first.key_by("k").process(_Count(), KEYED, name="b").sink_to(CollectSink())
    fan = plan(env.graph()).fan_out
    assert fan.root and fan.through and [n.name for n in fan.seeds] == ["first", "events"]
    assert [[n.name for n in level] for level in fan.levels] == [["first"], ["a", "b"]]


def test_two_keyed_steps_reading_one_source_fan_out_at_it_once_it_is_parsed(env, events):
    parsed = events().map(lambda r: r, KEYED, name="parse")
    parsed.key_by("k").process(_Count(), KEYED, name="a").sink_to(CollectSink(), name="a-out")
    parsed.filter("k <> 'x'", name="not-x").key_by("ts").process(_Count(), KEYED, name="b").sink_to(CollectSink(), name="b-out")
    p = plan(env.graph())
    fan = p.fan_out
    assert fan.root and not fan.through and fan.source.name == fan.stem.name == "parse"
    assert [n.name for n in fan.lanes] == ["a", "b"] and [s.name for s in fan.paths[1]][0] == "not-x"
    assert p.upstream_step(_node(p, "a")) is None  # the first keyed steps: their rows get event time at the stem


def test_a_select_on_one_branch_of_a_fan_out_is_that_lanes_own_reshaping_step(env, events):
    src = events()
    src.select("ts", "upper(k) AS k", name="narrow").key_by("k").process(_Count(), KEYED, name="a").sink_to(CollectSink())
    src.key_by("k").process(_Count(), KEYED, name="b").sink_to(CollectSink())
    fan = plan(env.graph()).fan_out
    assert [s.name for s in fan.paths[0]][0] == "narrow" and len(fan.paths[1]) == 1


def test_a_lookup_join_on_one_branch_of_a_fan_out_at_the_source_is_that_lanes_own(env, events):
    src = events()
    src.join_lookup([{"k": "a", "w": 1}], on="k", name="lookup").key_by("k").process(
        _Count(), KEYED, name="a").sink_to(CollectSink())
    src.key_by("k").process(_Count(), KEYED, name="b").sink_to(CollectSink())
    fan = plan(env.graph()).fan_out
    assert fan.root and [[s.name for s in path if not isinstance(s, KeyByNode)] for path in fan.paths] == [["lookup"], []]


def test_a_two_input_step_reading_a_source_read_by_a_keyed_step_is_a_lane_of_its_fan_out(env, events):
    src = events()
    src.key_by("k").process(_Count(), KEYED, name="a").sink_to(CollectSink())
    other = env.from_source(ScriptedSource([[(1, "b")]], KEYED), name="other")
    src.connect(other).key_by("k", "k").process(_Both(), KEYED, name="co").sink_to(CollectSink())
    p = plan(env.graph())
    assert p.fan_out.root and [n.name for n in p.fan_out.lanes] == ["a", "co"]
    assert p.lane_inputs(_node(p, "co")) == (0,) and p.lane_inputs(_node(p, "a")) == ()


def test_a_two_input_lane_with_the_fanned_out_rows_on_its_second_input(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    first.sink_to(CollectSink(), name="raw")
    other = env.from_source(ScriptedSource([[(1, "b")]], KEYED), name="other").filter("k <> 'x'", name="not-x")
    other.connect(first).key_by("k", "k").process(_Both(), KEYED, name="co").sink_to(CollectSink())
    p = plan(env.graph())
    assert [n.name for n in p.fan_out.lanes] == ["co"] and p.fan_out.through
    assert p.lane_inputs(_node(p, "co")) == (1,)


def test_a_two_input_step_reading_a_fanned_out_step_and_another_stateful_step_is_refused(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    first.sink_to(CollectSink(), name="raw")
    counted = env.from_source(ScriptedSource([[(1, "b")]], KEYED), name="other").key_by("k").window(
        TumblingEventTimeWindows.of(1000)).count(name="counted").select("window_start AS ts", "k")
    first.connect(counted).key_by("k", "k").process(_Both(), KEYED, name="co").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="the job's sinks .* split at 'first'; steps after the split"):
        plan(env.graph())  # (a keyed step on each input: no lane — the split's refusal)


def test_a_fan_outs_lanes_share_one_spark_operator_in_the_restart_manifest(env, events):
    from ember.runner.spark.restart import compare, pipeline_manifest, spark_operator_count, spark_operator_ids

    first = events().key_by("k").process(_Count(), KEYED, name="first")
    for name in ("a", "b"):
        first.key_by("k").process(_Count(), KEYED, name=name).sink_to(CollectSink(), name=f"out-{name}")
    manifest = pipeline_manifest(env.graph())
    ops = manifest["operators"]
    assert [(o["name"], o.get("lane")) for o in ops] == [("first", None), ("a", 0), ("b", 1)]
    assert spark_operator_ids(ops) == [1, 0, 0]  # Spark numbers from the sink back
    assert spark_operator_ids([{}, {}, {}]) == [2, 1, 0]
    # levels share an operator each, whatever the graph order of their lanes
    assert spark_operator_ids([{}, {"lane": 0}, {"lane": 0, "level": 1}, {"lane": 1}]) == [2, 1, 0, 1]
    # a SQL step last: its query's operators (none, one, two) come first from the sink
    assert spark_operator_ids([{}, {}, {"spark operators": 0}]) == [1, 0, 0]
    assert spark_operator_ids([{}, {}, {"spark operators": 1}]) == [2, 1, 0]
    assert spark_operator_ids([{}, {}, {"spark operators": 2}]) == [3, 2, 0]
    assert spark_operator_count([{}, {}, {"spark operators": 2}]) == 4
    assert spark_operator_count([{}, {}, {"spark operators": 0}]) == 2
    assert spark_operator_count([{}, {"lane": 0}, {"lane": 0, "level": 1}, {"lane": 1}]) == 3
    swapped = dict(manifest, operators=[ops[0], dict(ops[2], name="a", lane=1), dict(ops[1], name="b", lane=0)])
    problems = compare(manifest, swapped)
    assert any("'a'" in p and "lane 0 of a fan-out" in p and "lane 1" in p for p in problems), problems


def test_a_fan_out_at_the_source_runs_its_one_keyed_lane_on_transform_with_state_in_the_manifest(env, events):
    from ember.runner.spark.restart import TWS, pipeline_manifest, spark_operator_ids

    src = events()
    src.sink_to(CollectSink(), name="raw")
    first = src.key_by("k").process(_Count(), KEYED, name="first")
    first.key_by("k").process(_Count(), KEYED, name="a").sink_to(CollectSink(), name="out-a")
    ops = pipeline_manifest(env.graph())["operators"]
    assert [(o["name"], o.get("lane"), o.get("level")) for o in ops] == [("first", 0, None), ("a", 0, 1)]
    assert {o["spark operator"] for o in ops} == {TWS}  # (a job's one keyed step stays on applyInPandasWithState)
    assert spark_operator_ids(ops) == [1, 0]


def test_steps_every_reader_shares_run_once_before_the_rows_fan_out(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    shared = first.map(lambda r: r, name="reshape").filter("k <> 'x'", name="not-x")
    shared.key_by("k").process(_Count(), KEYED, name="a").sink_to(CollectSink(), name="out-a")
    shared.key_by("ts").process(_Count(), KEYED, name="b").sink_to(CollectSink(), name="out-b")
    shared.select("k", name="keys").sink_to(CollectSink(), name="keys-out")
    fan = plan(env.graph()).fan_out
    assert fan is not None and fan.source.name == "first" and fan.stem.name == "not-x" and fan.through
    assert [[type(s).__name__ for s in path] for path in fan.paths] == [["KeyByNode"], ["KeyByNode"]]
    assert [n.name for n in fan.seeds] == ["a", "b", "not-x"]


# -- two-input steps reading stateful steps --------------------------------------------------------


class _Both(KeyedCoProcessFunction):
    def process_element1(self, value, ctx):
        yield value

    def process_element2(self, value, ctx):
        yield value


def test_a_two_input_step_reading_a_stateful_step_on_each_input_is_numbered_depth_first(env, events):
    from ember.runner.spark.restart import compare, pipeline_manifest, spark_operator_ids

    src = events()
    left = src.key_by("k").process(_Count(), KEYED, name="left")
    right = src.key_by("ts").process(_Count(), KEYED, name="right")
    left.connect(right).key_by("k", "k").process(_Both(), KEYED, name="both").sink_to(CollectSink())
    p = plan(env.graph())
    assert [n.name for n in p.upstream_steps(_node(p, "both"))] == ["left", "right"]
    assert p.read_by_step(_node(p, "left")) and p.read_by_step(_node(p, "right"))
    manifest = pipeline_manifest(env.graph())
    ops = manifest["operators"]
    # Spark: the sink's step first, then each input's branch in order (not graph order backwards)
    assert [(o["name"], o["spark operator id"]) for o in ops] == [("left", 1), ("right", 2), ("both", 0)]
    assert spark_operator_ids(ops) == [1, 2, 0]
    moved = dict(manifest, operators=[dict(ops[0], **{"spark operator id": 2}), dict(ops[1], **{"spark operator id": 1}), ops[2]])
    assert any("'left'" in problem and "operator 1" in problem for problem in compare(manifest, moved))


def test_a_two_input_step_may_read_the_union_of_two_stateful_steps_on_one_input(env, events):
    src = events()
    a = src.key_by("k").process(_Count(), KEYED, name="a")
    b = src.key_by("k").process(_Count(), KEYED, name="b")
    a.union(b).connect(src).key_by("k", "k").process(_Both(), KEYED, name="both").sink_to(CollectSink())
    p = plan(env.graph())
    assert [n.name for n in p.upstream_steps(_node(p, "both"))] == ["a", "b"] and p.fan_out is None


def test_a_two_input_step_reading_one_stateful_step_on_both_inputs_is_refused_naming_them(env, events):
    src = events()
    a = src.key_by("k").process(_Count(), KEYED, name="a")
    b = src.key_by("k").process(_Count(), KEYED, name="b")
    a.connect(a.union(b)).key_by("k", "k").process(_Both(), KEYED, name="both").sink_to(CollectSink())
    with pytest.raises(PipelineError, match=r"step 'both'.*several stateful steps \(a, b\) and one of them on both its inputs"):
        plan(env.graph())


def test_a_two_input_step_reading_two_lanes_of_a_fan_out_is_a_lane_of_the_next_level(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    a = first.key_by("k").process(_Count(), KEYED, name="a")
    b = first.key_by("ts").process(_Count(), KEYED, name="b")
    b.filter("k <> 'x'", name="not-x").connect(a).key_by("k", "k").process(_Both(), KEYED, name="both").sink_to(CollectSink())
    p = plan(env.graph())
    (level,) = p.fan_out.after
    at = [n.name for n in p.fan_out.lanes]
    assert [n.name for n in level.lanes] == ["both"] and level.reads == ((at.index("b"), None),)
    assert [s.name for s in level.steps[0]] == ["not-x"] and list(level.second) == [(0, (at.index("a"), None), ())]


def test_a_two_input_step_reading_lanes_of_two_levels_is_refused_naming_it(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    a = first.key_by("k").process(_Count(), KEYED, name="a")
    b = first.key_by("ts").process(_Count(), KEYED, name="b")
    c = b.key_by("k").process(_Count(), KEYED, name="c")
    a.connect(c).key_by("k", "k").process(_Both(), KEYED, name="both").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'both'.*reads stateful steps \\(a, c\\) after the fan-out"):
        plan(env.graph())


def test_a_two_input_lane_reading_a_step_before_the_fan_out_on_its_other_input_is_refused_naming_it(env, events):
    src = events()
    first = src.key_by("k").process(_Count(), KEYED, name="first")
    first.connect(src).key_by("k", "k").process(_Both(), KEYED, name="both").sink_to(CollectSink())
    first.sink_to(CollectSink(), name="raw")
    with pytest.raises(PipelineError, match="step 'both'.*reads the stateful step 'first' on one input, with other steps, "
                       "and 'events' on the other, a step before the point where the job fans out"):
        plan(env.graph())


@pytest.mark.parametrize(
    "build, operator",
    [
        (lambda s: s.key_by("k").sum("ts"), "transformWithStateInPandas"),  # one output per record
        (lambda s: s.key_by("k").reduce(lambda a, b: b), "transformWithStateInPandas"),
        (lambda s: s.key_by("k").sum("ts", emit="batch"), "applyInPandasWithState"),  # one per key and batch
        (lambda s: s.key_by("k").process(_Count(), KEYED), "applyInPandasWithState"),
    ],
)
def test_a_jobs_one_keyed_step_runs_on_transform_with_state_when_it_emits_per_record(env, events, build, operator):
    from ember.runner.spark.placement import APWS, spark_keyed_operator
    from ember.runner.spark.restart import pipeline_manifest

    build(events()).sink_to(CollectSink(), name="out")
    graph = env.graph()
    assert spark_keyed_operator(graph) == operator
    assert [o["spark operator"] for o in pipeline_manifest(graph)["operators"]] == [operator]
    assert spark_keyed_operator(graph, rocksdb=False) == APWS  # transformWithStateInPandas needs RocksDB


def test_a_checkpoint_keeps_the_operator_its_keyed_step_was_written_on(env, events, tmp_path):
    from ember.runner.spark.checkpoint import CheckpointLayout, checkpoint_keyed_operator, write_json
    from ember.runner.spark.placement import APWS, TWS, spark_keyed_operator
    from ember.runner.spark.restart import check_restart, pipeline_manifest

    events().key_by("k").sum("ts", name="running").sink_to(CollectSink(), name="out")
    graph = env.graph()
    assert spark_keyed_operator(graph, stored=APWS) == APWS  # written before the rule: continues there
    assert spark_keyed_operator(graph, "transform_with_state", stored=APWS) == TWS  # the user's explicit choice
    ckpt = str(tmp_path / "old")
    layout = CheckpointLayout(ckpt)
    old = pipeline_manifest(graph)
    old["operators"][0]["spark operator"] = APWS
    write_json(layout.pipeline, old)
    os.makedirs(os.path.join(ckpt, "offsets"))
    assert checkpoint_keyed_operator(ckpt) is None  # no progress yet: nothing to keep
    open(os.path.join(ckpt, "offsets", "0"), "w").close()
    assert checkpoint_keyed_operator(ckpt) == APWS
    check_restart(ckpt, graph)  # continues on applyInPandasWithState, no refusal
    assert json.load(open(layout.pipeline)) == old  # (a restart leaves the stored manifest as it was)


def test_a_checkpoint_with_progress_and_no_manifest_keeps_apply_in_pandas_with_state(env, events, tmp_path):
    from ember.runner.spark.checkpoint import CheckpointLayout, checkpoint_keyed_operator
    from ember.runner.spark.placement import APWS
    from ember.runner.spark.restart import check_restart

    events().key_by("k").sum("ts", name="running").sink_to(CollectSink(), name="out")
    ckpt = str(tmp_path / "predating")
    os.makedirs(os.path.join(ckpt, "offsets"))
    open(os.path.join(ckpt, "offsets", "0"), "w").close()
    check_restart(ckpt, env.graph())  # writes the manifest it finds missing
    assert [o["spark operator"] for o in json.load(open(CheckpointLayout(ckpt).pipeline))["operators"]] == [APWS]
    assert checkpoint_keyed_operator(ckpt) == APWS


def test_a_two_input_step_reading_one_keyed_step_on_both_inputs_is_its_one_lane(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    a = first.filter("k = 'a'", name="only-a").key_by("k")
    b = first.filter("k <> 'a'", name="not-a").key_by("k")
    a.connect(b).key_by("k", "k").process(_Both(), KEYED, name="co").sink_to(CollectSink())
    p = plan(env.graph())
    fan = p.fan_out
    assert fan is not None and [n.name for n in fan.lanes] == ["co"] and not fan.through
    assert [s.name for s in fan.paths[0] if not isinstance(s, KeyByNode)] == ["only-a"]
    assert [(i, [s.name for s in path if not isinstance(s, KeyByNode)]) for i, path in fan.second] == [(0, ["not-a"])]
    assert p.lane_inputs(_node(p, "co")) == (0, 1)


def test_a_two_input_step_reading_a_lane_on_both_inputs_is_refused_naming_it(env, events):
    first = events().key_by("k").process(_Count(), KEYED, name="first")
    first.sink_to(CollectSink(), name="raw")
    second = first.key_by("k").process(_Count(), KEYED, name="second")
    second.connect(second.filter("k = 'a'")).key_by("k", "k").process(_Both(), KEYED, name="co").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'co'.*reads the stateful step 'second' on both inputs, after the fan-out"):
        plan(env.graph())


def test_an_unrelated_sql_window_beside_an_event_time_pipeline_is_refused_a_sql_branch_of_it_is_not(env, events):
    from ember import WatermarkStrategy

    src = events()
    src.key_by("k").window(TumblingEventTimeWindows.of(1000)).count(name="counts").sink_to(CollectSink(), name="one")
    src.create_view("events")
    env.sql("SELECT k, count(*) AS n FROM events GROUP BY k, window(rowtime, '1 second')", name="same").sink_to(
        CollectSink(), name="two")
    assert [n.name for n in plan(env.graph()).sql_branches] == ["same"]  # one pipeline: one source's event time
    env.from_source(ScriptedSource([[(1, "b")]], "ts bigint, k string"),
                    WatermarkStrategy.for_bounded_out_of_orderness(0, "ts"), name="other").create_view("other")
    env.sql("SELECT k, count(*) AS n FROM other GROUP BY k, window(rowtime, '1 second')", name="apart").sink_to(
        CollectSink(), name="three")
    with pytest.raises(PipelineError, match="step 'apart'.*both follow a watermark"):
        plan(env.graph())
