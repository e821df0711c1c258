"""Window joins declared: arguments checked when declared, naming the step; the node holds
both keyed inputs and the assigner; the restart manifest names it."""

import pytest

from ember import (
    EventTimeSessionWindows,
    GlobalWindows,
    PipelineError,
    ProcessingTimeSessionWindows,
    ScriptedSource,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WatermarkStrategy,
)
from ember.graph.nodes import WindowJoinNode


@pytest.fixture
def clicks(env):
    return env.from_source(ScriptedSource([[(1, "a")]], "ts bigint, k string"),
                           WatermarkStrategy.for_bounded_out_of_orderness(0, "ts"), name="clicks")


def test_the_node_holds_both_keyed_inputs_and_the_window(env, events, clicks):
    out = events().join(clicks, how="left_outer").where("k").equal_to("k").window(
        SlidingEventTimeWindows.of(2_000, 1_000)).apply(lambda a, b: a, "ts bigint, k string", name="j")
    node = out.node
    assert isinstance(node, WindowJoinNode) and (node.keys, node.other_keys, node.how) == (("k",), ("k",), "left_outer")
    assert [type(i).__name__ for i in node.inputs] == ["KeyByNode", "KeyByNode"]
    assert "window join (left_outer)" in node.describe() and "sliding 2000 ms every 1000 ms" in node.describe()


def test_bad_declarations_fail_naming_the_step(env, events, clicks):
    stream = events()
    with pytest.raises(PipelineError, match="join how must be one of"):
        stream.join(clicks, how="cross")
    with pytest.raises(PipelineError, match="join takes a DataStream"):
        stream.join("clicks")
    with pytest.raises(PipelineError, match="needs .where"):
        stream.join(clicks).equal_to("k")
    with pytest.raises(PipelineError, match="1 key fields in where, 2 in equal_to"):
        stream.join(clicks).where("k").equal_to("k", "ts")
    keyed = stream.join(clicks, name="jj").where("k").equal_to("k")
    with pytest.raises(PipelineError, match="tumbling, sliding or session windows") as failure:
        keyed.window(GlobalWindows.create())
    assert failure.value.step == "jj"
    for i, assigner in enumerate((ProcessingTimeSessionWindows.with_gap(10), TumblingProcessingTimeWindows.of(10))):
        declared = stream.join(clicks, name=f"p{i}").where("k").equal_to("k").window(assigner)
        assert "processing" in declared.apply(lambda a, b: a, "x int").node.describe()
    assert "session gap 10 ms" in keyed.window(EventTimeSessionWindows.with_gap(10)).apply(lambda a, b: a, "x int").node.describe()
    windowed = keyed.window(TumblingEventTimeWindows.of(1_000))
    with pytest.raises(PipelineError, match="takes a function"):
        windowed.apply("fn", "x int")
    with pytest.raises(PipelineError, match="needs an output_schema"):
        windowed.apply(lambda a, b: a, None)
    with pytest.raises(PipelineError, match="needs .where"):
        stream.join(clicks).apply(lambda a, b: a, "x int")


def test_the_restart_manifest_names_the_window_join(env, events, clicks):
    from ember import CollectSink
    from ember.runner.spark.restart import pipeline_manifest

    (events().join(clicks).where("k").equal_to("k").window(TumblingEventTimeWindows.of(1_000))
     .select("left.k AS k", name="j").sink_to(CollectSink()))
    (op,) = pipeline_manifest(env.graph())["operators"]
    assert (op["kind"], op["keys"], op["state"]["how"]) == ("window join", ["k", "k"], "inner")
    assert "TumblingWindows" in op["state"]["assigner"]
