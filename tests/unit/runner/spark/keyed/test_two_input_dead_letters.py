"""Dead letters of the two-input steps (``connect(...).key_by(...).process(fn, schema,
dead_letter=tag)`` and ``connect(broadcast).process(..., dead_letter=tag)``), through the
keyed runtime's bucket function fed rows of the union the runner builds (ember.coprocess):
a failed call's record comes out as its stream had it, the error names the user's method,
what the call emitted is discarded; a broadcast record, run in every state bucket, is
reported by one copy only. Without a tag, the error names the user's method and record."""

from __future__ import annotations

import json

import pytest
from bucket_driver import BucketDriver

from ember import OutputTag
from ember.coprocess import INPUT, CoProcessAdapter, field_column, key_column
from ember.errors import UserFunctionError
from ember.functions import KeyedBroadcastProcessFunction, KeyedCoProcessFunction
from ember.runner.spark.keyed.broadcast import BROADCAST_INPUT, FIRST, KEYED_INPUT, BroadcastAdapter
from ember.state.descriptors import MapStateDescriptor, ValueStateDescriptor

pytestmark = pytest.mark.usefixtures("state_layout")

NOTE = OutputTag("note", "k string")
K, D1, D2 = key_column(0), field_column(1, "d"), field_column(2, "n")
FIELDS = [INPUT, K, D1, D2, "ts"]


class Divide(KeyedCoProcessFunction):
    """Stream 1 sets a key's divisor ``d``; stream 2's ``n`` is divided by it (after a side output
    and a first record: both must go with a failed call)."""

    def open(self, ctx):
        self.divisor = ctx.get_state(ValueStateDescriptor("divisor"))

    def process_element1(self, value, ctx):
        self.divisor.update(value["d"])

    def process_element2(self, value, ctx):
        ctx.output(NOTE, {"k": ctx.current_key})
        yield {"k": ctx.current_key, "q": -1}
        yield {"k": ctx.current_key, "q": value["n"] // self.divisor.value()}


def _co(stream, k, value, ts):
    return (stream, k, value if stream == 1 else None, value if stream == 2 else None, ts)


def _co_driver(dead_letter):
    sides = {"note": ["k"], **({"bad": ["raw", "error"]} if dead_letter else {})}
    adapter = CoProcessAdapter(Divide(), ["d", "ts"], ["n", "ts"])
    fields = [INPUT, K, D1, field_column(1, "ts"), D2, field_column(2, "ts"), "ts"]
    driver = BucketDriver(adapter, fields, ["k", "q"], keys=(K,), side_outputs=sides, dead_letter=dead_letter, dtype=object)
    return driver, lambda rows: [(s, k, d, t if s == 1 else None, n, t if s == 2 else None, t) for s, k, d, n, t in rows]


def test_a_co_process_record_its_method_raises_on_is_a_dead_letter_as_its_stream_had_it():
    driver, rows = _co_driver("bad")
    main, sides = driver.batch(rows([_co(1, "a", 4, 1), _co(1, "b", 0, 2), _co(2, "a", 9, 3), _co(2, "b", 7, 4),
                                     _co(2, "a", 20, 5)]))
    assert sorted((r["k"], r["q"]) for r in main) == [("a", -1), ("a", -1), ("a", 2), ("a", 5)]
    assert [r["k"] for r in sides["note"]] == ["a", "a"]  # b's went with its failed call
    assert [json.loads(r["raw"]) for r in sides["bad"]] == [{"n": 7, "ts": 4}]
    assert [r["error"] for r in sides["bad"]] == [
        "step 'test': Divide.process_element2 raised ZeroDivisionError: integer division or modulo by zero"]
    # the key's state is untouched by the failure: a new divisor, then b divides again
    main, sides = driver.batch(rows([_co(1, "b", 2, 6), _co(2, "b", 7, 7)]))
    assert sorted((r["k"], r["q"]) for r in main) == [("b", -1), ("b", 3)] and sides["bad"] == []


def test_without_a_tag_a_co_process_failure_names_the_users_method_and_record():
    driver, rows = _co_driver(None)
    with pytest.raises(UserFunctionError, match=r"Divide.process_element2 raised ZeroDivisionError.* on record "
                                                r"\{'n': 7, 'ts': 4\}$"):
        driver.batch(rows([_co(1, "b", 0, 2), _co(2, "b", 7, 4)]))


RULES = MapStateDescriptor("rules")


class Threshold(KeyedBroadcastProcessFunction):
    """Broadcast records set the threshold (an unparsable one raises after writing a marker);
    events above it are emitted."""

    def process_broadcast_element(self, value, ctx):
        rules = ctx.get_broadcast_state(RULES)
        rules.put("seen", (rules.get("seen") or 0) + 1)
        ctx.output(NOTE, {"k": "rule"})
        rules.put("limit", int(value["limit"]))

    def process_element(self, value, ctx):
        if value["v"] > ctx.get_broadcast_state(RULES).get("limit"):
            yield {"k": ctx.current_key, "v": value["v"]}


def _broadcast_driver(dead_letter):
    sides = {"note": ["k"], **({"bad": ["raw", "error"]} if dead_letter else {})}
    adapter = BroadcastAdapter(Threshold(), ["k", "v", "ts"], ["limit", "ts"], (RULES,))
    fields = [INPUT, K, field_column(1, "k"), field_column(1, "v"), field_column(1, "ts"), field_column(2, "limit"),
              field_column(2, "ts"), FIRST, "ts"]
    driver = BucketDriver(adapter, fields, ["k", "v"], keys=(K,), side_outputs=sides, dead_letter=dead_letter, dtype=object)
    return driver


def _rule(limit, ts, first):
    return (BROADCAST_INPUT, None, None, None, None, limit, ts, first, ts)


def _event(k, v, ts):
    return (KEYED_INPUT, k, k, v, ts, None, None, False, ts)


@pytest.mark.parametrize("first", [True, False])
def test_a_broadcast_record_that_raises_is_reported_by_its_first_copy_only(first):
    driver = _broadcast_driver("bad")
    main, sides = driver.batch([_rule("5", 1, first), _event("a", 9, 2), _rule("ten", 3, first), _event("a", 7, 4)])
    # the bad rule changed the state before raising, alike in every copy: limit stays 5
    assert [(r["k"], r["v"]) for r in main] == [("a", 9), ("a", 7)]
    assert [r["k"] for r in sides["note"]] == (["rule"] if first else [])  # the failed call's note is dropped
    if first:
        assert [json.loads(r["raw"]) for r in sides["bad"]] == [{"limit": "ten", "ts": 3}]
        assert sides["bad"][0]["error"].startswith(
            "step 'test': Threshold.process_broadcast_element raised ValueError: invalid literal for int()")
    else:
        assert sides["bad"] == []


def test_without_a_tag_a_broadcast_failure_names_the_users_method():
    driver = _broadcast_driver(None)
    with pytest.raises(UserFunctionError, match=r"Threshold.process_broadcast_element raised ValueError.*"
                                                r"on record \{'limit': 'ten', 'ts': 3\}$"):
        driver.batch([_rule("ten", 3, True)])


def _ratio_pairs():
    from ember.runner.spark.translators.python_ops import pair_records

    return pair_records(lambda left, right: {"k": left["k"], "r": left["v"] // right["v"]}, ["k", "r"], "ratios")


@pytest.mark.parametrize("kind", ["interval", "window"])
def test_a_pair_the_join_function_raises_on_is_a_dead_letter_and_the_other_pairs_go_on(kind):
    """Keyed interval and window joins: each pair whose function raises (a zero divisor on the
    right) is one dead letter carrying both records; every other pair is emitted."""
    from ember.runner.spark.keyed.intervaljoin import IntervalJoinFunction
    from ember.runner.spark.keyed.windowjoin import WindowJoinFunction
    from ember.windowing.assigners import TumblingEventTimeWindows

    join = (IntervalJoinFunction(-10, 10, "inner", _ratio_pairs(), "bad") if kind == "interval"
            else WindowJoinFunction(TumblingEventTimeWindows.of(100), "inner", _ratio_pairs(), "bad"))
    adapter = CoProcessAdapter(join, ["k", "v", "ts"], ["k", "v", "ts"])
    fields = [INPUT, K, field_column(1, "k"), field_column(1, "v"), field_column(1, "ts"), field_column(2, "k"),
              field_column(2, "v"), field_column(2, "ts"), "ts"]
    driver = BucketDriver(adapter, fields, ["k", "r"], keys=(K,), side_outputs={"bad": ["raw", "error"]},
                          dead_letter="bad", dtype=object)

    def row(side, k, v, ts):
        one, two = ((k, v, ts), (None,) * 3) if side == 1 else ((None,) * 3, (k, v, ts))
        return (side, k, *one, *two, ts)

    rows = [row(1, "a", 12, 1), row(1, "a", 30, 3), row(2, "a", 4, 5), row(2, "a", 0, 6), row(1, "b", 9, 7),
            row(2, "b", 3, 8)]
    main, sides = driver.batch(rows)
    main2, sides2 = driver.batch([], watermark=1_000)  # the window join emits when its window closes
    got = sorted((r["k"], r["r"]) for r in main + main2)
    assert got == [("a", 3), ("a", 7), ("b", 3)]
    bad = sorted((json.loads(r["raw"])["left"]["ts"], json.loads(r["raw"])["right"]["ts"]) for r in sides["bad"] + sides2["bad"])
    assert bad == [(1, 6), (3, 6)]  # both left records of a met the zero divisor
    assert all(r["error"].startswith("step 'ratios': ") and "ZeroDivisionError" in r["error"]
               for r in sides["bad"] + sides2["bad"])
