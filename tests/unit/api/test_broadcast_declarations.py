"""Broadcast state declared and run without Spark: declarations checked when declared,
naming the step; the runtime keeps broadcast state writable only where Flink does and
refuses keyed state where there is no key."""

import pytest

from ember import (
    BroadcastProcessFunction,
    CollectSink,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    OutputTag,
    PipelineError,
    ScriptedSource,
    WatermarkStrategy,
)
from ember.coprocess import INPUT, field_column
from ember.errors import UserFunctionError
from ember.graph.nodes import BroadcastProcessNode
from ember.runner.spark.keyed.broadcast import BROADCAST_INPUT, FIRST, KEYED_INPUT, BroadcastAdapter, UnkeyedBroadcast
from ember.runner.spark.keyed.runtime import BROADCAST, KeyedRuntime
from ember.runner.spark.planner import plan
from ember.state.descriptors import MapStateDescriptor, StateTtlConfig, ValueStateDescriptor

RULES = MapStateDescriptor("rules")
SEEN = ValueStateDescriptor("seen", default=0)
OVER = OutputTag("over", "k string")


class Check(KeyedBroadcastProcessFunction):
    def open(self, ctx):
        self.seen = ctx.get_state(SEEN)

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(RULES).put(value["name"], value["limit"])
        if value["name"] == "touch-keyed":
            self.seen.update(1)
        if value["name"] == "timer":
            ctx.register_event_time_timer(5)
        if value["name"] == "reset":
            ctx.apply_to_keyed_state(SEEN, lambda key, state: state.update(state.value() * 100))
        yield ("rule", value["name"])

    def process_element(self, value, ctx):
        self.seen.update(self.seen.value() + 1)
        if value["v"] < 0:
            ctx.get_broadcast_state(RULES).put("x", 1)
        yield (value["k"], ctx.get_broadcast_state(RULES).get("r1"))


class Alerts(BroadcastProcessFunction):
    """A non-keyed stream's rules check; the rule 'keyed' or an event with v < 0 reach for what it has not."""

    def process_broadcast_element(self, value, ctx):
        ctx.get_broadcast_state(RULES).put(value["name"], value["limit"])
        if value["name"] == "keyed":
            ctx.apply_to_keyed_state(SEEN, lambda key, state: None)
        yield ("rule", value["name"])

    def process_element(self, value, ctx):
        if value["v"] < 0:
            ctx.register_event_time_timer(5)
        limit = ctx.get_broadcast_state(RULES).get("r1")
        if value["v"] > limit:
            ctx.output(OVER, {"k": value["k"]})
            yield (value["k"], limit)


class Pass(KeyedProcessFunction):
    def process_element(self, value, ctx):
        yield value


@pytest.fixture
def rules(env):
    return env.from_source(ScriptedSource([[(1, "r1", 3)]], "ts bigint, name string, limit int"),
                           WatermarkStrategy.for_bounded_out_of_orderness(0, "ts"), name="rules")


def test_the_node_holds_the_keyed_input_and_the_broadcast_state(env, events, rules):
    out = events().key_by("k").connect(rules.broadcast(RULES)).process(Check(), "k string, r int", name="check")
    node = out.node
    assert isinstance(node, BroadcastProcessNode) and node.keys == ("k",) and node.descriptors == (RULES,)
    assert [i.name for i in node.inputs][1] == "rules"
    assert "broadcast-process Check" in node.describe() and "broadcast state rules" in node.describe()


def test_bad_declarations_fail_naming_the_step(env, events, rules):
    with pytest.raises(PipelineError, match="needs the broadcast state"):
        rules.broadcast()
    with pytest.raises(PipelineError, match="is a MapStateDescriptor"):
        rules.broadcast(SEEN)
    with pytest.raises(PipelineError, match="cannot have a TTL"):
        rules.broadcast(MapStateDescriptor("r", ttl=StateTtlConfig.of(1000)))
    with pytest.raises(PipelineError, match="names must differ"):
        rules.broadcast(RULES, MapStateDescriptor("rules"))
    stream = events()
    with pytest.raises(PipelineError, match=r"takes a BroadcastProcessFunction .*needs a keyed stream: key_by\(...\) before connect"):
        stream.connect(rules.broadcast(RULES)).process(Check(), "k string, r int")
    connected = stream.key_by("k").connect(rules.broadcast(RULES))
    with pytest.raises(PipelineError, match="takes a KeyedBroadcastProcessFunction") as failure:
        connected.process(Pass(), "x int", name="p")
    assert failure.value.step == "p"
    with pytest.raises(PipelineError, match="takes a KeyedBroadcastProcessFunction"):
        connected.process(Alerts(), "x int")
    with pytest.raises(PipelineError, match="needs an output_schema"):
        connected.process(Check(), None)


def test_a_broadcast_step_chains_after_a_stateful_step(env, events, rules):
    deduped = events().key_by("k").process(Pass(), "ts bigint, k string", name="dedupe")
    deduped.key_by("k").connect(rules.broadcast(RULES)).process(Check(), "k string, r int", name="check").sink_to(CollectSink())
    graph = env.graph()
    steps = {n.name: n for n in graph.nodes}
    physical = plan(graph)
    assert physical.upstream_step(steps["check"]) is steps["dedupe"] and physical.read_by_step(steps["dedupe"])


def test_a_broadcast_step_may_read_a_stateful_step_on_each_input(env, events):
    from ember.runner.spark.restart import pipeline_manifest

    source = events()
    a = source.key_by("k").process(Pass(), "ts bigint, k string", name="a")
    b = source.key_by("k").process(Pass(), "ts bigint, k string", name="b")
    a.key_by("k").connect(b.broadcast(RULES)).process(Check(), "k string, r int", name="check").sink_to(CollectSink())
    graph = env.graph()
    check = next(n for n in graph.nodes if n.name == "check")
    assert [n.name for n in plan(graph).upstream_steps(check)] == ["a", "b"]
    ops = pipeline_manifest(graph)["operators"]  # the keyed input's branch first, as in the union
    assert [(o["name"], o["spark operator id"]) for o in ops] == [("a", 1), ("b", 2), ("check", 0)]


def _row(input_value, **fields):
    prefix = 1 if input_value == KEYED_INPUT else 2
    return {INPUT: input_value, FIRST: fields.pop("first", False), **{field_column(prefix, f): v for f, v in fields.items()}}


def _adapter():
    adapter = BroadcastAdapter(Check(), ["k", "v"], ["name", "limit"], (RULES,))
    rt = KeyedRuntime(event_time=True)
    adapter.open(rt)
    return adapter, rt


def test_broadcast_state_is_writable_only_in_process_broadcast_element():
    adapter, rt = _adapter()
    assert adapter.process_element(_row(BROADCAST_INPUT, name="r1", limit=3, first=True), rt) == [("rule", "r1")]
    assert rt.blob[BROADCAST] == {"rules": {"r1": 3}}
    rt.enter("a")
    assert list(adapter.process_element(_row(KEYED_INPUT, k="a", v=1), rt)) == [("a", 3)]
    with pytest.raises(UserFunctionError, match="broadcast state 'rules' is read-only here"):
        list(adapter.process_element(_row(KEYED_INPUT, k="a", v=-1), rt))


def test_only_the_first_copy_of_a_broadcast_record_emits():
    adapter, rt = _adapter()
    assert adapter.process_element(_row(BROADCAST_INPUT, name="r2", limit=4, first=False), rt) is None
    assert rt.blob[BROADCAST] == {"rules": {"r2": 4}}  # every copy still updates its state


def test_process_broadcast_element_has_no_current_key():
    adapter, rt = _adapter()
    with pytest.raises(UserFunctionError, match="has no current key"):
        adapter.process_element(_row(BROADCAST_INPUT, name="touch-keyed", limit=0, first=True), rt)
    with pytest.raises(UserFunctionError, match="has no current key"):
        adapter.process_element(_row(BROADCAST_INPUT, name="timer", limit=0, first=True), rt)
    assert not rt.broadcast_writable and rt.current is not None and rt.blob["keys"] == {}


def test_apply_to_keyed_state_reaches_every_key_holding_the_state():
    adapter, rt = _adapter()
    for key, n in (("a", 1), ("b", 2)):
        found = rt.enter(key)
        for _ in range(n):
            list(adapter.process_element(_row(KEYED_INPUT, k=key, v=1), rt))
        rt.leave(key, found)
    adapter.process_element(_row(BROADCAST_INPUT, name="reset", limit=0, first=True), rt)
    assert {k: slot["seen"] for k, slot in rt.blob["keys"].items()} == {"a": 100, "b": 200}
    with pytest.raises(UserFunctionError, match="is for process_broadcast_element"):
        rt.apply_to_keyed_state(SEEN, lambda key, state: None)
    with pytest.raises(UserFunctionError, match="no broadcast state 'other'"):
        rt.get_broadcast_state(MapStateDescriptor("other"))


def test_a_non_keyed_stream_is_connected_without_keys(env, events, rules):
    out = events().connect(rules.broadcast(RULES)).process(Alerts(), "k string, r int", name="alerts")
    node = out.node
    assert isinstance(node, BroadcastProcessNode) and node.keys == () and node.inputs[0].name == "events"
    assert "broadcast-process Alerts of events (non-keyed)" in node.describe()


def test_a_broadcast_process_function_sees_no_key_keyed_state_or_timers():
    adapter = BroadcastAdapter(UnkeyedBroadcast(Alerts()), ["k", "v"], ["name", "limit"], (RULES,))
    rt = KeyedRuntime(event_time=True, side_tags=frozenset({"over"}))
    adapter.open(rt)
    assert adapter.process_element(_row(BROADCAST_INPUT, name="r1", limit=3, first=True), rt) == [("rule", "r1")]
    rt.enter(12345)  # the row's hash: placement only
    rt.timestamp = 7
    assert list(adapter.process_element(_row(KEYED_INPUT, k="a", v=5), rt)) == [("a", 3)]
    assert list(adapter.process_element(_row(KEYED_INPUT, k="b", v=1), rt)) == []
    assert [(tag, record, ts) for tag, record, ts, _ in rt.side] == [("over", {"k": "a"}, 7)]
    assert getattr(adapter.fn.view, "current_key", "none") == "none"  # not there: getattr's default, hasattr False
    with pytest.raises(AttributeError, match=r"Alerts: ctx.register_event_time_timer is not there .*KeyedBroadcastProcessFunction"):
        list(adapter.process_element(_row(KEYED_INPUT, k="a", v=-1), rt))
    with pytest.raises(AttributeError, match="ctx.apply_to_keyed_state is not there"):
        adapter.process_element(_row(BROADCAST_INPUT, name="keyed", limit=0, first=True), rt)
    assert rt.blob["keys"] == {}


def test_a_broadcast_process_function_cannot_declare_keyed_state():
    class Keyed(Alerts):
        def open(self, ctx):
            ctx.get_state(SEEN)

    with pytest.raises(AttributeError, match="ctx.get_state is not there"):
        BroadcastAdapter(UnkeyedBroadcast(Keyed()), ["k", "v"], ["name", "limit"], (RULES,)).open(KeyedRuntime(event_time=True))


def test_the_restart_manifest_names_the_broadcast_state(tmp_path, events):
    from ember import StreamEnvironment
    from ember.runner.spark.restart import compare, pipeline_manifest

    def manifest(*descriptors):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path)
        stream = env.from_source(ScriptedSource([[(1, "a")]], "ts bigint, k string"), None, name="events")
        rules = env.from_source(ScriptedSource([[(1, "r1", 3)]], "ts bigint, name string, limit int"), None, name="rules")
        stream.key_by("k").connect(rules.broadcast(*descriptors)).process(Check(), "k string, r int", name="check").sink_to(CollectSink())
        return pipeline_manifest(env.graph())

    before = manifest(RULES)
    (op,) = before["operators"]
    assert op["kind"] == "broadcast process function" and op["state"]["broadcast state"] == ["rules"]
    assert op["state"]["state descriptors"] == {"seen": "ValueStateDescriptor"}
    assert compare(before, manifest(RULES)) == []
    assert compare(before, manifest(MapStateDescriptor("limits"))) == [
        "stateful operator 'check': broadcast state changed from [\"rules\"] to [\"limits\"]"
    ]


def test_a_dead_letter_tag_is_typed_and_shown_keyed_or_not(env, events, rules):
    from ember import OutputTag
    from ember.functions import DEAD_LETTER_SCHEMA

    stream = events()
    keyed = stream.key_by("k").connect(rules.broadcast(RULES)).process(Check(), "k string, r int",
                                                                         dead_letter=OutputTag("bad"), name="check")
    plain = stream.connect(rules.broadcast(RULES)).process(Alerts(), "k string, r int", dead_letter=OutputTag("bad"),
                                                             name="alerts")
    for node in (keyed.node, plain.node):
        assert node.dead_letter.schema == DEAD_LETTER_SCHEMA and node.describe().endswith("; failures -> 'bad'")
    with pytest.raises(PipelineError, match="process dead_letter must be an OutputTag"):
        stream.connect(rules.broadcast(RULES)).process(Alerts(), "k string, r int", dead_letter=3)
