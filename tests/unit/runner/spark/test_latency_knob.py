"""The latency-target knob: the per-batch bound follows the batches' duration (no Spark)."""

from types import SimpleNamespace

from pyspark.sql.streaming.datasource import ReadMaxRows

from ember.runner.spark.checkpoint import admission_bound
from ember.runner.spark.datasources import SequenceReader
from ember.runner.spark.latency import BELOW_FLOOR, FLOOR_BATCHES, MIN_BOUND, BoundController


def _report(batch, events, ms):
    return {"batchId": batch, "numInputRows": events, "durationMs": {"triggerExecution": ms}}


def _bound(path):
    return int(open(path).read())


def test_slow_batches_shrink_the_bound_and_the_sources_read_it(tmp_path):
    path = str(tmp_path / "batch-bound")
    knob = BoundController(200, 2_000_000, path, start_bound=100_000)
    assert _bound(path) == 100_000
    knob.observe(_report(0, 100_000, 5_000))  # a run's first batch starts workers: not the bound's doing
    assert knob.bound == 100_000
    knob.observe(_report(1, 100_000, 900))  # goal 90 ms: far too slow -> at most halved
    assert knob.bound == 50_000 and _bound(path) == 50_000
    for b in range(2, 30):
        knob.observe(_report(b, knob.bound, 30 + knob.bound / 1_000))  # 30 ms fixed + 1 ms per 1,000 events
    assert 40_000 <= knob.bound <= 70_000  # settles where the batch takes about the goal (60 k: 90 ms)
    assert admission_bound({"bound_file": path}, 2_000_000) == knob.bound
    assert admission_bound({"bound_file": path}, 10_000) == 10_000  # never above the source's own bound
    assert admission_bound({"bound_file": ""}, 10_000) == 10_000


def test_fast_batches_grow_the_bound_only_while_it_limits_them(tmp_path):
    path = str(tmp_path / "batch-bound")
    knob = BoundController(1_000, 300_000, path, start_bound=20_000)
    knob.observe(_report(0, 5_000, 50))  # the input, not the bound, limited this batch: no change
    assert knob.bound == 20_000
    for b in range(1, 20):
        knob.observe(_report(b, knob.bound, 50))
    assert knob.bound == 300_000 and _bound(path) == 300_000  # up to max_events_per_batch, not past it


def test_a_target_below_the_floor_stops_the_job_naming_the_floor(tmp_path):
    path = str(tmp_path / "batch-bound")
    knob = BoundController(20, 2_000_000, path, start_bound=MIN_BOUND)
    follower = SimpleNamespace(progress=[])
    view = SimpleNamespace(follower=follower)
    for b in range(FLOOR_BATCHES):  # (the first is the run's start-up)
        follower.progress.append(_report(b, MIN_BOUND, 120))
        assert knob.check(view) is None
    follower.progress.append(_report(FLOOR_BATCHES, MIN_BOUND, 120))
    assert knob.check(view) == BELOW_FLOOR
    message = knob.floor_message()
    assert "latency target 20 ms" in message and "120 ms" in message and "267 ms" in message


def test_the_generator_admits_no_more_than_the_bound_file_says(tmp_path):
    path = tmp_path / "batch-bound"
    path.write_text("7000")
    reader = SequenceReader({"spec": '{"max_events_per_batch": 50000, "partitions": 2}', "origin_file": "",
                             "bound_file": str(path)})
    end = reader.latestOffset({"n": 1_000, "origin_ms": 0, "done": False}, ReadMaxRows(50_000))
    assert end["n"] == 8_000
