"""Timer queues on the delta layout (keyed/delta.py ``SlotTable.timers``): kept beside the
working copy, never in the checkpointed blob, rebuilt from the keys' slots whenever the
copy has none at its version. Checked against the blob layout, which keeps the queues in
its checkpointed blob (and is itself tested against Flink's model elsewhere)."""

from __future__ import annotations

import heapq
import os
import pickle
import shutil

import bucket_driver
import numpy as np
import pytest
from bucket_driver import BucketDriver

from ember.functions import KeyedProcessFunction
from ember.runner.spark.keyed import delta
from ember.runner.spark.keyed.runtime import EVENT_TIMERS, PROCESSING_TIMERS
from ember.state import ValueStateDescriptor


class Sessions(KeyedProcessFunction):
    """Per key a count and a session timer ``gap`` ms after its latest record (the previous
    one deleted); when it fires, the session's (key, count, timer) and the state is cleared.
    Every third record also sets a processing-time timer, which emits (key, -1, timer). Int
    keys count until a processing-time timer 5 ms after each record, then emit and clear."""

    def __init__(self, gap: int) -> None:
        self.gap = gap

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count"))
        self.timer = ctx.get_state(ValueStateDescriptor("timer"))

    def process_element(self, value, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        if str(value["k"]).startswith("quiet"):  # a count only: a call may change slots but not the queues
            return ()
        if isinstance(value["k"], int):  # int keys: processing time only (a slot with no event timer)
            ctx.register_processing_time_timer(ctx.current_processing_time + 5)
            return ()
        old = self.timer.value()
        if old is not None:
            ctx.delete_event_time_timer(old)
        at = value["ts"] + self.gap
        ctx.register_event_time_timer(at)
        self.timer.update(at)
        if n % 3 == 0:
            ctx.register_processing_time_timer(ctx.current_processing_time + 5)
        return ()

    def on_timer(self, timestamp, ctx):
        if ctx.time_domain == "processing_time" and isinstance(ctx.current_key, int):
            if self.count.value() is None:  # (an earlier timer of the key emitted its count)
                return ()
            out = [{"k": ctx.current_key, "n": self.count.value(), "at": timestamp}]
            self.count.clear()
            return out
        if ctx.time_domain == "processing_time":
            return [{"k": ctx.current_key, "n": -1, "at": timestamp}]
        out = [{"k": ctx.current_key, "n": self.count.value(), "at": timestamp}]
        self.count.clear()
        self.timer.clear()
        return out


def drivers(monkeypatch, tmp_path):
    made = {}
    for layout in ("blob", "delta"):
        monkeypatch.setattr(bucket_driver, "LAYOUT", (layout, str(tmp_path / "local" / layout)))
        made[layout] = BucketDriver(Sessions(gap=40), ["k", "ts"], ["k", "n", "at"], every_batch=True)
    return made["blob"], made["delta"]


def _order(row: dict) -> tuple:
    return str(row["k"]), row["n"], row["at"]


def disturb(directory: str, how: str) -> None:
    """What may happen to a working copy between calls."""
    timers, vouched = os.path.join(directory, "timers.pkl"), os.path.join(directory, "timers.tag")
    log = os.path.join(directory, "timers.log")
    if how == "log lost" and os.path.exists(log):
        os.unlink(log)
    elif how == "log cut short" and os.path.exists(log) and os.path.getsize(log):
        with open(log, "r+b") as f:
            f.truncate(os.path.getsize(log) - 1)
    elif how == "log grown":  # (a call that failed after appending its frame, before its tag line)
        with open(log, "ab") as f:
            f.write(pickle.dumps(("another stamp", [(0, 10**9, "ghost")], [], [], [])))
    elif how == "queues lost" and os.path.exists(timers):
        os.unlink(timers)
    elif how == "tag lost" and os.path.exists(vouched):
        os.unlink(vouched)
    elif how == "queues cut short" and os.path.exists(timers):
        with open(timers, "r+b") as f:
            f.truncate(max(1, os.path.getsize(timers) // 2))
    elif how == "copy lost":
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("collide", [False, True], ids=["real-hash", "colliding-hash"])
def test_timers_fire_as_on_the_blob_layout_across_lost_and_stale_queues(monkeypatch, tmp_path, collide):
    if collide:  # nearly every key shares its hash with another: their slots (and timers) in the overflow
        real = delta.key_hashes
        monkeypatch.setattr(delta, "key_hashes", lambda keys: real(keys) % 3)
    blob, dl = drivers(monkeypatch, tmp_path)
    rng = np.random.default_rng(4)
    keys = [f"user-{i}" for i in range(25)] + list(range(10)) + [f"quiet-{i}" for i in range(30)]
    ways = ["kept"] * 6 + ["queues lost", "queues cut short", "tag lost", "copy lost", "log lost", "log cut short", "log grown"]
    ts, fired, disturbed = 0, 0, set()
    for batch in range(90):
        rows = [(keys[int(i)], ts + int(rng.integers(0, 20))) for i in rng.integers(0, len(keys), int(rng.integers(0, 12)))]
        ts += 15
        watermark, now = ts - 30, batch * 4
        expected, _ = blob.batch(rows, watermark=watermark, now=now)
        got, _ = dl.batch(rows, watermark=watermark, now=now)
        assert sorted(got, key=_order) == sorted(expected, key=_order), batch
        fired += len(expected)
        how = ways[int(rng.integers(0, len(ways)))]
        disturb(dl.directory, how)
        disturbed.add(how)
    assert fired > 50 and disturbed == set(ways), "too few timers fired or disturbances tried: the test tests little"
    meta = pickle.loads(dl.blob)
    assert meta[EVENT_TIMERS] == [] and meta[PROCESSING_TIMERS] == []  # never checkpointed
    assert pickle.loads(blob.blob)[EVENT_TIMERS], "no timer waits at the end: the last check tests little"
    if collide:
        assert meta[delta.OVERFLOW], "no key collided: the test does not test collisions"


def test_the_checkpointed_blob_does_not_grow_with_waiting_timers(monkeypatch, tmp_path):
    """A thousand keys each with a timer: the blob layout's checkpointed value holds the
    queue; the delta layout's only the log's version and counters, and a batch touching one
    key appends one key's slot to the log."""
    blob, dl = drivers(monkeypatch, tmp_path)
    rows = [(f"k{k}", 1000 + k) for k in range(1000)]
    blob.batch(rows, watermark=0)
    dl.batch(rows, watermark=0)
    assert len(blob.blob) > 10_000
    assert len(dl.blob) < 400
    appended = dl.parts.appends[-1]
    dl.batch([("k5", 1001)], watermark=0)
    assert len(dl.blob) < 400 and dl.parts.appends[-1] < appended / 100
    shutil.rmtree(dl.directory)  # the queue is rebuilt from the slots: every timer still fires
    got, _ = dl.batch([], watermark=10_000)
    assert sorted(r["k"] for r in got) == sorted(f"k{k}" for k in range(1000))


def test_a_call_appends_its_timer_changes_to_the_log_and_a_long_log_is_folded_in(monkeypatch, tmp_path):
    """Issue 18: a call that sets or fires timers appends what it pushed and popped to
    ``timers.log`` instead of rewriting the bucket's whole queue file; once the log outgrows
    that file it is written whole again (with an empty log). Every timer fires as on the
    blob layout throughout."""
    monkeypatch.setattr(delta.SlotTable, "TIMER_LOG_MIN", 0)  # fold by the queue file's size alone
    blob, dl = drivers(monkeypatch, tmp_path)
    keys = [f"user-{i}" for i in range(400)]
    first = [(k, 1_000 + i) for i, k in enumerate(keys)]
    for driver in (blob, dl):
        driver.batch(first, watermark=0)
    queues = os.path.join(dl.directory, "timers.pkl")
    whole, log = os.stat(queues).st_mtime_ns, []
    rng = np.random.default_rng(7)
    ts, fired, folded = 1_500, 0, 0
    for batch in range(40):
        rows = [(keys[int(i)], ts + int(rng.integers(0, 20))) for i in rng.integers(0, len(keys), 8)]
        ts += 15
        expected, _ = blob.batch(rows, watermark=ts - 60)
        got, _ = dl.batch(rows, watermark=ts - 60)
        assert sorted(got, key=_order) == sorted(expected, key=_order), batch
        fired += len(expected)
        _tag, _boot, stamp, logged, waiting, *_ = open(os.path.join(dl.directory, "timers.tag")).read().split(" ")
        on_blob = pickle.loads(blob.blob)[EVENT_TIMERS]
        assert int(waiting) == len(on_blob), batch  # fired ones gone (deleted ones wait as there)
        event, _processing = delta.SlotTable(dl.directory)._read_timers(stamp, int(logged))  # as the next call reads them
        assert sorted(event) == sorted(on_blob), batch
        size = os.path.getsize(os.path.join(dl.directory, "timers.log"))
        stamp = os.stat(queues).st_mtime_ns
        if stamp != whole:
            folded += 1
            assert size == 0, "a queue file written whole starts an empty log"
            whole = stamp
        log.append(size)
    assert fired > 100 and max(log) > 0, "no timer fired or nothing logged: the test tests little"
    assert 1 <= folded < 20, f"written whole {folded} times in 40 calls: the log is not used, or never folded in"
    shutil.rmtree(dl.directory)  # everything still waiting fires, from the slots
    expected, _ = blob.batch([], watermark=10**9)
    got, _ = dl.batch([], watermark=10**9)
    assert sorted(got, key=_order) == sorted(expected, key=_order) and expected


def test_queues_read_back_from_the_file_and_its_log_equal_the_queues_written(tmp_path):
    """``SlotTable.timers`` reads what ``store_timers`` wrote: a whole file, then frames of
    pushed entries and popped sequence numbers — popped the heap's smallest (as a call pops)
    or not (removed all the same)."""
    table = delta.SlotTable(str(tmp_path / "bucket"))
    event = [(10, 1, "a"), (20, 2, "b"), (30, 3, "c")]
    table.store_timers("v1", list(event), [(5, 4, "p")], rewrite=True)

    def read(tag):
        queues = table.timers(tag, lambda: pytest.fail("rebuilt: the file or the log was not read back"))
        return [q.load() for q in queues]

    ev, pr = read("v1")
    assert sorted(ev) == event and pr == [(5, 4, "p")]
    heapq.heappush(ev, (15, 5, "d"))
    ev.pushed.append((15, 5, "d"))
    for _ in range(2):  # (10, a) and (15, d): the smallest after the push
        ev.popped.append(heapq.heappop(ev)[1])
    table.store_timers("v2", ev, pr, rewrite=True)
    ev, pr = read("v2")
    assert sorted(ev) == [(20, 2, "b"), (30, 3, "c")] and pr == [(5, 4, "p")]
    ev.remove((30, 3, "c"))  # not the smallest
    heapq.heapify(ev)
    ev.popped.append(3)
    pr.pushed.append((7, 6, "q"))
    heapq.heappush(pr, (7, 6, "q"))
    table.store_timers("v3", ev, pr, rewrite=True)
    assert os.path.getsize(tmp_path / "bucket" / "timers.log") > 0, "written whole: the log is not tested"
    ev, pr = read("v3")
    assert ev == [(20, 2, "b")] and sorted(pr) == [(5, 4, "p"), (7, 6, "q")]
    assert table.timers("v2", lambda: None) is None  # the tag vouches for v3 only
