"""One driver per checkpoint; a standby takes over when the running driver dies and stands
down when the job ended by itself (runner/spark/leader.py). Real processes, real flock."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ember.runner.spark.leader import JobAlreadyRunning, LeaderLock

HOLD = """
import sys, time
from ember.runner.spark.leader import LeaderLock
lock = LeaderLock(sys.argv[1], "job")
assert lock.acquire(False)
print("held", flush=True)
if sys.argv[2] == "end":
    time.sleep(0.5)
    lock.release("finished")
else:
    time.sleep(600)
"""


def _holder(path, how):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, path, how], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_driver_fails_at_once_naming_the_running_one(tmp_path):
    path = str(tmp_path / "leader.lock")
    proc = _holder(path, "die")
    try:
        with pytest.raises(JobAlreadyRunning, match=f"pid {proc.pid}"):
            LeaderLock(path, "job").acquire(standby=False)
    finally:
        proc.kill()
        proc.wait()


def test_a_standby_takes_over_when_the_running_driver_is_killed(tmp_path):
    path = str(tmp_path / "leader.lock")
    proc = _holder(path, "die")
    warmed = []
    lock = LeaderLock(path, "job")
    got = {}
    waiter = threading.Thread(target=lambda: got.update(led=lock.acquire(True, keep_warm=lambda: warmed.append(1))))
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive()  # waits while the driver lives
    killed = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    waiter.join(10)
    assert got == {"led": True} and time.monotonic() - killed < 1.0
    assert warmed  # warmed before waiting
    assert lock.holder()["pid"] == os.getpid() and lock.holder()["state"] == "running"
    with pytest.raises(JobAlreadyRunning):
        LeaderLock(path, "job").acquire(standby=False)
    lock.release("finished")
    assert LeaderLock(path, "job").acquire(standby=False)  # released


def test_a_standby_stands_down_when_the_job_ended_by_itself(tmp_path):
    path = str(tmp_path / "leader.lock")
    proc = _holder(path, "end")
    lock = LeaderLock(path, "job")
    assert lock.acquire(True) is False
    proc.wait()
    assert lock.holder()["state"] == "ended" and lock.holder()["reason"] == "finished"
    assert LeaderLock(path, "job").acquire(standby=False)  # the standby let it go: a new run may start


def test_a_job_whose_last_run_ended_starts_normally(tmp_path):
    path = str(tmp_path / "leader.lock")
    first = LeaderLock(path, "job")
    assert first.acquire(False)
    first.release("finished")
    assert LeaderLock(path, "job").acquire(standby=True)  # nobody runs it: a standby leads at once
