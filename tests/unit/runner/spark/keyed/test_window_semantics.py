"""Ember's window operator, driven batch by batch without Spark (see bucket_driver).

Expected results are computed independently from the scripted events.
"""

from __future__ import annotations

import pytest
from bucket_driver import BucketDriver, SumX

from ember.errors import UserFunctionError
from ember.functions import KeyedProcessFunction, OutputTag, ProcessWindowFunction
from ember.runner.spark.keyed.windows import WindowOperator, WindowSpec
from ember.windowing.assigners import (
    EventTimeSessionWindows,
    GlobalWindows,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)
from ember.windowing.evictors import CountEvictor, DeltaEvictor, TimeEvictor, TimestampedValue
from ember.windowing.triggers import (
    ContinuousProcessingTimeTrigger,
    CountTrigger,
    EventTimeTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
    TriggerResult,
)

pytestmark = pytest.mark.usefixtures("state_layout")  # both keyed state layouts (conftest.py)

FIELDS = ["ts", "k", "x"]
OUT = ["k", "window_start", "window_end", "total"]
LATE = OutputTag("late")


class Elements(ProcessWindowFunction):
    def process(self, key, context, elements):
        yield {"k": key, "start": context.window.start, "xs": [e["x"] for e in elements]}


def _driver(assigner, trigger=None, *, evictor=None, lateness=0, late=None, aggregate=None, window_fn=None,
            out=OUT, event_time=True, counters=None, every_batch=False):
    spec = WindowSpec(
        assigner=assigner,
        trigger=trigger or (ProcessingTimeTrigger() if assigner.processing_time else EventTimeTrigger()),
        evictor=evictor, allowed_lateness_ms=lateness, late_tag=late,
        aggregate=aggregate, window_function=window_fn, key_names=("k",), result_fields=("total",),
    )
    sides = {late.name: FIELDS} if late is not None else None
    return BucketDriver(WindowOperator(spec), FIELDS, out, event_time=event_time, side_outputs=sides, counters=counters,
                        every_batch=every_batch)


def _totals(rows):
    return sorted((r["k"], r["window_start"], r["total"]) for r in rows)


def test_tumbling_window_fires_once_the_watermark_passes_its_end():
    d = _driver(TumblingEventTimeWindows.of(10_000), aggregate=SumX())
    main, _ = d.batch([(1000, "a", 1), (9999, "a", 2), (10_000, "a", 4), (5000, "b", 8)], watermark=0)
    assert main == []
    main, _ = d.batch([], watermark=9998)
    assert main == []  # the window's last timestamp is 9999
    main, _ = d.batch([], watermark=9999)
    assert _totals(main) == [("a", 0, 3), ("b", 0, 8)]
    main, _ = d.batch([], watermark=20_000)
    assert _totals(main) == [("a", 10_000, 4)]


def test_sliding_windows_each_get_their_elements():
    d = _driver(SlidingEventTimeWindows.of(10_000, 5000), aggregate=SumX())
    events = [(1000, "a", 1), (6000, "a", 10), (12_000, "a", 100)]
    d.batch(events, watermark=0)
    main, _ = d.batch([], watermark=10**9)
    expected = {}
    for ts, _, x in events:
        for start in range(ts - ts % 5000, ts - 10_000, -5000):
            expected[start] = expected.get(start, 0) + x
    assert _totals(main) == sorted(("a", s, t) for s, t in expected.items())


def test_allowed_lateness_refires_then_sends_later_records_to_the_side_output():
    d = _driver(TumblingEventTimeWindows.of(10_000), lateness=5000, late=LATE, aggregate=SumX())
    d.batch([(1000, "a", 1), (2000, "a", 2)], watermark=0)
    main, _ = d.batch([], watermark=12_000)
    assert _totals(main) == [("a", 0, 3)]
    main, late = d.batch([(3000, "a", 10)], watermark=12_000)  # within the lateness: fires again at once
    assert _totals(main) == [("a", 0, 13)] and late == {"late": []}
    main, late = d.batch([(4000, "a", 100)], watermark=14_999)  # 9999 + 5000 <= 14999: too late
    assert main == [] and late == {"late": [{"ts": 4000, "k": "a", "x": 100}]}


def test_late_records_without_a_side_output_are_counted():
    class Counter:
        value = 0

        def add(self, n):
            Counter.value += n

    d = _driver(TumblingEventTimeWindows.of(10_000), aggregate=SumX(), counters={"late_dropped": Counter()})
    d.batch([(1000, "a", 1)], watermark=0)
    d.batch([(2000, "a", 1), (3000, "b", 1), (25_000, "a", 1)], watermark=20_000)
    assert Counter.value == 2


def test_window_state_is_removed_after_its_cleanup_time():
    d = _driver(TumblingEventTimeWindows.of(10_000), aggregate=SumX())
    d.batch([(1000, "a", 1)], watermark=0)
    size_open = len(d.blob)
    d.batch([], watermark=10_000)
    d.batch([(25_000, "b", 1)], watermark=10_000)
    d.batch([], watermark=40_000)
    import pickle

    assert pickle.loads(d.blob)["keys"] == {} and size_open > 0


def test_tumbling_count_window_fires_and_purges_every_n_records():
    d = _driver(GlobalWindows.create(), PurgingTrigger.of(CountTrigger.of(3)), aggregate=SumX(), event_time=False)
    xs = list(range(1, 9))
    main1, _ = d.batch([(i, "a", x) for i, x in enumerate(xs[:5])])
    main2, _ = d.batch([(i, "a", x) for i, x in enumerate(xs[5:])])
    totals = [r["total"] for r in main1 + main2]
    assert totals == [sum(xs[0:3]), sum(xs[3:6])]  # records 7 and 8 wait for a third
    assert all(r["window_start"] is None and r["window_end"] is None for r in main1 + main2)


def test_sliding_count_window_fires_every_slide_over_the_last_size_records():
    d = _driver(GlobalWindows.create(), CountTrigger.of(2), evictor=CountEvictor.of(3), aggregate=SumX(), event_time=False)
    xs = [1, 2, 4, 8, 16, 32, 64]
    main, _ = d.batch([(i, "a", x) for i, x in enumerate(xs)])
    expected = [sum(xs[max(0, n - 3):n]) for n in range(2, len(xs) + 1, 2)]
    assert [r["total"] for r in main] == expected


class EarlyAndFinal(Trigger):
    """Yahoo-style: an early result every 2 records, the final one at the window's end."""

    def __init__(self):
        from ember.state import ReducingStateDescriptor

        self.seen = ReducingStateDescriptor("seen", reduce_fn=lambda a, b: a + b)

    def on_element(self, element, timestamp, window, ctx):
        ctx.register_event_time_timer(window.max_timestamp)
        count = ctx.get_partitioned_state(self.seen)
        count.add(1)
        return TriggerResult.FIRE if count.get() % 2 == 0 else TriggerResult.CONTINUE

    def on_event_time(self, time, window, ctx):
        return TriggerResult.FIRE_AND_PURGE if time == window.max_timestamp else TriggerResult.CONTINUE

    def clear(self, window, ctx):
        ctx.get_partitioned_state(self.seen).clear()


def test_custom_trigger_fires_early_and_purges_at_the_end():
    d = _driver(TumblingEventTimeWindows.of(10_000), EarlyAndFinal(), aggregate=SumX())
    main, _ = d.batch([(1000, "a", 1), (2000, "a", 2), (3000, "a", 4)], watermark=0)
    assert [r["total"] for r in main] == [3]  # fired early after the 2nd record
    main, _ = d.batch([(4000, "a", 8)], watermark=0)
    assert [r["total"] for r in main] == [15]
    main, _ = d.batch([], watermark=9999)
    assert [r["total"] for r in main] == [15]  # final
    main, _ = d.batch([(12_000, "a", 1)], watermark=9999)
    main, _ = d.batch([], watermark=30_000)
    assert [(r["window_start"], r["total"]) for r in main] == [(10_000, 1)]


def test_continuous_processing_time_trigger_fires_every_interval():
    d = _driver(TumblingProcessingTimeWindows.of(10_000), ContinuousProcessingTimeTrigger.of(1000),
                aggregate=SumX(), event_time=False)
    main, _ = d.batch([(0, "a", 1)], now=500)
    assert main == [] and d.timeout_at == 999  # Spark calls back once its batch time is past 999, i.e. at 1000
    main, _ = d.batch([], now=1200)
    assert [r["total"] for r in main] == [1]
    main, _ = d.batch([(0, "a", 2)], now=1500)
    assert main == []
    main, _ = d.batch([], now=2000)
    assert [r["total"] for r in main] == [3]


def test_continuous_processing_time_trigger_with_a_final_firing_at_the_window_end():
    # The Yahoo output: the count every second of processing time while the window is
    # open, and the final count once the watermark passes its end; then nothing more.
    # With event time, processing-time timers fire when the bucket is called (README, "Timers"):
    # here in every batch, as when the bucket's other keys keep sending records.
    d = _driver(TumblingEventTimeWindows.of(10_000), ContinuousProcessingTimeTrigger.of(1000, fire_at_end=True),
                aggregate=SumX(), every_batch=True)
    main, _ = d.batch([(100, "a", 1), (200, "a", 2), (300, "b", 5)], watermark=0, now=500)
    assert main == []
    main, _ = d.batch([(4000, "a", 4)], watermark=0, now=1100)  # the 1 s update, then 4 joins
    assert _totals(main) == [("a", 0, 3), ("b", 0, 5)]
    main, _ = d.batch([], watermark=3000, now=2000)
    assert _totals(main) == [("a", 0, 7), ("b", 0, 5)]
    main, _ = d.batch([], watermark=9999, now=2500)  # end of the window: final, before the next update is due
    assert _totals(main) == [("a", 0, 7), ("b", 0, 5)]
    for now in (3000, 4000):
        main, _ = d.batch([], watermark=20_000, now=now)
        assert main == []  # cleaned up: no timer left firing
    import pickle

    assert d.blob is None or not pickle.loads(d.blob)["keys"]  # the windows' state is gone


def test_evictor_keeps_the_last_elements_for_the_window_function():
    out = ["k", "start", "xs"]
    d = _driver(TumblingEventTimeWindows.of(10_000), evictor=CountEvictor.of(2), window_fn=Elements(), out=out)
    d.batch([(1000, "a", 1), (3000, "a", 3), (2000, "a", 2)], watermark=0)
    main, _ = d.batch([], watermark=10_000)
    assert main == [{"k": "a", "start": 0, "xs": [2, 3]}]  # timestamp order within the batch


def test_session_windows_merge_when_a_record_bridges_them():
    d = _driver(EventTimeSessionWindows.with_gap(5000), aggregate=SumX())
    d.batch([(1000, "a", 1), (9000, "a", 2), (30_000, "a", 8)], watermark=0)  # [1000, 6000) [9000, 14000) [30000, 35000)
    d.batch([(5000, "a", 4)], watermark=0)  # [5000, 10000) touches the first two
    main, _ = d.batch([], watermark=10**9)
    assert [(r["window_start"], r["window_end"], r["total"]) for r in main] == [(1000, 14_000, 7), (30_000, 35_000, 8)]


def test_session_count_trigger_merges_its_counts():
    d = _driver(EventTimeSessionWindows.with_gap(5000), CountTrigger.of(3), aggregate=SumX())
    main, _ = d.batch([(1000, "a", 1), (9000, "a", 2)], watermark=0)
    assert main == []  # two sessions of one record each
    main, _ = d.batch([(5000, "a", 4)], watermark=0)  # bridges them: one session of 3 records
    assert [(r["window_start"], r["window_end"], r["total"]) for r in main] == [(1000, 14_000, 7)]


def test_a_trigger_must_return_a_trigger_result():
    class Broken(Trigger):
        def on_element(self, element, timestamp, window, ctx):
            return True

    d = _driver(TumblingEventTimeWindows.of(10_000), Broken(), aggregate=SumX())
    with pytest.raises(UserFunctionError, match="returned True; return a TriggerResult"):
        d.batch([(1000, "a", 1)], watermark=0)


def test_evictors():
    values = [TimestampedValue(x, ts) for x, ts in [(1, 100), (5, 200), (2, 300), (9, 400)]]
    w = TimeWindow(0, 1000)
    assert [v.value for v in CountEvictor.of(2).evict_before(values, w)] == [2, 9]
    assert CountEvictor.of(2, do_evict_after=True).evict_before(values, w) == values
    assert [v.value for v in TimeEvictor.of(150).evict_before(values, w)] == [2, 9]
    assert [v.value for v in DeltaEvictor.of(5, lambda a, b: abs(a - b)).evict_before(values, w)] == [5, 9]


class Router(KeyedProcessFunction):
    ODD = OutputTag("odd", "k string, x bigint")

    def process_element(self, value, ctx):
        if value["x"] % 2:
            ctx.output(self.ODD, {"k": ctx.current_key, "x": value["x"]})
        else:
            yield {"k": ctx.current_key, "x": value["x"]}


def test_process_function_side_output():
    d = BucketDriver(Router(), FIELDS, ["k", "x"], side_outputs={"odd": ["k", "x"]})
    main, sides = d.batch([(1, "a", 1), (2, "a", 2), (3, "b", 3)], watermark=0)
    assert main == [{"k": "a", "x": 2}]
    assert sorted(sides["odd"], key=lambda r: r["x"]) == [{"k": "a", "x": 1}, {"k": "b", "x": 3}]


class _PerElement(WindowOperator):
    process_batch = None  # the runtime then calls process_element for every record


@pytest.mark.parametrize(
    "assigner, trigger",
    [
        (GlobalWindows.create(), PurgingTrigger.of(CountTrigger.of(3))),
        (TumblingEventTimeWindows.of(1000), EventTimeTrigger()),
        (SlidingEventTimeWindows.of(1000, 500), EventTimeTrigger()),
    ],
)
def test_whole_batch_paths_match_the_per_element_path(assigner, trigger):
    """Same output, and state either path can continue from."""
    spec = WindowSpec(assigner=assigner, trigger=trigger, aggregate=SumX(), key_names=("k",), result_fields=("total",))
    batches = [
        ([(t, k, t % 7) for t in range(0, 3000, 130) for k in ("a", "b", "c")], 500),
        ([(t, k, t % 5) for t in range(2400, 5000, 170) for k in ("a", "d")], 2600),
        ([], 10**9),
    ]

    def run(kinds):
        state, rows = None, []
        for (events, wm), kind in zip(batches, kinds):
            d = BucketDriver(kind(spec), FIELDS, OUT)
            d.state = state
            main, _ = d.batch(events, watermark=wm)
            rows += main
            state = d.state
        return sorted(map(str, rows))

    slow = run([_PerElement] * 3)
    assert run([WindowOperator] * 3) == slow
    assert run([WindowOperator, _PerElement, WindowOperator]) == slow
    assert len(slow) > 3


class FlagBig(ProcessWindowFunction):
    BIG = OutputTag("big", "k string, total bigint")

    def process(self, key, context, elements):
        total = sum(e["x"] for e in elements)
        if total > 10:
            context.output(self.BIG, {"k": key, "total": total})
        yield {"k": key, "start": context.window.start, "xs": [e["x"] for e in elements]}


def test_process_window_function_side_output():
    spec = WindowSpec(assigner=TumblingEventTimeWindows.of(1000), trigger=EventTimeTrigger(), window_function=FlagBig(),
                      key_names=("k",))
    d = BucketDriver(WindowOperator(spec), FIELDS, ["k", "start", "xs"], side_outputs={"big": ["k", "total"]})
    d.batch([(100, "a", 5), (200, "a", 7), (300, "b", 1)], watermark=0)
    main, sides = d.batch([], watermark=1000)
    assert sorted((r["k"], r["xs"]) for r in main) == [("a", [5, 7]), ("b", [1])]
    assert sides == {"big": [{"k": "a", "total": 12}]}


class EverySecondAndFinal(Trigger):
    """The trigger docs/windows.md shows for the Yahoo job's output."""

    def on_element(self, element, timestamp, window, ctx):
        ctx.register_event_time_timer(window.max_timestamp)
        ctx.register_processing_time_timer(ctx.current_processing_time // 1000 * 1000 + 1000)
        return TriggerResult.CONTINUE

    def on_processing_time(self, time, window, ctx):
        return TriggerResult.FIRE

    def on_event_time(self, time, window, ctx):
        return TriggerResult.FIRE_AND_PURGE if time == window.max_timestamp else TriggerResult.CONTINUE


def test_docs_trigger_updates_every_second_and_fires_finally_at_the_end():
    d = _driver(TumblingEventTimeWindows.of(10_000), EverySecondAndFinal(), aggregate=SumX())
    main, _ = d.batch([(1000, "a", 1)], watermark=0, now=100)
    assert main == []
    main, _ = d.batch([(2000, "a", 2)], watermark=1000, now=1100)  # the 1 s processing-time timer is due
    assert [r["total"] for r in main] == [1]  # fired before this batch's record
    main, _ = d.batch([(3000, "a", 4)], watermark=2000, now=2050)
    assert [r["total"] for r in main] == [3]
    main, _ = d.batch([], watermark=9999, now=2500)  # watermark passes the end: final, purged
    assert [r["total"] for r in main] == [7]
    main, _ = d.batch([], watermark=20_000, now=5000)  # the leftover update timer finds nothing to fire
    assert main == []


def test_continuous_event_time_trigger_fires_as_the_watermark_advances_and_at_the_end():
    from ember.windowing import ContinuousEventTimeTrigger

    d = _driver(TumblingEventTimeWindows.of(10_000), ContinuousEventTimeTrigger.of(2000), aggregate=SumX())
    d.batch([(500, "a", 1), (2500, "a", 2)], watermark=0)  # next firing at 2000
    main, _ = d.batch([(4500, "a", 4)], watermark=2500)
    assert [r["total"] for r in main] == [3]  # fired at 2000, before 4500 arrived
    main, _ = d.batch([], watermark=4100)
    assert [r["total"] for r in main] == [7]  # fired at 4000
    main, _ = d.batch([], watermark=10_000)
    assert [r["total"] for r in main] == [7, 7, 7]  # at 6000, at 8000 (re-registered, due at once), at the end
