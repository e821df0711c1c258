"""Stop conditions of a running job, driven by a manual clock and scripted progress (no Spark)."""

from __future__ import annotations

import json

import pytest

from ember.runner.spark.progress import ProgressFollower
from ember.runner.spark.stopping import (
    MIN_BATCHES_GRACE_S,
    SAVEPOINT_STOP,
    Duration,
    EndOfInput,
    Idle,
    MaxEvents,
    RunView,
    StopRequested,
)
from ember.time.clock import ManualClock


class _Query:
    def __init__(self) -> None:
        self.status = {"isDataAvailable": False, "isTriggerActive": False, "message": "Waiting for data to arrive"}


def _report(batch: int, rows: int, start: dict | None = None, **offset: object) -> dict:
    end = {"n": rows, **offset}
    return {"batchId": batch, "numInputRows": rows, "durationMs": {"triggerExecution": 5},
            "sources": [{"startOffset": start, "endOffset": end, "numInputRows": rows}]}


class _Run:
    """A scripted run: batches recorded through the real follower, time on a manual clock."""

    def __init__(self, first_batch: int = 0) -> None:
        self.first_batch = first_batch
        self.clock = ManualClock()
        self.follower = ProgressFollower(False, "job", self.clock)
        self.query = _Query()
        self.start = self.clock.monotonic()

    def batch(self, rows: int, start: dict | None = None, **offset: object) -> bool:
        return self.follower._record(_report(self.first_batch + len(self.follower.progress), rows, start, **offset))

    def view(self, new: bool = False) -> RunView:
        return RunView(self.clock.monotonic(), self.start, self.follower, self.query, new)


def test_duration_waits_for_min_batches_then_gives_up_after_the_grace():
    run, cond = _Run(), Duration(2.0, min_batches=2)
    run.clock.sleep(1.9)
    assert cond.check(run.view()) is None
    run.clock.sleep(0.2)
    run.batch(10)
    assert cond.check(run.view()) is None  # 2.1 s, but one batch with input of the two asked for
    run.batch(0)
    assert cond.check(run.view()) is None  # an empty batch does not count
    run.batch(5)
    assert cond.check(run.view()) == "duration 2 s reached"
    late, lazy = _Run(), Duration(2.0, min_batches=5)
    late.clock.sleep(2.0 + MIN_BATCHES_GRACE_S)
    assert lazy.check(late.view()) == "duration 2 s reached"


def test_max_events_counts_the_followers_events():
    run, cond = _Run(), MaxEvents(100)
    run.batch(60)
    assert cond.check(run.view()) is None
    run.batch(40)
    assert cond.check(run.view()) == "100 events processed"


def test_idle_stops_only_after_a_quiet_spell_with_nothing_waiting():
    run = _Run()
    cond = Idle(3.0, run.clock.monotonic())
    run.clock.sleep(5)
    assert cond.check(run.view()) is None  # no batch yet: a job still starting is not idle
    new = run.batch(50)
    assert cond.check(run.view(new)) is None  # input just arrived
    run.clock.sleep(2)
    assert cond.check(run.view(run.batch(0))) is None
    run.clock.sleep(1.5)
    run.query.status["isDataAvailable"] = True
    assert cond.check(run.view()) is None  # quiet for 3.5 s, but a source has data waiting
    run.query.status["isDataAvailable"] = False
    assert cond.check(run.view()) == "no input for 3 s"


def test_a_stop_request_file_stops_for_a_savepoint(tmp_path):
    request = tmp_path / "stop-request"
    cond, run = StopRequested(str(request)), _Run()
    assert cond.check(run.view()) is None
    request.touch()
    assert cond.check(run.view()) == SAVEPOINT_STOP


@pytest.mark.parametrize("needs_flush", [False, True])
def test_end_of_input_marks_the_end_then_waits_for_the_flush(tmp_path, needs_flush):
    marker = tmp_path / "end-of-input"
    run = _Run()
    cond = EndOfInput(1, str(marker), needs_flush, idle_limit_s=10, now=run.clock.monotonic())
    assert cond.check(run.view(run.batch(10, done=False))) is None
    reason = cond.check(run.view(run.batch(5, done=True)))
    if not needs_flush:
        assert reason == "sources ended" and not marker.exists()
        return
    assert reason is None and marker.exists()  # the end-of-input row may pass now
    assert cond.check(run.view(run.batch(1, done=True, ended=1))) is None  # the batch that carried the row
    assert cond.check(run.view(run.batch(0, done=True, ended=1))) == "sources ended, windows flushed"


def test_end_of_input_gives_up_on_sources_that_stay_idle(tmp_path):
    run = _Run()
    cond = EndOfInput(1, str(tmp_path / "m"), True, idle_limit_s=10, now=run.clock.monotonic())
    cond.check(run.view(run.batch(10, done=False)))
    run.clock.sleep(10.5)
    run.query.status["isTriggerActive"] = True
    assert cond.check(run.view()) is None  # a batch is running
    run.query.status["isTriggerActive"] = False
    assert cond.check(run.view()) == "sources idle"


def test_end_of_input_does_not_call_a_query_still_starting_idle(tmp_path):
    """Spark's status before the first batch reads like an idle one (no data available, no
    trigger active) but says it is initialising: on a loaded machine that can outlast the
    limit, and stopping then would end a bounded job before it read anything."""
    run = _Run()
    cond = EndOfInput(1, str(tmp_path / "m"), False, idle_limit_s=10, now=run.clock.monotonic())
    run.query.status["message"] = "Initializing sources"
    run.clock.sleep(30)
    assert cond.check(run.view()) is None
    run.query.status["message"] = "Waiting for data to arrive"
    assert cond.check(run.view()) == "sources idle"


def _plan(checkpoint, batch: int, *offsets: dict) -> None:
    """Spark's offset-log entry of a planned batch: written as the batch starts."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    lines = ["v1", '{"batchWatermarkMs":0}'] + [json.dumps(o) for o in offsets]
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines))


def test_the_end_is_marked_as_soon_as_a_planned_batch_reads_every_source_to_its_end(tmp_path):
    """The offset log shows the last batch of input while it runs; marking the end then puts
    the end-of-input row into the next batch, not the one after it (no report needed)."""
    marker, checkpoint = tmp_path / "end-of-input", tmp_path / "ckpt"
    run = _Run()
    cond = EndOfInput(2, str(marker), True, idle_limit_s=10, now=run.clock.monotonic(), checkpoint=str(checkpoint))
    assert cond.check(run.view()) is None  # nothing planned yet
    _plan(checkpoint, 0, {"batch": 1, "done": True}, {"n": 5, "done": False}, {"ended": 0})
    assert cond.check(run.view()) is None and not marker.exists()  # one source is not done
    _plan(checkpoint, 1, {"batch": 1, "done": True}, {"n": 9, "done": True}, {"ended": 0})
    assert cond.check(run.view()) is None and marker.exists()  # batch 1 still runs; no report came
    assert cond.check(run.view(run.batch(1, done=True, ended=1))) is None  # the batch that carried the row
    assert cond.check(run.view(run.batch(0, done=True, ended=1))) == "sources ended, windows flushed"


def test_a_batch_an_earlier_run_planned_does_not_mark_the_end(tmp_path):
    """A replayed batch carries the earlier run's offsets: input added since must be read first."""
    marker, checkpoint = tmp_path / "end-of-input", tmp_path / "ckpt"
    _plan(checkpoint, 3, {"batch": 2, "done": True}, {"ended": 0})
    run = _Run()
    cond = EndOfInput(1, str(marker), True, idle_limit_s=10, now=run.clock.monotonic(), replayed=3,
                      checkpoint=str(checkpoint))
    assert cond.check(run.view()) is None and not marker.exists()
    _plan(checkpoint, 4, {"batch": 3, "done": True}, {"ended": 0})
    assert cond.check(run.view()) is None and marker.exists()


def test_a_restart_after_the_end_of_input_reads_all_new_input_before_it_stops(tmp_path):
    """A job whose input ended in an earlier run, restarted with more input: the end-of-input
    source starts (and stays) ended, so no batch of this run carries its row. Stopping one
    report after the first batch — as if that batch had carried it — would drop the last
    batches' input (seen in CI: the third run of test_delta_state lost its last batch)."""
    marker, checkpoint = tmp_path / "end-of-input", tmp_path / "ckpt"
    _plan(checkpoint, 5, {"batch": 6, "done": True}, {"ended": 1})  # the earlier run's last batch
    run = _Run(first_batch=6)
    cond = EndOfInput(1, str(marker), True, idle_limit_s=10, now=run.clock.monotonic(), replayed=5,
                      checkpoint=str(checkpoint))
    _plan(checkpoint, 6, {"batch": 7, "done": False}, {"ended": 1})
    assert cond.check(run.view(run.batch(4, start={"ended": 1}, done=False, ended=1))) is None
    _plan(checkpoint, 7, {"batch": 8, "done": False}, {"ended": 1})
    _plan(checkpoint, 8, {"batch": 9, "done": True}, {"ended": 1})  # planned while batch 7's report comes
    assert cond.check(run.view()) is None
    assert cond.check(run.view(run.batch(36, start={"ended": 1}, done=False, ended=1))) is None  # input waits
    assert cond.check(run.view(run.batch(19, start={"ended": 1}, done=True, ended=1))) == "sources ended"
    assert run.follower.eos_batch is None and run.follower.ended_earlier
