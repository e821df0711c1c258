"""Which buckets a batch's packing reaches (keyed/reach.py): quiet marks believed only from an
earlier batch of the same query run, each state partition's first bucket always reached, a
task's calls sharing the batch's latest time; Spark's hash of an int as Spark computes it."""

from __future__ import annotations

import os
import random

import pytest

from ember.runner.spark.keyed import reach
from ember.runner.spark.keyed.reach import QuietMarks, Reach, TaskLatest, first_buckets, spark_hash_int


@pytest.fixture
def task(monkeypatch):
    """The micro-batch the 'task' runs in: set ``task.now = (batch, run, partitions)``."""

    class Task:
        now: tuple[int, str, int] | None = (5, "run-a", 2)

    monkeypatch.setattr(reach, "_task_properties", lambda: Task.now)
    return Task


def _names(folder):
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_spark_hash_int_is_spark_s_hash(spark):
    from pyspark.sql import functions as F

    values = [0, 1, 2, 42, 127, -1, -128, 2**31 - 1, -(2**31), 123456789]
    df = spark.createDataFrame([(v,) for v in values], "v int")
    expected = [r[0] for r in df.select(F.hash("v")).collect()]
    assert [spark_hash_int(v) for v in values] == expected


def test_first_buckets_are_each_partition_s_lowest():
    for partitions in (1, 2, 3, 8):
        firsts = first_buckets(128, partitions)
        by_partition: dict[int, list[int]] = {}
        for b in range(128):
            by_partition.setdefault(spark_hash_int(b) % partitions, []).append(b)
        assert firsts == {min(bs) for bs in by_partition.values()}
        assert len(firsts) == partitions


def test_every_bucket_without_marks_or_outside_a_micro_batch(tmp_path, task):
    assert list(Reach(16).targets()) == list(range(16))
    assert list(Reach(16, str(tmp_path / "none-yet")).targets()) == list(range(16))
    task.now = None
    QuietMarks(str(tmp_path / "q")).note(3, quiet=True)
    assert _names(tmp_path / "q") == []  # no run to mark it under
    assert list(Reach(16, str(tmp_path / "q")).targets()) == list(range(16))


def test_a_quiet_bucket_is_left_out_from_the_next_batch_of_the_same_run(tmp_path, task):
    folder = str(tmp_path / "q")
    firsts = first_buckets(16, 2)
    quiet = next(b for b in range(16) if b not in firsts)
    QuietMarks(folder).note(quiet, quiet=True)
    assert _names(folder) == [f"{quiet}.5.run-a"]
    assert quiet in Reach(16, folder).targets()  # the batch that marked it: maybe a failed attempt's mark
    task.now = (6, "run-a", 2)
    assert list(Reach(16, folder).targets()) == [b for b in range(16) if b != quiet]
    task.now = (7, "run-b", 2)  # a new run (a restart): an earlier run's marks are not believed
    assert list(Reach(16, folder).targets()) == list(range(16))


def test_each_partition_s_first_bucket_is_reached_though_quiet(tmp_path, task):
    folder = str(tmp_path / "q")
    marks = QuietMarks(folder)
    for b in range(16):
        marks.note(b, quiet=True)
    task.now = (6, "run-a", 2)
    assert set(Reach(16, folder).targets()) == first_buckets(16, 2)
    task.now = (6, "run-a", 3)  # the partitions the batch runs with decide the first buckets
    assert set(Reach(16, folder).targets()) == first_buckets(16, 3)


def test_a_timer_unmarks_its_bucket_at_once(tmp_path, task):
    folder = str(tmp_path / "q")
    QuietMarks(folder).note(4, quiet=True)
    task.now = (6, "run-a", 2)
    marks = QuietMarks(folder)
    marks.note(4, quiet=False)
    assert _names(folder) == []
    assert 4 in Reach(16, folder).targets()
    marks.note(4, quiet=True)  # quiet again in the same task: marked with this batch
    assert _names(folder) == ["4.6.run-a"]


def test_a_mark_is_kept_through_the_run_and_renewed_by_the_next(tmp_path, task):
    folder = str(tmp_path / "q")
    b = next(b for b in range(16) if b not in first_buckets(16, 2))
    QuietMarks(folder).note(b, quiet=True)
    task.now = (9, "run-a", 2)
    QuietMarks(folder).note(b, quiet=True)
    assert _names(folder) == [f"{b}.5.run-a"]  # still true since batch 5: believed from batch 6 on
    task.now = (10, "run-b", 2)
    QuietMarks(folder).note(b, quiet=True)
    assert _names(folder) == [f"{b}.10.run-b"]  # the new run's mark replaces the old one's
    assert b in Reach(16, folder).targets()
    task.now = (11, "run-b", 2)
    assert b not in Reach(16, folder).targets()


def test_random_calls_never_hide_a_bucket_with_timers(tmp_path, task):
    """Against a model: over random calls in random batches and runs, with failed attempts
    (their state changes lost, their marks left behind), a bucket left out of a batch has no
    timer in the committed state."""
    folder = str(tmp_path / "q")
    rng = random.Random(7)
    committed = {b: rng.random() < 0.5 for b in range(16)}  # bucket -> has timers
    batch, run = 0, "run-0"
    for step in range(300):
        task.now = (batch, run, 2)
        reached = set(Reach(16, folder).targets())
        hidden = [b for b in range(16) if b not in reached and committed[b]]
        assert not hidden, f"step {step}: buckets {hidden} have timers but are left out"
        state = dict(committed)
        marks = QuietMarks(folder)
        for b in sorted(reached | {b for b in range(16) if rng.random() < 0.2}):
            state[b] = rng.random() < 0.4
            marks.note(b, quiet=not state[b])
        roll = rng.random()
        if roll < 0.1:  # the attempt failed and the query restarts: a new run replays the batch
            run = f"run-{step}"
        elif roll < 0.2:  # the task failed and is retried within the batch
            pass
        else:
            committed = state
            batch += 1


def test_a_task_s_calls_share_the_latest_time_until_the_next_task(monkeypatch):
    import pyspark

    class Context:
        def __init__(self, batch, partition, attempt=0):
            self.batch, self.partition, self.attempt = batch, partition, attempt

        def getLocalProperty(self, key):  # noqa: N802 - Spark's names
            return str(self.batch) if key == reach.BATCH_ID_PROPERTY else None

        def partitionId(self):  # noqa: N802
            return self.partition

        def attemptNumber(self):  # noqa: N802
            return self.attempt

    current = {"context": None}
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: current["context"]))
    latest = TaskLatest()
    assert latest(700) == 700 and latest(None) is None  # outside a task: each call its own
    current["context"] = Context(3, 0)
    assert latest(900) == 900
    assert latest(None) == 900 and latest(400) == 900 and latest(1_200) == 1_200
    current["context"] = Context(3, 1)  # another partition's task
    assert latest(None) is None and latest(500) == 500
    current["context"] = Context(3, 1, attempt=1)  # the task retried
    assert latest(None) is None
    current["context"] = Context(4, 1)  # the next batch
    assert latest(300) == 300
