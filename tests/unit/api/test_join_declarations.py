"""Interval joins declared: arguments checked when declared, naming the step; what one
Spark query cannot run yet refused by the planner, before Spark starts."""

from datetime import timedelta

import pytest

from ember import CollectSink, KeyedProcessFunction, PipelineError, ScriptedSource, TumblingEventTimeWindows, WatermarkStrategy
from ember.graph.nodes import IntervalJoinNode
from ember.runner.spark.placement import runtime_steps
from ember.runner.spark.planner import physical_notes, plan


@pytest.fixture
def clicks(env):
    def make(name="clicks"):
        return env.from_source(ScriptedSource([[(1, "a")]], "ts bigint, k string"),
                               WatermarkStrategy.for_bounded_out_of_orderness(0, "ts"), name=name)
    return make


def test_the_join_node_holds_both_inputs_keys_and_signed_bounds(env, events, clicks):
    joined = events().key_by("k").interval_join(clicks().key_by("k"), how="left_outer", name="attributed")
    out = joined.between(timedelta(seconds=-2), timedelta(seconds=10)).select("left.k AS k")
    node = out.node
    assert isinstance(node, IntervalJoinNode) and node.name == "attributed"
    assert len(node.inputs) == 2 and node.inputs[0] is not node.inputs[1]
    assert (node.lower_ms, node.upper_ms, node.how, node.left_keys, node.right_keys) == (-2_000, 10_000, "left_outer", ("k",), ("k",))
    assert "interval join (left_outer)" in node.describe() and "-2000 ms" in node.describe()


@pytest.mark.parametrize("declare, message", [
    (lambda j: j.between(5, 1).select(), "lower bound 5 ms is after the upper bound 1 ms"),
    (lambda j: j.select(), r"needs \.between\(lower, upper\) before process/select"),
    (lambda j: j.between(0, 1).process("not callable", "x int"), "takes a function fn"),
    (lambda j: j.between(0, 1).process(lambda a, b: a, None), "needs an output_schema"),
    (lambda j: j.between(timedelta(milliseconds=0.5), 1).select(), "whole number of milliseconds"),
])
def test_bad_declarations_fail_naming_the_step(events, clicks, declare, message):
    joined = events().key_by("k").interval_join(clicks().key_by("k"), name="j")
    with pytest.raises(PipelineError, match=message) as info:
        declare(joined)
    assert info.value.step == "j"


def test_the_other_side_must_be_keyed_alike(events, clicks):
    keyed, other = events().key_by("k"), clicks()
    with pytest.raises(PipelineError, match="takes a keyed stream"):
        keyed.interval_join(other)
    with pytest.raises(PipelineError, match="keyed by 1 and 2 fields"):
        keyed.interval_join(other.key_by("k", "ts"))
    with pytest.raises(PipelineError, match="how must be one of inner, left_outer, right_outer, full_outer"):
        keyed.interval_join(other.key_by("k"), how="left")


class Pass(KeyedProcessFunction):
    def process_element(self, value, ctx):
        yield value


def _steps(graph):
    return {n.name: n for n in graph.nodes}


def test_a_join_alone_runs_on_sparks_native_join(env, events, clicks):
    events().key_by("k").interval_join(clicks().key_by("k"), name="j").between(0, 1).select().sink_to(CollectSink())
    graph = env.graph()
    assert plan(graph).native_join(_steps(graph)["j"]) and runtime_steps(graph) == []


def test_a_join_beside_a_sink_of_its_input_runs_on_the_keyed_runtime_as_a_lane(env, events, clicks):
    """A sink reads the events but not the pairs: the stream parts before the join, which then
    runs as a lane of the events' fan-out (a native join would be planned after the split)."""
    e = events()
    e.key_by("k").interval_join(clicks().key_by("k"), name="j").between(0, 1).select().sink_to(CollectSink())
    e.sink_to(CollectSink(), name="raw")
    graph = env.graph()
    p = plan(graph)
    assert not p.native_join(_steps(graph)["j"]) and p.fan_out.root and [n.name for n in p.fan_out.lanes] == ["j"]


def test_a_join_after_a_stateful_step_runs_on_the_keyed_runtime_chained_to_it(env, events, clicks):
    counted = events().key_by("k").process(Pass(), "ts bigint, k string", name="dedupe")
    counted.key_by("k").interval_join(clicks().key_by("k"), name="j").between(0, 1).select().sink_to(CollectSink())
    graph = env.graph()
    steps, p = _steps(graph), plan(graph)
    assert not p.native_join(steps["j"]) and p.upstream_step(steps["j"]) is steps["dedupe"]
    assert "j: interval join" in graph.explain(physical_notes(graph)) and "(python, keyed state)" in graph.explain(physical_notes(graph))


def test_a_window_after_the_join_makes_both_run_on_the_keyed_runtime(env, events, clicks):
    joined = events().key_by("k").interval_join(clicks().key_by("k"), name="j").between(0, 1).select("left.k AS k", "left.ts AS ts")
    joined.key_by("k").window(TumblingEventTimeWindows.of(1000)).count(name="w").sink_to(CollectSink())
    graph = env.graph()
    steps, p = _steps(graph), plan(graph)
    assert [n.name for n in runtime_steps(graph)] == ["j", "w"] and p.upstream_step(steps["w"]) is steps["j"]
