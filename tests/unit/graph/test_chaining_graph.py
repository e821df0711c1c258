"""Operator chaining (ember.graph.chaining, ember.chaining): which keyed steps become one,
and the chained function itself on Ember's keyed runtime, without Spark — each step's
state apart, timers back to the step that set them, the key promise checked, errors named."""

from __future__ import annotations

import pytest

from ember import CollectSink, KeyedProcessFunction, OutputTag, PipelineError
from ember.chaining import ChainedFunction, ChainLink
from ember.errors import UserFunctionError
from ember.graph.chaining import why_not_chained
from ember.graph.nodes import ChainedProcessNode, KeyByNode, KeyedProcessNode, SideOutputNode
from ember.runner.spark.keyed.runtime import KeyedRuntime
from ember.runner.spark.planner import plan
from ember.state.descriptors import ValueStateDescriptor

SCHEMA = "ts bigint, k string"


class Count(KeyedProcessFunction):
    """Numbers each key's records (state "n": every step declares the same name)."""

    def __init__(self, timer_after=None):
        self.timer_after = timer_after

    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))

    def process_element(self, value, ctx):
        self.n.update(self.n.value() + 1)
        if self.timer_after is not None:
            ctx.register_event_time_timer(value["ts"] + self.timer_after)
        yield {"ts": value["ts"], "k": value["k"], "n": self.n.value()}

    def on_timer(self, timestamp, ctx):
        yield (timestamp, ctx.current_key, -self.n.value())


def _chain(env, events, *steps, reinterpret=True):
    stream = events().key_by("k").process(steps[0], "ts bigint, k string, n bigint", name="s0")
    for i, fn in enumerate(steps[1:], 1):
        keyed = stream.reinterpret_as_keyed("k") if reinterpret else stream.key_by("k")
        stream = keyed.process(fn, "ts bigint, k string, n bigint", name=f"s{i}")
    return stream


def test_three_reinterpreted_steps_become_one_chained_step(env, events):
    _chain(env, events, Count(), Count(), Count()).sink_to(CollectSink(), name="out")
    graph = env.graph()
    keyed = [n for n in graph if isinstance(n, KeyedProcessNode)]
    assert len(keyed) == 1 and isinstance(keyed[0], ChainedProcessNode)
    assert keyed[0].name == "s0 -> s1 -> s2"
    assert [s.name for s in keyed[0].steps] == ["s0", "s1", "s2"]
    assert isinstance(keyed[0].inputs[0], KeyByNode) and not keyed[0].inputs[0].reinterpret
    assert "process Count -> Count -> Count by k (python, keyed state, chained)" in env.explain(spark_plan=False)
    assert not plan(graph).chained  # one keyed-runtime step: Spark's applyInPandasWithState may run it


def test_key_by_between_keyed_steps_does_not_chain(env, events):
    _chain(env, events, Count(), Count(), reinterpret=False).sink_to(CollectSink())
    assert not any(isinstance(n, ChainedProcessNode) for n in env.graph())


def test_a_step_read_elsewhere_does_not_chain_and_says_why(env, events):
    first = events().key_by("k").process(Count(), "ts bigint, k string, n bigint", name="first")
    first.sink_to(CollectSink(), name="audit")
    first.reinterpret_as_keyed("k").process(Count(), "ts bigint, k string, n bigint", name="second").sink_to(CollectSink())
    graph = env.graph()
    assert not any(isinstance(n, ChainedProcessNode) for n in graph)
    node = next(n for n in graph if isinstance(n, KeyByNode) and n.reinterpret)
    assert why_not_chained(node, graph) == "'first' is also read by audit"
    assert "not chained: 'first' is also read by audit" in env.explain(spark_plan=False)


def test_other_keys_do_not_chain(env, events):
    first = events().key_by("k").process(Count(), "ts bigint, k string, n bigint", name="first")
    first.reinterpret_as_keyed("ts").process(Count(), "ts bigint, k string, n bigint", name="second").sink_to(CollectSink())
    graph = env.graph()
    node = next(n for n in graph if isinstance(n, KeyByNode) and n.reinterpret)
    assert why_not_chained(node, graph) == "'first' is keyed by k, not by ts"


def test_side_outputs_of_the_first_step_are_read_from_the_chain(env, events):
    dead, odd = OutputTag("dead"), OutputTag("odd", "k string")
    first = events().key_by("k").process(Count(), "ts bigint, k string, n bigint", dead_letter=dead, name="first")
    first.get_side_output(dead).sink_to(CollectSink(), name="dead-letters")
    first.get_side_output(odd).sink_to(CollectSink(), name="odd")
    first.reinterpret_as_keyed("k").process(Count(), "ts bigint, k string, n bigint", name="second").sink_to(CollectSink())
    graph = env.graph()
    chained = [n for n in graph if isinstance(n, ChainedProcessNode)]
    assert len(chained) == 1 and [link.side_tags for link in chained[0].fn.links] == [{"dead", "odd"}, set()]
    sides = [n for n in graph if isinstance(n, SideOutputNode)]
    assert {s.tag.name for s in sides} == {"dead", "odd"} and all(s.inputs[0] is chained[0] for s in sides)
    assert not any(n.name in ("first", "second") for n in graph)  # neither step runs apart as well


def test_a_side_output_name_in_two_steps_keeps_them_apart(env, events):
    dead = OutputTag("dead")
    first = events().key_by("k").process(Count(), "ts bigint, k string, n bigint", dead_letter=dead, name="first")
    first.get_side_output(dead).sink_to(CollectSink(), name="first-dead")
    second = first.reinterpret_as_keyed("k").process(Count(), "ts bigint, k string, n bigint", dead_letter=dead,
                                                     name="second")
    second.get_side_output(dead).sink_to(CollectSink(), name="second-dead")
    second.sink_to(CollectSink())
    graph = env.graph()
    node = next(n for n in graph if isinstance(n, KeyByNode) and n.reinterpret)
    assert why_not_chained(node, graph) == "'first' and 'second' both have a side output named 'dead'"


@pytest.mark.parametrize("keys", [(), ("",), (1,)])
def test_reinterpret_needs_field_names(env, events, keys):
    with pytest.raises(PipelineError, match="reinterpret_as_keyed"):
        events().reinterpret_as_keyed(*keys)


# --------------------------------------------------------------------------- the chained function
class _Runtime:
    """Ember's keyed runtime with one bucket's keys: enter a key, run a call, leave."""

    def __init__(self, fn, dead_letter=None, dead_letters=None):
        dead_letters = dead_letters or [None] * (len(fn.links) - 1) + [dead_letter]
        self.rt = KeyedRuntime(event_time=True, side_tags=frozenset(d for d in dead_letters if d))
        fields = [["ts", "k", "n"]] * (len(fn.links) - 1)
        self.fn = fn.bound(fields, dead_letters)
        self.fn.open(self.rt)

    def element(self, ts, key):
        found = self.rt.enter(key)
        self.rt.timestamp = ts
        try:
            return list(self.fn.process_element({"ts": ts, "k": key}, self.rt) or [])
        finally:
            self.rt.leave(key, found)

    def timer(self, ts, key):
        found = self.rt.enter(key)
        timers = self.rt.current.get("\x00event_timers", set())
        assert ts in timers, "the runtime holds one timer per key and time"
        timers.discard(ts)
        if not timers:
            self.rt.current.pop("\x00event_timers", None)
        self.rt.time_domain = "event_time"
        try:
            return list(self.fn.on_timer(ts, self.rt) or [])
        finally:
            self.rt.leave(key, found)


def _links(*fns):
    return ChainedFunction([ChainLink(f"s{i}", fn, ("k",)) for i, fn in enumerate(fns)])


def test_each_step_keeps_its_own_state_under_its_name():
    run = _Runtime(_links(Count(), Count()))
    assert run.element(10, "a") == [{"ts": 10, "k": "a", "n": 1}]
    run.element(11, "a")
    assert run.element(12, "b") == [{"ts": 12, "k": "b", "n": 1}]
    assert run.rt.blob["keys"]["a"] == {"s0/n": 2, "s1/n": 2}


def test_a_timer_calls_the_steps_that_set_it_and_feeds_the_steps_after():
    run = _Runtime(_links(Count(timer_after=5), Count(), Count(timer_after=5)))
    run.element(10, "a")  # s0 and s2 both set a timer at 15: the runtime keeps one
    assert run.rt.blob["keys"]["a"]["\x00event_timers"] == {15}
    fired = run.timer(15, "a")
    # s0's on_timer emits (15, a, -1): s1 counts it (n = 2), s2 counts it (n = 2) and sets a timer at 20;
    # then s2's own timer at 15: (15, a, -2) leaves the chain as it is
    assert fired == [{"ts": 15, "k": "a", "n": 2}, (15, "a", -2)]
    assert run.rt.blob["keys"]["a"]["\x00event_timers"] == {20}
    assert run.timer(20, "a") == [(20, "a", -2)]
    assert "\x00chain_event" not in run.rt.blob["keys"]["a"]


def test_a_deleted_timer_stays_while_another_step_waits_for_it():
    class Deleting(Count):
        def process_element(self, value, ctx):
            ctx.register_event_time_timer(100)
            ctx.delete_event_time_timer(100)
            yield value | {"n": 0}

    class Setting(Count):
        def process_element(self, value, ctx):
            ctx.register_event_time_timer(100)
            yield value | {"n": 0}

    run = _Runtime(_links(Setting(), Deleting()))
    run.element(10, "a")
    assert run.rt.blob["keys"]["a"]["\x00event_timers"] == {100}
    assert run.rt.blob["keys"]["a"]["\x00chain_event"] == {100: {0}}


class Rekey(KeyedProcessFunction):
    def process_element(self, value, ctx):
        yield {"ts": value["ts"], "k": value["k"] + "!", "n": 0}


class Failing(KeyedProcessFunction):
    def process_element(self, value, ctx):
        if value["ts"] == 13:
            raise ValueError("thirteen")
        yield value


def test_a_record_under_another_key_fails_the_job_naming_both_steps_and_keys():
    run = _Runtime(_links(Rekey(), Count()))
    with pytest.raises(UserFunctionError, match=r"step 's1' reads 's0' through reinterpret_as_keyed\('k'\), but "
                                                r"'s0' emitted a record with key 'a!' while processing key 'a'"):
        run.element(10, "a")


def test_a_record_under_another_key_is_the_last_steps_dead_letter():
    run = _Runtime(_links(Rekey(), Count()), dead_letter="dead")
    assert run.element(10, "a") == []
    (tag, letter, _, _), = run.rt.side
    assert tag == "dead" and "emitted a record with key 'a!'" in letter["error"] and '"k": "a!"' in letter["raw"]


def test_the_last_step_failing_is_its_dead_letter_with_its_record():
    run = _Runtime(_links(Count(), Failing()), dead_letter="dead")
    assert run.element(12, "a") == [{"ts": 12, "k": "a", "n": 1}]
    assert run.element(13, "a") == []
    (tag, letter, _, _), = run.rt.side
    assert letter["error"] == "step 's1': Failing.process_element raised ValueError: thirteen"
    assert '"n": 2' in letter["raw"]  # the record as the failing step saw it
    assert run.rt.blob["keys"]["a"]["s0/n"] == 2  # the step before keeps what it did


def test_an_earlier_step_failing_is_its_own_dead_letter():
    run = _Runtime(_links(Failing(), Count()), dead_letters=["first-dead", "second-dead"])
    assert run.element(12, "a") == [{"ts": 12, "k": "a", "n": 1}]
    assert run.element(13, "a") == []
    (tag, letter, _, _), = run.rt.side
    assert tag == "first-dead" and letter["error"] == "step 's0': Failing.process_element raised ValueError: thirteen"
    assert run.rt.blob["keys"]["a"] == {"s1/n": 1}  # the step after never saw the failed record


def test_an_earlier_step_failing_fails_the_job_naming_it():
    run = _Runtime(_links(Failing(), Count()), dead_letter="dead")
    with pytest.raises(UserFunctionError, match="step 's0': Failing.process_element raised ValueError: thirteen"):
        run.element(13, "a")


def test_the_last_steps_generator_failing_as_read_names_it():
    run = _Runtime(_links(Count(), Failing()))
    with pytest.raises(UserFunctionError, match="step 's1': Failing.process_element raised ValueError: thirteen"):
        run.element(13, "a")


def test_tuples_and_partial_dicts_become_records_of_the_steps_schema():
    class Shapes(KeyedProcessFunction):
        def process_element(self, value, ctx):
            yield (value["ts"], value["k"], 7)
            yield {"k": value["k"], "ts": value["ts"]}

    class Echo(KeyedProcessFunction):
        def process_element(self, value, ctx):
            yield value

    run = _Runtime(_links(Shapes(), Echo()))
    assert run.element(10, "a") == [{"ts": 10, "k": "a", "n": 7}, {"ts": 10, "k": "a", "n": None}]


def test_processing_time_timers_go_back_to_the_step_that_set_them():
    class Later(KeyedProcessFunction):
        def process_element(self, value, ctx):
            ctx.register_processing_time_timer(ctx.current_processing_time + 50)
            yield value | {"n": 0}

        def on_timer(self, timestamp, ctx):
            yield {"ts": timestamp, "k": ctx.current_key, "n": 99 if ctx.time_domain == "processing_time" else -1}

    run = _Runtime(_links(Count(), Later()))
    run.rt.now = 1_000
    assert run.element(10, "a") == [{"ts": 10, "k": "a", "n": 0}]
    slot = run.rt.blob["keys"]["a"]
    assert slot["\x00processing_timers"] == {1_050} and slot["\x00chain_proc"] == {1_050: {1}}
    found = run.rt.enter("a")
    slot["\x00processing_timers"].discard(1_050)
    run.rt.time_domain = "processing_time"
    assert list(run.fn.on_timer(1_050, run.rt)) == [{"ts": 1_050, "k": "a", "n": 99}]
    run.rt.leave("a", found)
    assert "\x00chain_proc" not in run.rt.blob["keys"]["a"]


def test_a_keyed_window_may_end_a_chain_but_not_go_on_with_one(env, events):
    from ember import Agg, TumblingEventTimeWindows

    first = events().key_by("k").process(Count(), "ts bigint, k string, n bigint", name="count")
    windowed = first.reinterpret_as_keyed("k").window(TumblingEventTimeWindows.of(1_000)).aggregate(
        n=Agg.count(), name="per-second")
    windowed.reinterpret_as_keyed("k").process(Count(), "ts bigint, k string, n bigint", name="after").sink_to(CollectSink())
    graph = env.graph()
    chained = [n for n in graph if isinstance(n, ChainedProcessNode)]
    assert [c.name for c in chained] == ["count -> per-second"]
    assert chained[0].fn.links[-1].fn is None  # the runner binds the window's operator
    assert "count -> per-second: process Count -> window tumbling 1000 ms" in env.explain(spark_plan=False)
    node = next(n for n in graph if isinstance(n, KeyByNode) and n.reinterpret)
    assert why_not_chained(node, graph) == "'count -> per-second' is not a keyed process step run per record"


def test_a_window_over_the_whole_stream_does_not_chain(env, events):
    from ember import Agg, TumblingEventTimeWindows

    first = events().key_by("k").process(Count(), "ts bigint, k string, n bigint", name="count")
    first.reinterpret_as_keyed("k").window_all(TumblingEventTimeWindows.of(1_000)).aggregate(n=Agg.count()).sink_to(
        CollectSink())
    assert not any(isinstance(n, ChainedProcessNode) for n in env.graph())
