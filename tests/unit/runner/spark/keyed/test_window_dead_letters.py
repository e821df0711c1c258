"""``window(...).aggregate(fn, ..., dead_letter=tag)`` / ``.reduce(fn, dead_letter=tag)``: a record
the function raises on becomes a dead letter (``raw``: the record as JSON) and goes into no
window; every window's result is the one over the other records (computed here by hand).
Driven through the window operator without Spark (bucket_driver)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from bucket_driver import BucketDriver, SumX

from ember import Agg, OutputTag, ScriptedSource, StreamEnvironment, WatermarkStrategy
from ember.errors import PipelineError, UserFunctionError
from ember.functions import AggregateFunction, ProcessWindowFunction
from ember.runner.spark.keyed.windows import WindowOperator, WindowSpec
from ember.runner.spark.keyed.windows.spec import WindowPath
from ember.windowing.assigners import SlidingEventTimeWindows, TumblingEventTimeWindows
from ember.windowing.triggers import EventTimeTrigger

pytestmark = pytest.mark.usefixtures("state_layout")  # both keyed state layouts (conftest.py)

FIELDS = ["ts", "k", "x"]
OUT = ["k", "window_start", "window_end", "total"]


class Inverses(AggregateFunction):
    """The sum of 60 // x: x = 0 raises (ZeroDivisionError), a negative x too (ValueError)."""

    def create_accumulator(self):
        return 0

    def add(self, value, acc):
        if value["x"] < 0:
            raise ValueError(f"negative x: {value['x']}")
        return acc + 60 // value["x"]

    def merge(self, a, b):
        return a + b

    def get_result(self, acc):
        return acc


def _driver(assigner, *, aggregate=None, reduce=None, window_fn=None, out=None, dead_letter="bad", sides=None):
    spec = WindowSpec(assigner=assigner, trigger=EventTimeTrigger(), aggregate=aggregate, reduce=reduce,
                      window_function=window_fn, key_names=("k",), result_fields=("total",), step="w",
                      dead_letter=dead_letter)
    out = out or (OUT if aggregate is not None else [*FIELDS, "window_start", "window_end"])
    sides = {**(sides or {}), **({"bad": ["raw", "error"]} if dead_letter else {})}
    return BucketDriver(WindowOperator(spec), FIELDS, out, side_outputs=sides), spec


BATCHES = [
    [(1, "a", 2), (3, "a", 0), (4, "b", 5), (7, "a", 3)],
    [(11, "a", 4), (12, "b", -1), (14, "b", 6), (19, "a", 0)],
    [(22, "b", 1), (25, "a", 10)],
]


def _run(driver):
    """Main rows and the dead letters over BATCHES, then the end of input; ``driver.seen``: the
    rows of side output "seen" (when declared)."""
    main, rows = [], {"bad": [], "seen": []}
    behind = [None] + [max(ts for ts, _, _ in batch) - 1 for batch in BATCHES[:-1]]  # each batch's watermark
    for batch, watermark in [*zip(BATCHES, behind), ([], 10 ** 6)]:  # then the end of input: past every window
        m, sides = driver.batch(batch, watermark=watermark)
        main += m
        for tag in rows:
            rows[tag] += sides.get(tag, [])
    driver.seen = rows["seen"]
    return main, rows["bad"]


def test_records_add_raises_on_are_dead_letters_and_go_into_no_window():
    driver, spec = _driver(SlidingEventTimeWindows.of(10, 5), aggregate=Inverses())
    assert spec.path is WindowPath.ELEMENT and not spec.combinable  # each record's add on its own
    main, bad = _run(driver)
    expected = defaultdict(int)
    for ts, k, x in (r for b in BATCHES for r in b):
        if x > 0:
            for start in (ts - ts % 5 - 5, ts - ts % 5):
                if start + 10 > ts >= start:
                    expected[(k, start)] += 60 // x
    assert sorted((r["k"], r["window_start"], r["total"]) for r in main) == sorted((k, s, t) for (k, s), t in expected.items())
    assert sorted(json.loads(r["raw"])["ts"] for r in bad) == [3, 12, 19]  # each once, though in two windows
    errors = {json.loads(r["raw"])["ts"]: r["error"] for r in bad}
    assert errors[3] == "step 'w': add raised ZeroDivisionError: integer division or modulo by zero"
    assert errors[12] == "step 'w': add raised ValueError: negative x: -1"


def test_a_record_reduce_raises_on_is_a_dead_letter():
    def biggest(a, b):  # b: the record being added
        if b["x"] == 0:
            raise ValueError("zero")
        return a if a["x"] >= b["x"] else b

    driver, _ = _driver(TumblingEventTimeWindows.of(10), reduce=biggest)
    main, bad = _run(driver)
    assert sorted((r["k"], r["window_start"], r["x"]) for r in main) == [("a", 0, 3), ("a", 10, 4), ("a", 20, 10),
                                                                         ("b", 0, 5), ("b", 10, 6), ("b", 20, 1)]
    assert sorted(json.loads(r["raw"])["ts"] for r in bad) == [3, 19]
    assert {r["error"] for r in bad} == {"step 'w': reduce raised ValueError: zero"}


class Ratio(ProcessWindowFunction):
    """Per window: its first x over its count of zeros — a generator whose first row comes before
    the division, and a side output before that; a window without zeros raises."""

    def process(self, key, context, elements):
        context.output(SEEN, {"k": key, "start": context.window.start})
        yield {"k": key, "start": context.window.start, "r": -1}
        yield {"k": key, "start": context.window.start, "r": elements[0]["x"] // sum(1 for e in elements if e["x"] == 0)}


SEEN = OutputTag("seen", "k string, start bigint")


def test_a_window_its_function_raises_on_is_a_dead_letter_and_emits_nothing():
    spec_out = ["k", "start", "r"]
    driver, _ = _driver(TumblingEventTimeWindows.of(10), window_fn=Ratio(), out=spec_out, sides={"seen": ["k", "start"]})
    main, bad = _run(driver)
    zeros = {("a", 0), ("a", 10)}  # the windows holding a zero: a's [0, 10) and [10, 20)
    assert sorted((r["k"], r["start"], r["r"]) for r in main) == [("a", 0, -1), ("a", 0, 2), ("a", 10, -1), ("a", 10, 4)]
    assert sorted((json.loads(r["raw"])["key"], json.loads(r["raw"])["window_start"]) for r in bad) == sorted(
        {("a", 20), ("b", 0), ("b", 10), ("b", 20)} - zeros)
    assert {r["error"] for r in bad} == {"step 'w': process raised ZeroDivisionError: integer division or modulo by zero"}
    assert sorted((r["k"], r["start"]) for r in driver.seen) == sorted(zeros)  # the failed windows' side outputs discarded


def test_without_a_dead_letter_tag_the_record_fails_the_step():
    driver, _ = _driver(TumblingEventTimeWindows.of(10), aggregate=Inverses(), dead_letter=None)
    with pytest.raises(UserFunctionError, match="step 'w': add raised ZeroDivisionError"):
        _run(driver)


def test_dead_letters_are_for_python_functions():
    env = StreamEnvironment()
    keyed = env.from_source(ScriptedSource([[]], "ts bigint, k string, x int"), WatermarkStrategy.for_monotonous_timestamps("ts"),
                            name="in").key_by("k")
    windowed = keyed.window(TumblingEventTimeWindows.of(10))
    with pytest.raises(PipelineError, match="dead_letter is for a Python AggregateFunction"):
        windowed.aggregate(dead_letter=OutputTag("bad"), n=Agg.count())
    step = windowed.aggregate(Inverses(), output_schema="total int", dead_letter=OutputTag("bad"), name="w")
    assert step.node.dead_letter == OutputTag("bad") and "failures -> 'bad'" in step.node.describe()


class Listed(ProcessWindowFunction):
    """The window's records' x values, in order (the window keeps its elements)."""

    def process(self, key, context, elements):
        yield {"k": key, "window_start": context.window.start, "xs": ",".join(str(e["x"]) for e in elements)}


class Touchy(EventTimeTrigger):
    """Fires at the window's end — but raises on a record with x == 3, and when [10, 20) ends."""

    def on_element(self, element, timestamp, window, ctx):
        result = super().on_element(element, timestamp, window, ctx)  # (its timer stays registered)
        if element["x"] == 3:
            raise ValueError("three")
        return result

    def on_event_time(self, time, window, ctx):
        if window.start == 10:
            raise RuntimeError("ten")
        return super().on_event_time(time, window, ctx)


@pytest.mark.parametrize("kind", ["aggregate", "elements"])
def test_a_trigger_that_raises_makes_the_record_or_the_window_a_dead_letter(kind):
    """A record the trigger's on_element raises on is taken back out of its window; a window
    its on_event_time raises for emits nothing; both become dead letters, every other window's
    result is the one over its records."""
    spec = WindowSpec(assigner=TumblingEventTimeWindows.of(10), trigger=Touchy(), key_names=("k",), step="w",
                      result_fields=("total",), dead_letter="bad",
                      **({"aggregate": SumX()} if kind == "aggregate" else {"window_function": Listed()}))
    out = OUT if kind == "aggregate" else ["k", "window_start", "xs"]
    main, bad = _run(BucketDriver(WindowOperator(spec), FIELDS, out, side_outputs={"bad": ["raw", "error"]}))
    kept = defaultdict(list)
    for ts, k, x in (r for b in BATCHES for r in b):
        if x != 3 and ts - ts % 10 != 10:
            kept[(k, ts - ts % 10)].append(x)
    if kind == "aggregate":
        assert sorted((r["k"], r["window_start"], r["total"]) for r in main) == sorted((k, s, sum(xs)) for (k, s), xs in kept.items())
    else:
        assert sorted((r["k"], r["window_start"], r["xs"]) for r in main) == sorted(
            (k, s, ",".join(map(str, xs))) for (k, s), xs in kept.items())
    records = [json.loads(r["raw"]) for r in bad if "ts" in json.loads(r["raw"])]
    windows = sorted((w["key"], w["window_start"]) for w in (json.loads(r["raw"]) for r in bad) if "key" in w)
    assert [(r["ts"], r["k"], r["x"]) for r in records] == [(7, "a", 3)] and windows == [("a", 10), ("b", 10)]
    assert {r["error"] for r in bad} == {"step 'w': trigger Touchy.on_element raised ValueError: three",
                                         "step 'w': trigger Touchy.on_event_time raised RuntimeError: ten"}


def test_without_a_dead_letter_tag_a_raising_trigger_fails_the_step():
    spec = WindowSpec(assigner=TumblingEventTimeWindows.of(10), trigger=Touchy(), aggregate=SumX(), key_names=("k",),
                      result_fields=("total",), step="w")
    with pytest.raises(UserFunctionError, match=r"step 'w': trigger Touchy.on_element raised ValueError: three"):
        _run(BucketDriver(WindowOperator(spec), FIELDS, OUT))


class Wary(EventTimeTrigger):
    """Event-time firing; merging sessions into one longer than 10 ms raises."""

    def on_merge(self, window, ctx):
        if window.end - window.start > 10:
            raise ValueError(f"session {window.start}-{window.end} too long")
        super().on_merge(window, ctx)


def test_a_record_whose_session_merge_raises_is_a_dead_letter_and_the_sessions_stay_as_they_were():
    from ember.windowing.assigners import EventTimeSessionWindows

    spec = WindowSpec(assigner=EventTimeSessionWindows.with_gap(5), trigger=Wary(), aggregate=SumX(), key_names=("k",),
                      result_fields=("total",), step="w", dead_letter="bad")
    driver = BucketDriver(WindowOperator(spec), FIELDS, OUT, side_outputs={"bad": ["raw", "error"]})
    main, bad = [], []
    batches = [[(1, "a", 1), (2, "b", 5), (4, "a", 2)], [(8, "a", 3)], [(30, "a", 4)]]
    for batch, watermark in [(batches[0], None), (batches[1], 0), (batches[2], 0), ([], 10 ** 6)]:
        m, sides = driver.batch(batch, watermark=watermark)
        main, bad = main + m, bad + sides.get("bad", [])
    # a's [1, 9) would have become [1, 13) with the record at 8: that record is the dead letter
    assert sorted((r["k"], r["window_start"], r["window_end"], r["total"]) for r in main) == [
        ("a", 1, 9, 3), ("a", 30, 35, 4), ("b", 2, 7, 5)]
    assert [json.loads(r["raw"])["ts"] for r in bad] == [8]
    assert bad[0]["error"] == "step 'w': trigger Wary.on_merge raised ValueError: session 1-13 too long"
