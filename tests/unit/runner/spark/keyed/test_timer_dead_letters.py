"""``process(fn, schema, dead_letter=tag)`` covers ``on_timer`` too: a timer whose call raises
becomes a dead letter (``raw``: the timer's key and time as JSON), what that call emitted —
records and side outputs, a generator's first records included — is discarded, and the other
timers of the batch fire as usual; without the tag the call fails the step."""

from __future__ import annotations

import json

import pytest
from bucket_driver import BucketDriver

from ember import OutputTag
from ember.errors import UserFunctionError
from ember.functions import KeyedProcessFunction
from ember.state.descriptors import ValueStateDescriptor

FIRED = OutputTag("fired", "k string")


class Ratio(KeyedProcessFunction):
    """Keeps each key's last value; ten ms after a record, emits 100 // that value (a generator:
    its first record comes before the division)."""

    def open(self, ctx):
        self.last = ctx.get_state(ValueStateDescriptor("last"))

    def process_element(self, value, ctx):
        self.last.update(value["v"])
        ctx.register_event_time_timer(value["ts"] + 10)

    def on_timer(self, timestamp, ctx):
        ctx.output(FIRED, {"k": ctx.current_key})
        yield {"k": ctx.current_key, "out": -1}
        yield {"k": ctx.current_key, "out": 100 // self.last.value()}


def drive(dead_letter):
    sides = {"fired": ["k"], **({"bad": ["raw", "error"]} if dead_letter else {})}
    driver = BucketDriver(Ratio(), ["ts", "k", "v"], ["k", "out"], side_outputs=sides, dead_letter=dead_letter)
    driver.batch([(1, "a", 5), (2, "b", 0), (3, "c", 20)])
    return driver.batch([(20, "d", 1)], watermark=15)


def test_a_timer_on_timer_raises_on_is_a_dead_letter_and_the_others_fire():
    main, sides = drive("bad")
    assert sorted((r["k"], r["out"]) for r in main) == [("a", -1), ("a", 20), ("c", -1), ("c", 5)]
    assert sorted(r["k"] for r in sides["fired"]) == ["a", "c"]  # b's side output went with its failed call
    assert [json.loads(r["raw"]) for r in sides["bad"]] == [{"key": "b", "timestamp": 12}]
    assert [r["error"] for r in sides["bad"]] == ["step 'test': Ratio.on_timer raised ZeroDivisionError: integer division or modulo by zero"]


def test_without_a_dead_letter_tag_a_raising_on_timer_fails_the_step():
    with pytest.raises(UserFunctionError, match=r"Ratio.on_timer raised ZeroDivisionError.* on \{'key': 'b', 'timestamp': 12\}"):
        drive(None)
