"""One driver per checkpoint, and standby drivers that take over when it dies.

A job holds its checkpoint's *leader lock* — an exclusive ``flock`` on
``<checkpoint>.leader.lock``, beside the checkpoint directory — from before it reads the
checkpoint (or restores a savepoint into it) until it has stopped. Two drivers on one checkpoint would interleave their offset and commit logs, so
a second ``execute`` of the same job fails at once, naming the process that runs it.

A **standby** (``execute(standby=True)``, ``ember run --standby``; Flink's standby
JobManager) starts everything that does not depend on the checkpoint — the JVM and Spark
session, Ember's data sources, Python workers with the keyed runtime imported (kept warm
while it waits) — and then waits for the lock. The kernel releases a lock when its process
dies, however it dies, so the standby learns of a crash within one poll and starts the
query from the checkpoint at once: a driver kill then costs the restart of the query, not
of a JVM. The lock file says how its holder left: a job that ended by itself (stopped,
finished, stopped with a savepoint) marks it ``ended``, and a standby that waited for it
stands down instead of starting it again.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable

from ember.errors import EmberError

__all__ = ["LeaderLock", "JobAlreadyRunning", "STOOD_DOWN"]

STOOD_DOWN = "the job it stood by for ended by itself: the standby stood down"
POLL_S = 0.02


class JobAlreadyRunning(EmberError):
    """Another process runs the job on this checkpoint."""


class LeaderLock:
    """The checkpoint's leader lock (see the module's docstring)."""

    def __init__(self, path: str, job: str) -> None:
        self.path, self.job = path, job
        self._fd = -1

    def _open(self) -> int:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the JVM or workers (PEP 446)

    def holder(self) -> dict[str, Any]:
        """What the lock file says of its last holder ({} if nothing)."""
        try:
            with open(self.path) as f:
                value = json.loads(f.read() or "{}")
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def try_acquire(self) -> bool:
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def acquire(self, standby: bool, keep_warm: Callable[[], None] | None = None, warm_every_s: float = 30.0) -> bool:
        """Take the lock. Without ``standby`` a held lock fails at once
        (:class:`JobAlreadyRunning`); with it, wait — calling ``keep_warm`` now and then —
        until the holder's process ends. False: the holder ended the job by itself (the
        standby stands down, the lock released again); True: this process leads."""
        if not self.try_acquire():
            held = self.holder()
            who = f"pid {held.get('pid', '?')} on {held.get('host', '?')}" if held else "another process"
            if not standby:
                raise JobAlreadyRunning(
                    f"job '{self.job}' is already running on this checkpoint ({who}); two drivers on one checkpoint "
                    "would corrupt it. Stop it first, or start this one as a standby (execute(standby=True), "
                    "ember run --standby) to take over if it dies"
                )
            if keep_warm is not None:
                keep_warm()  # before saying it stands by: a takeover then finds the driver warm
            print(f"[ember] {self.job}: standby for the running job ({who}); it takes over if that process dies",
                  file=sys.stderr, flush=True)
            done = threading.Event()
            if keep_warm is not None:  # Spark ends Python workers idle for a minute: warm them again now and then
                threading.Thread(target=_rewarm, args=(keep_warm, warm_every_s, done), name="ember-standby-warm",
                                 daemon=True).start()
            try:
                while not self.try_acquire():
                    time.sleep(POLL_S)
            finally:
                done.set()
            if self.holder().get("state") == "ended":
                self.release(None)
                print(f"[ember] {self.job}: {STOOD_DOWN}", file=sys.stderr, flush=True)
                return False
            print(f"[ember] {self.job}: the running job's process ended without stopping it: taking over",
                  file=sys.stderr, flush=True)
        self._write({"state": "running", "pid": os.getpid(), "host": socket.gethostname(), "since": time.time()})
        return True

    def release(self, ended: str | None) -> None:
        """Release the lock; ``ended``: the job ended by itself, for this reason (standbys
        stand down). A process that dies releases it too, without marking it."""
        if self._fd < 0:
            return
        if ended is not None:
            self._write({"state": "ended", "reason": ended, "pid": os.getpid(), "at": time.time()})
        os.close(self._fd)  # releases the flock
        self._fd = -1

    def _write(self, value: dict[str, Any]) -> None:
        data = json.dumps(value).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)


def _rewarm(keep_warm: Callable[[], None], every_s: float, done: threading.Event) -> None:
    while not done.wait(every_s):
        try:
            keep_warm()
        except Exception as exc:  # noqa: BLE001 - a standby that cannot warm still takes over
            print(f"[ember] standby: warming the driver failed ({type(exc).__name__}: {exc})", file=sys.stderr, flush=True)
