"""When Spark calls a bucket back for its timers (no Spark: bucket_driver calls a bucket only
when Spark would — it has records, or its clock is past the timeout it asked for).

The rule Ember documents, Flink's: an event-time timer fires in the first micro-batch whose
watermark is at or past it; a processing-time timer in the first batch whose time is at or
past it — whether or not other keys of the timer's state bucket have records in that batch.
Ember's watermark is Flink's, one ms behind Spark's (``ember_watermark``): the watermarks
below are Ember's; the driver hands the bucket Spark's, as Spark does.
"""

from __future__ import annotations

import pytest
from bucket_driver import BucketDriver

from ember.functions import KeyedProcessFunction
from ember.runner.spark.keyed.windows import WindowOperator, WindowSpec
from ember.windowing.assigners import TumblingEventTimeWindows
from ember.windowing.triggers import EventTimeTrigger

pytestmark = pytest.mark.usefixtures("state_layout")  # both keyed state layouts (conftest.py)

FIELDS = ["ts", "k", "x"]


class TimerAfter500(KeyedProcessFunction):
    """A timer 500 ms after each record (event time, or processing time)."""

    def __init__(self, processing: bool = False) -> None:
        self.processing = processing

    def process_element(self, value, ctx):
        if self.processing:
            ctx.register_processing_time_timer(ctx.current_processing_time + 500)
        else:
            ctx.register_event_time_timer(value["ts"] + 500)

    def on_timer(self, timestamp, ctx):
        yield {"k": ctx.current_key, "at": timestamp}


def _first_firing_batch(driver: BucketDriver, batches: list[tuple[list[tuple], int]], *, clock: str) -> int | None:
    for i, (rows, time) in enumerate(batches):
        main, _ = driver.batch(rows, **({"watermark": time} if clock == "watermark" else {"now": time}))
        if main:
            return i
    return None


def _expected(timer: int, clocks: list[int | None]) -> int:
    """The independent rule: the first batch whose clock is at or past the timer."""
    return next(i for i, c in enumerate(clocks) if c is not None and c >= timer)


@pytest.mark.parametrize("neighbour", [False, True])
def test_an_event_time_timer_fires_when_the_watermark_reaches_it_with_or_without_other_keys(neighbour):
    # Issue 16, finding 5: key a's timer at 1500; the watermark goes none, 999, 1499, 1500, 1599.
    # It fires at 1500 whether or not another key of a's bucket has records in the batch
    # before (before the fix: only if one had), and not before.
    watermarks = [None, 999, 1499, 1500, 1599]
    other = [(1550, "b", 0)] if neighbour else []
    batches = [([(1000, "a", 1)], watermarks[0]), ([], watermarks[1]), (other, watermarks[2]), ([], watermarks[3]), ([], watermarks[4])]
    d = BucketDriver(TimerAfter500(), FIELDS, ["k", "at"])
    assert _first_firing_batch(d, batches, clock="watermark") == _expected(1500, watermarks) == 3


@pytest.mark.parametrize("neighbour", [False, True])
def test_a_processing_time_timer_fires_in_the_batch_that_reaches_it(neighbour):
    times = [0, 400, 500, 600]  # the timer: 0 + 500
    other = [(0, "b", 0)] if neighbour else []
    batches = [([(0, "a", 1)], times[0]), ([], times[1]), (other, times[2]), ([], times[3])]
    d = BucketDriver(TimerAfter500(processing=True), FIELDS, ["k", "at"], event_time=False)
    assert _first_firing_batch(d, batches, clock="now") == _expected(500, times) == 2


def test_a_window_on_the_operator_fires_when_the_watermark_reaches_its_end_without_other_keys():
    # Tumbling 2 s: [0, 2000) fires at watermark 1999 (its last timestamp), whatever else arrives.
    spec = WindowSpec(assigner=TumblingEventTimeWindows.of(2000), trigger=EventTimeTrigger(), evictor=None,
                      window_function=None, key_names=("k",), result_fields=("xs",))
    d = BucketDriver(WindowOperator(spec), FIELDS, ["k", "window_start", "window_end", "x"])
    watermarks = [None, 999, 1998, 1999, 2499]
    batches = [([(1000, "a", 1)], watermarks[0]), ([], watermarks[1]), ([(1999, "b", 2)], watermarks[2]), ([], watermarks[3]), ([], watermarks[4])]
    assert _first_firing_batch(d, batches, clock="watermark") == _expected(1999, watermarks) == 3
