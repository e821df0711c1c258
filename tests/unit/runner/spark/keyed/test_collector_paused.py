"""A keyed step's bucket call runs with Python's cyclic garbage collector paused
(bucket.collector_paused: its records' containers are not traversed again and again while
the call holds them), and the collector is as it was once the call is over — also when
the user's function raises, and when it was off before the call."""

from __future__ import annotations

import gc

import pytest
from bucket_driver import BucketDriver

from ember.errors import UserFunctionError
from ember.functions import KeyedProcessFunction

FIELDS = ["ts", "k", "x"]


class SeesCollector(KeyedProcessFunction):
    """Notes whether the collector runs while each record and timer is handled; raises on x < 0."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def process_element(self, value, ctx):
        self.seen.append(gc.isenabled())
        if value["x"] < 0:
            raise ValueError("negative")
        ctx.register_event_time_timer(value["ts"] + 10)
        yield {"k": value["k"]}

    def on_timer(self, timestamp, ctx):
        self.seen.append(gc.isenabled())
        yield {"k": ctx.current_key}


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_collector_is_paused_during_a_call_and_running_after_it(collector_on):
    fn = SeesCollector()
    driver = BucketDriver(fn, FIELDS, ["k"])
    main, _ = driver.batch([(1, "a", 1), (2, "b", 2)])
    assert [r["k"] for r in main] == ["a", "b"]
    main, _ = driver.batch([(30, "a", 3)], watermark=20)  # fires both timers, then takes the record
    assert sorted(r["k"] for r in main) == ["a", "a", "b"]
    assert fn.seen == [False] * 5
    assert gc.isenabled()


def test_the_collector_runs_again_after_a_call_that_failed(collector_on):
    driver = BucketDriver(SeesCollector(), FIELDS, ["k"])
    with pytest.raises(UserFunctionError, match="negative"):
        driver.batch([(1, "a", -1)])
    assert gc.isenabled()


def test_a_collector_switched_off_before_the_call_stays_off():
    was = gc.isenabled()
    gc.disable()
    try:
        fn = SeesCollector()
        BucketDriver(fn, FIELDS, ["k"]).batch([(1, "a", 1)])
        assert fn.seen == [False]
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()
