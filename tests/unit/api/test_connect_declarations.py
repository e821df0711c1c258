"""Connected streams declared: arguments checked when declared, naming the step; the
planner refuses a co-process step reading a stateful step, before Spark starts."""

import pytest

from ember import CollectSink, KeyedCoProcessFunction, KeyedProcessFunction, PipelineError, ScriptedSource, WatermarkStrategy
from ember.graph.nodes import CoProcessNode
from ember.runner.spark.planner import plan


class Both(KeyedCoProcessFunction):
    def process_element1(self, value, ctx):
        yield value

    def process_element2(self, value, ctx):
        yield value


class Pass(KeyedProcessFunction):
    def process_element(self, value, ctx):
        yield value


@pytest.fixture
def rules(env):
    return env.from_source(ScriptedSource([[(1, "a")]], "ts bigint, name string"),
                           WatermarkStrategy.for_bounded_out_of_orderness(0, "ts"), name="rules")


def test_the_node_holds_both_keyed_inputs(env, events, rules):
    out = events().connect(rules).key_by("k", "name").process(Both(), "ts bigint, k string", name="both")
    node = out.node
    assert isinstance(node, CoProcessNode) and (node.keys, node.other_keys) == (("k",), ("name",))
    assert [type(i).__name__ for i in node.inputs] == ["KeyByNode", "KeyByNode"]
    assert "co-process Both" in node.describe() and "k = name" in node.describe()


def test_bad_declarations_fail_naming_the_step(env, events, rules):
    stream = events()
    connected = stream.connect(rules)
    with pytest.raises(PipelineError, match="takes a KeyedCoProcessFunction"):
        connected.key_by("k", "name").process(Pass(), "x int", name="p")
    with pytest.raises(PipelineError, match="needs an output_schema"):
        connected.key_by("k", "name").process(Both(), None)
    with pytest.raises(PipelineError, match="1 key fields on the first stream, 2 on the second"):
        connected.key_by("k", ("name", "ts"))
    with pytest.raises(PipelineError, match="two functions"):
        connected.map(lambda r: r)
    with pytest.raises(PipelineError, match="connect takes a DataStream"):
        stream.connect("rules")


def test_a_connected_step_chains_after_a_stateful_step_on_either_input(env, events, rules):
    deduped = events().key_by("k").process(Pass(), "ts bigint, k string", name="dedupe")
    rules.connect(deduped).key_by("name", "k").process(Both(), "ts bigint, k string", name="both").sink_to(CollectSink())
    graph = env.graph()
    steps = {n.name: n for n in graph.nodes}
    physical = plan(graph)
    assert physical.upstream_step(steps["both"]) is steps["dedupe"] and physical.read_by_step(steps["dedupe"])


def test_two_unnamed_co_maps_in_one_job_get_names_of_their_own(env, events, rules):
    stream = events()
    first = stream.connect(rules).map(lambda r: r, lambda r: r)
    second = stream.connect(rules).map(lambda r: r, lambda r: r)
    assert first.node.name != second.node.name
    named = stream.connect(rules).flat_map(lambda r: [r], lambda r: [r], name="both")
    assert named.node.name == "both" and [i.name for i in named.node.inputs] == ["both.1", "both.2"]


def test_a_dead_letter_tag_is_typed_and_shown(env, events, rules):
    from ember import OutputTag
    from ember.functions import DEAD_LETTER_SCHEMA

    stream = events()
    out = stream.connect(rules).key_by("k", "name").process(Both(), "ts bigint, k string", dead_letter=OutputTag("bad"),
                                                              name="both")
    assert out.node.dead_letter.schema == DEAD_LETTER_SCHEMA and "failures -> 'bad'" in out.node.describe()
    with pytest.raises(PipelineError, match="process dead_letter must be an OutputTag"):
        stream.connect(rules).key_by("k", "name").process(Both(), "ts bigint, k string", dead_letter="bad")
    with pytest.raises(PipelineError, match="carries dead letters"):
        stream.connect(rules).key_by("k", "name").process(Both(), "ts bigint, k string",
                                                          dead_letter=OutputTag("bad", "x int"))
