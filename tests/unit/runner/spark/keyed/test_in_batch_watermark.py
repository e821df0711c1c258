"""A keyed step's in-batch watermark (issue 19 item 3), without Spark: the packing step tells
every state bucket the batch's latest event time, and the bucket function advances its
watermark to it after the batch's records, so windows and timers fire in the batch whose
records close them. Expected firings are spelled out from the watermark rule
(``max(latest - bound, Spark's) - 1``)."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from bucket_driver import BucketDriver, SumX

from ember.functions import KeyedProcessFunction
from ember.runner.spark.keyed.packing import LATEST, PACKED_ROWS, PackSpec, pack_at_source, packer, unpacking
from ember.runner.spark.keyed.reach import Reach
from ember.runner.spark.keyed.windows import MARKER, PARTIAL_ACC, PARTIAL_START, WindowOperator, WindowSpec, make_combiner
from ember.windowing.assigners import TumblingEventTimeWindows
from ember.windowing.triggers import EventTimeTrigger

pytestmark = pytest.mark.usefixtures("state_layout")  # both keyed state layouts (conftest.py)

FIELDS = ["ts", "k", "x"]
OUT = ["k", "window_start", "window_end", "total"]


def _spec(**kwargs):
    return WindowSpec(assigner=TumblingEventTimeWindows.of(10_000), trigger=EventTimeTrigger(), aggregate=SumX(),
                      key_names=("k",), result_fields=("total",), **kwargs)


def _windows(advance_ms):
    return BucketDriver(WindowOperator(_spec()), FIELDS, OUT, advance_ms=advance_ms)


def _totals(rows):
    return sorted((r["k"], r["window_start"], r["total"]) for r in rows)


def test_a_window_fires_in_the_batch_whose_records_close_it():
    d = _windows(advance_ms=1_000)
    assert d.batch([(500, "a", 1), (9_000, "a", 2)]) == ([], {})
    # 11_000 - 1_000 - 1 = 9_999 reaches [0, 10 s)'s last timestamp: fires now, after the record,
    # which itself goes to the next window.
    main, _ = d.batch([(11_000, "a", 4)], watermark=7_999)
    assert _totals(main) == [("a", 0, 3)]
    main, _ = d.batch([], watermark=9_999)  # Spark's watermark catches up next batch: nothing twice
    assert main == []


def test_without_the_advance_the_same_window_waits_for_the_next_batch():
    d = _windows(advance_ms=None)
    d.batch([(500, "a", 1), (9_000, "a", 2)])
    main, _ = d.batch([(11_000, "a", 4)], watermark=7_999)
    assert main == []
    main, _ = d.batch([], watermark=9_999)
    assert _totals(main) == [("a", 0, 3)]


def test_one_ms_short_of_the_end_does_not_fire():
    d = _windows(advance_ms=1_000)
    d.batch([(500, "a", 1)])
    main, _ = d.batch([(10_999, "a", 4)], watermark=None)  # watermark 9_998 < 9_999
    assert main == []


def test_records_of_the_batch_are_judged_by_the_watermark_before_it():
    # 9_500 is not late when its batch starts (watermark 7_999) though the batch's latest record
    # moves the watermark past its window: it is counted in, then the window fires.
    d = _windows(advance_ms=1_000)
    d.batch([(500, "a", 1)])
    main, _ = d.batch([(12_000, "a", 4), (9_500, "a", 10)], watermark=7_999)
    assert _totals(main) == [("a", 0, 11)]


def test_a_bucket_without_records_fires_on_the_latest_time_the_packing_tells_it():
    d = _windows(advance_ms=1_000)
    d.batch([(500, "a", 1)])
    main, _ = d.batch([], watermark=None, latest=11_000)
    assert _totals(main) == [("a", 0, 1)]
    assert d.updates == 1  # the fired window's state is gone: written


def test_a_bucket_told_only_the_time_with_nothing_due_writes_no_state():
    d = _windows(advance_ms=1_000)
    d.batch([(500, "a", 1)])
    blob = d.blob
    main, _ = d.batch([], watermark=None, latest=5_000)
    assert main == [] and d.updates == 0 and d.blob == blob
    assert d.timeout_at == 9_999  # Spark still calls it back for its window


class TimerAfter(KeyedProcessFunction):
    def process_element(self, value, ctx):
        ctx.register_event_time_timer(value["ts"] + 500)

    def on_timer(self, timestamp, ctx):
        yield {"k": ctx.current_key, "at": timestamp, "wm": ctx.current_watermark}


def test_timers_fire_after_the_records_under_the_advanced_watermark():
    d = BucketDriver(TimerAfter(), FIELDS, ["k", "at", "wm"], advance_ms=1_000)
    main, _ = d.batch([(1_000, "a", 1), (3_000, "b", 1)])
    assert main == [{"k": "a", "at": 1_500, "wm": 1_999}]  # 3_000 - 1_000 - 1
    main, _ = d.batch([(2_000, "a", 1)], watermark=1_999)  # 2_500 > 1_999: waits
    assert main == []
    main, _ = d.batch([], watermark=1_999, latest=4_000)
    assert sorted((r["k"], r["at"]) for r in main) == [("a", 2_500)]


def test_the_watermark_never_goes_back_behind_sparks():
    d = BucketDriver(TimerAfter(), FIELDS, ["k", "at", "wm"], advance_ms=1_000)
    # Spark's watermark (13_999) is ahead of what this batch's latest time (5_000) would make.
    main, _ = d.batch([(12_000, "b", 1)], watermark=13_999, latest=5_000)
    assert main == [{"k": "b", "at": 12_500, "wm": 13_999}]


def test_the_packer_tells_every_bucket_the_partitions_latest_time():
    batch = pa.RecordBatch.from_pydict({"b": pa.array([3, 1, 3], pa.int32()), "ts": [10, 70, 40], "k": ["x", "y", "x"]})
    rows = pa.Table.from_batches(list(packer("b", (), "ts", Reach(5))(iter([batch])))).to_pylist()
    assert sorted(r["b"] for r in rows) == [0, 1, 2, 3, 4]
    assert {r[LATEST] for r in rows} == {70}
    blobs = {r["b"]: r[PACKED_ROWS] for r in rows}
    assert {b for b, blob in blobs.items() if blob} == {1, 3}
    assert pa.ipc.open_stream(blobs[3]).read_all().column("ts").to_pylist() == [10, 40]


def test_without_every_bucket_the_packer_sends_only_buckets_with_records():
    batch = pa.RecordBatch.from_pydict({"b": pa.array([3, 1], pa.int32()), "k": ["x", "y"]})
    rows = pa.Table.from_batches(list(packer("b", ())(iter([batch])))).to_pylist()
    assert sorted(r["b"] for r in rows) == [1, 3] and LATEST not in rows[0]


def test_a_fused_source_tells_every_bucket_too():
    spec = PackSpec(("k",), ("bigint",), 4, "bucket", "ts", "__time", every_bucket=True)
    batch = pa.RecordBatch.from_pydict({"k": pa.array([1, 2, 3], pa.int64()), "ts": pa.array([5, 9, 7], pa.int64())})
    rows = pa.Table.from_batches(list(pack_at_source(iter([batch]), spec))).to_pylist()
    assert sorted(r["bucket"] for r in rows) == [0, 1, 2, 3] and {r["ts"] for r in rows} == {9}


def test_unpacking_hands_the_latest_time_and_only_real_rows():
    batch = pa.RecordBatch.from_pydict({"b": pa.array([0, 0], pa.int32()), "ts": [10, 20]})
    packed = pa.Table.from_batches(list(packer("b", (), "ts", Reach(3))(iter([batch])))).to_pandas()
    seen = {}

    def run(key, frames, state, latest):
        seen["rows"] = [len(f) for f in frames]
        seen["latest"] = latest
        return iter([])

    unpacking(run, LATEST)(0, iter([packed[packed["b"] == 2]]), None)  # a bucket told only the time
    assert seen == {"rows": [], "latest": 20}
    unpacking(run, LATEST)(0, iter([packed[packed["b"] == 0]]), None)
    assert seen == {"rows": [2], "latest": 20}


def test_the_combiner_adds_one_marker_per_bucket_that_the_window_step_skips():
    spec = _spec()
    combine = make_combiner(spec, FIELDS, ("k",), "ts", reach=Reach(3))
    batch = pa.RecordBatch.from_pydict({"ts": pa.array([1_000, 4_000, 12_000], pa.int64()), "k": ["a", "a", "b"],
                                        "x": [1, 2, 4]})
    rows = pa.Table.from_batches(list(combine(iter([batch])))).to_pylist()
    partials = [r for r in rows if r[MARKER] is None]
    markers = [r for r in rows if r[MARKER] is not None]
    assert sorted((r["k"], r[PARTIAL_START], pickle.loads(r[PARTIAL_ACC])) for r in partials) == [("a", 0, 3), ("b", 10_000, 4)]
    # a partial's time is its latest record's (what the watermark would have seen), not its window's start
    assert sorted(int(r["ts"].timestamp() * 1000) for r in partials) == [4_000, 12_000]
    assert sorted(r[MARKER] for r in markers) == [0, 1, 2]
    assert {int(r["ts"].timestamp() * 1000) for r in markers} == {12_000} and all(r[PARTIAL_ACC] is None for r in markers)
