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
