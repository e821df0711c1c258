"""The driver's progress follower counts every batch exactly once (no Spark)."""

import json

from ember.runner.spark.progress import ProgressFollower as _Follower
from ember.time.clock import ManualClock


class _Progress:
    def __init__(self, batch_id, rows):
        self.batchId = batch_id
        self.json = json.dumps({"batchId": batch_id, "numInputRows": rows, "durationMs": {"triggerExecution": 10}})


class _JvmProgress:
    def __init__(self, p):
        self._p = p

    def batchId(self):  # noqa: N802 - the JVM's name
        return self._p.batchId

    def json(self):
        return self._p.json


class _Query:
    def __init__(self, reports):
        self.recentProgress = reports
        self._jsq = self

    def lastProgress(self):  # noqa: N802
        return _JvmProgress(self.recentProgress[-1]) if self.recentProgress else None


def test_a_first_poll_that_sees_a_later_batch_still_counts_the_earlier_ones():
    follower = _Follower(False, "job", ManualClock())
    follower.poll(_Query([_Progress(0, 100_000), _Progress(1, 0)]))  # batch 0 finished before the first poll
    assert follower.events == 100_000 and [p["batchId"] for p in follower.progress] == [0, 1]


def test_batches_are_counted_once_across_polls_and_gaps():
    follower = _Follower(False, "job", ManualClock())
    reports = [_Progress(0, 5)]
    follower.poll(_Query(reports))
    reports += [_Progress(1, 7), _Progress(2, 11)]
    follower.poll(_Query(reports))  # two batches went by between polls
    follower.poll(_Query(reports))  # nothing new
    assert follower.events == 23 and follower.last_batch == 2


# -- batches committed as the query stopped, before Spark reported them ---------------------

def _log(checkpoint, batch, *offsets, committed=True):
    """Spark's offset-log entry of ``batch`` (and its commit)."""
    for folder in ("offsets", "commits"):
        (checkpoint / folder).mkdir(exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0})] + [json.dumps(o) for o in offsets]
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines))
    if committed:
        (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def _generator(n):
    return {"n": n, "origin_ms": 0, "done": False}


def test_a_committed_batch_spark_never_reported_counts_from_its_offsets(tmp_path):
    for b, n in enumerate((1_000, 2_500, 4_000)):
        _log(tmp_path, b, _generator(n), {"ended": 0})
    follower = _Follower(False, "job", ManualClock())
    follower.poll(_Query([_Progress(0, 1_000), _Progress(1, 1_500)]))
    follower.account_unreported(str(tmp_path), -1, 2)
    assert follower.unreported == {2: 1_500} and follower.events == 4_000 and follower.last_batch == 2


def test_redis_offsets_count_per_stream_and_a_previous_run_is_not_counted(tmp_path):
    _log(tmp_path, 4, {"ids": {"a": "1-0", "b": "1-0"}, "read": {"a": 10, "b": 4}, "done": False})
    _log(tmp_path, 5, {"ids": {"a": "9-0", "b": "7-0"}, "read": {"a": 17, "b": 9}, "done": False})
    follower = _Follower(False, "job", ManualClock())
    follower.account_unreported(str(tmp_path), 4, 5)  # batches up to 4: an earlier run's
    assert follower.unreported == {5: 12} and follower.events == 12


def test_an_unreported_batch_of_sparks_rate_micro_batch_counts_its_rows(tmp_path):
    _log(tmp_path, 0, {"offset": 40_000, "timestamp": 1_000})
    _log(tmp_path, 1, {"offset": 80_000, "timestamp": 2_000})
    follower = _Follower(False, "job", ManualClock())
    follower.account_unreported(str(tmp_path), -1, 1)
    assert follower.unreported == {0: 40_000, 1: 40_000} and follower.events == 80_000


def test_an_unreported_batch_of_a_source_without_counts_is_listed_and_said(tmp_path, capsys):
    _log(tmp_path, 0, {"batch": 1, "done": False})
    _log(tmp_path, 1, {"batch": 2, "done": False})
    follower = _Follower(False, "job", ManualClock())
    follower.account_unreported(str(tmp_path), 0, 1)
    assert follower.unreported == {1: None} and follower.events == 0
    assert "batch 1 was committed as the query stopped" in capsys.readouterr().err


def test_settling_keeps_a_committed_unreported_batch_and_drops_an_uncommitted_one(tmp_path):
    from ember import CollectSink
    from ember.runner.spark.execution import settle_output

    for b, n in enumerate((10, 20, 30)):
        _log(tmp_path, b, _generator(n))
    _log(tmp_path, 3, _generator(40), committed=False)  # planned, its sink ran, not committed: replayed on restart
    sink = CollectSink()
    for b in range(4):
        sink.accept_batch(b, 0, [{"batch": b}])
    follower = _Follower(False, "job", ManualClock())
    follower.poll(_Query([_Progress(0, 10), _Progress(1, 10)]))  # batch 2 committed, never reported
    settle_output(follower, [sink], str(tmp_path), -1)
    assert [r["batch"] for r in sink.rows()] == [0, 1, 2]
    assert follower.events == 30


def test_a_benchmark_counts_each_sources_events_of_a_batch_spark_never_reported(tmp_path):
    """A run stopped between a batch's commit and its report: the connect benchmark's oracle
    reads the batch's events per source from the generators' offsets (else its alerts would
    look false: the sink kept them)."""
    from ember.bench.workloads import _read_per_source
    from ember.job import JobResult

    _log(tmp_path, 0, {"n": 100, "origin_ms": 0}, {"n": 2, "origin_ms": 0})
    _log(tmp_path, 1, {"n": 250, "origin_ms": 0}, {"n": 3, "origin_ms": 0})
    reported = [{"batchId": 0, "sources": [{"numInputRows": 100}, {"numInputRows": 2}]}]
    result = JobResult(name="job", checkpoint_dir=str(tmp_path), batches=2, events=105, seconds=1.0,
                       processing_seconds=1.0, progress=reported, stopped_because="duration", unreported_batches=[1])
    assert _read_per_source(result) == [250, 3]
