"""The transformWithState adapter (keyed/tws.py) and the runtime's output timestamps,
without Spark: a fake state handle records what the adapter asks of Spark."""

from __future__ import annotations

import pandas as pd
from bucket_driver import ValueState

from ember.runner.spark.keyed.runtime import output_times
from ember.runner.spark.keyed.tws import BucketProcessor


class FakeHandle:
    def __init__(self):
        self.values = {}
        self.timers: set[int] = set()
        self.calls: list[tuple[str, int]] = []

    def getValueState(self, name, schema):  # noqa: N802 - Spark's name
        return self.values.setdefault(name, ValueState())

    def registerTimer(self, at):  # noqa: N802
        self.timers.add(at)
        self.calls.append(("register", at))

    def deleteTimer(self, at):  # noqa: N802
        self.timers.discard(at)
        self.calls.append(("delete", at))


class Timers:
    def __init__(self, watermark, now=0):
        self.watermark, self.now = watermark, now

    def getCurrentWatermarkInMs(self):  # noqa: N802
        return self.watermark

    def getCurrentProcessingTimeInMs(self):  # noqa: N802
        return self.now


class Expired:
    def __init__(self, at):
        self.at = at

    def getExpiryTimeInMs(self):  # noqa: N802
        return self.at


def bucket_call(timeouts):
    """A bucket function counting its rows in its blob and asking for the next timeout."""
    seen = []

    def call(bucket, frames, state):
        rows = sum(len(f) for f in frames)
        n = (state.get[0] if state.exists else 0) + rows
        state.update((n,))
        seen.append((bucket, rows, n, state.getCurrentWatermarkMs()))
        timeout = timeouts.pop(0)
        if timeout is not None:
            state.setTimeoutTimestamp(timeout)
        yield pd.DataFrame({"n": [n]})

    return call, seen


def test_the_state_blob_and_one_timer_live_in_tws_state():
    call, seen = bucket_call([1500, 1500, None])
    handle = FakeHandle()
    proc = BucketProcessor(call, ["_0"], anchor="anchor")
    proc.init(handle)
    out = list(proc.handleInputRows((7,), iter([pd.DataFrame({"x": [1, 2]})]), Timers(-1)))
    assert seen[-1] == (7, 2, 2, 0)  # no watermark yet: Spark's 0
    assert list(out[0].columns) == ["n", "anchor"] and out[0]["anchor"].isna().all()
    # an event-time timeout t is a timer at t + 1: TWS fires at the watermark, APWS after it
    assert handle.timers == {1501}
    list(proc.handleInputRows((7,), iter([pd.DataFrame({"x": [3]})]), Timers(1000)))
    assert handle.calls == [("register", 1501)]  # the same timeout: nothing to change
    handle.timers.discard(1501)  # Spark drops a timer when it fires it
    list(proc.handleExpiredTimer((7,), Timers(1501), Expired(1501)))
    assert seen[-1] == (7, 0, 3, 1501)
    assert handle.calls == [("register", 1501)] and handle.timers == set()  # the fired one is not deleted again
    assert handle.values["timer"].value is None  # no timeout asked: none registered


def test_a_new_timeout_replaces_the_registered_timer():
    call, _ = bucket_call([1500, 900])
    handle = FakeHandle()
    proc = BucketProcessor(call, ["_0"])
    proc.init(handle)
    list(proc.handleInputRows((1,), iter([pd.DataFrame({"x": [1]})]), Timers(0)))
    list(proc.handleInputRows((1,), iter([pd.DataFrame({"x": [1]})]), Timers(0)))
    assert handle.calls == [("register", 1501), ("delete", 1501), ("register", 901)] and handle.timers == {901}


def test_input_frames_get_their_column_names_back():
    names = []

    def call(bucket, frames, state):
        names.extend(list(f.columns) for f in frames)
        return iter(())

    proc = BucketProcessor(call, ["__ember_bucket", "__ember_rows"])
    proc.init(FakeHandle())
    list(proc.handleInputRows((1,), iter([pd.DataFrame({"_0": [1], "_1": [b"x"]})]), Timers(0)))
    assert names == [["__ember_bucket", "__ember_rows"]]


def test_output_times_take_the_last_mark_at_or_before_each_row():
    marks = [(0, 10), (2, 20), (2, 25), (5, 50)]  # two marks at 2: the later wins
    assert output_times(marks, 7).tolist() == [10, 10, 25, 25, 25, 50, 50]
    assert output_times([], 2).tolist() == [0, 0]
