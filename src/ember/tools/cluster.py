"""A real Spark standalone cluster on loopback: one master and N workers.

Started from the pyspark installation (``bin/spark-class``), each daemon a JVM of
its own in its own process group, so a test or ``ember chaos --cluster`` can
SIGKILL a worker or one of its executors the way a machine failure would. Any
Ember pipeline runs on it unchanged with ``master=cluster.url``::

    with LocalCluster(workers=2) as cluster:
        env = StreamEnvironment(master=cluster.url)

``ember cluster`` starts one in the foreground and prints its URL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from ember.errors import ConfigError, EmberError

__all__ = ["LocalCluster", "spark_home", "wait_for_executors"]

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> str:
    """The Spark installation pyspark ships with (``SPARK_HOME`` wins when set)."""
    home = os.environ.get("SPARK_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "spark-class")):
        return home
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    if not os.path.exists(os.path.join(home, "bin", "spark-class")):
        raise EmberError(f"no bin/spark-class under {home}; set SPARK_HOME to a Spark installation")
    return home


def wait_for_executors(spark: Any, n: int, timeout_s: float = 120.0) -> None:
    """Wait until ``n`` executors registered with ``spark``'s driver: Spark's default
    parallelism (source partitions, state partitions) counts the cores registered when a
    job starts, and executors register a few seconds after the session."""
    deadline = time.monotonic() + timeout_s
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1 < n:  # (the driver counts too)
        if time.monotonic() > deadline:
            raise EmberError(f"timed out after {timeout_s:.0f} s waiting for {n} executor(s) to register")
        time.sleep(0.25)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class _Daemon:
    name: str
    cmd: list[str]
    log: str
    proc: subprocess.Popen | None = None

    def start(self, env: dict[str, str]) -> None:
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen(
                self.cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@dataclass
class LocalCluster:
    """A standalone master and ``workers`` workers of ``cores`` cores each, on 127.0.0.1."""

    workers: int = 2
    cores: int = 1
    memory: str = "2g"
    work_dir: str | None = None
    start_timeout_s: float = 90.0
    _daemons: list[_Daemon] = field(default_factory=list, repr=False)
    _owns_dir: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ConfigError(f"cluster: workers must be an int >= 1, got {self.workers!r}")
        if not isinstance(self.cores, int) or self.cores < 1:
            raise ConfigError(f"cluster: cores must be an int >= 1, got {self.cores!r}")
        self.port, self.ui_port = _free_port(), _free_port()

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> "LocalCluster":
        if self.work_dir is None:
            self.work_dir = tempfile.mkdtemp(prefix="ember-cluster-")
            self._owns_dir = True
        os.makedirs(self.work_dir, exist_ok=True)
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        master = _Daemon("master", [
            spark_class, "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port),
        ], os.path.join(self.work_dir, "master.log"))
        self._daemons = [master]
        for i in range(self.workers):
            wdir = os.path.join(self.work_dir, f"worker-{i}")
            os.makedirs(wdir, exist_ok=True)
            self._daemons.append(_Daemon(f"worker-{i}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", self.url,
                "--host", "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory,
                "--webui-port", str(_free_port()), "--work-dir", wdir,
            ], os.path.join(self.work_dir, f"worker-{i}.log")))
        try:
            master.start(self._env())
            self._wait(lambda s: s.get("status") == "ALIVE", "the master to come up")
            for i, worker in enumerate(self._daemons[1:]):
                worker.start(self._env(i))
            self.wait_for_workers(self.workers)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for daemon in reversed(self._daemons):
            daemon.kill(signal.SIGTERM)
        for pid in self.executor_pids():  # orphans of a worker killed earlier
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._owns_dir and self.work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- what tests and chaos need -------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications), or {} while it is not up."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                return json.load(r)
        except (OSError, ValueError):
            return {}

    def alive_workers(self) -> int:
        return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")

    def wait_for_workers(self, n: int) -> None:
        self._wait(lambda s: sum(1 for w in s.get("workers", []) if w.get("state") == "ALIVE") >= n,
                   f"{n} worker(s) to register")

    def worker_names(self) -> list[str]:
        return [f"worker-{i}" for i in range(self.workers)]

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` (its executors notice and exit, as on a lost machine)."""
        self._daemons[1 + i].kill(signal.SIGKILL)

    def restart_worker(self, i: int) -> None:
        worker = self._daemons[1 + i]
        if not worker.alive:
            worker.start(self._env(i))

    def executor_pids(self) -> list[int]:
        """PIDs of the executor JVMs running on this cluster's workers."""
        if not self.work_dir:
            return []
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\0")
            except OSError:
                continue
            if EXECUTOR_CLASS.encode() in cmd and self._our_executor(int(entry)):
                pids.append(int(entry))
        return pids

    def _our_executor(self, pid: int) -> bool:
        """An executor whose working directory is under this cluster's work dir."""
        try:
            return os.readlink(f"/proc/{pid}/cwd").startswith(os.path.realpath(self.work_dir or "/nonexistent"))
        except OSError:
            return False

    def log_tail(self, lines: int = 20) -> str:
        out = []
        for d in self._daemons:
            try:
                with open(d.log, errors="replace") as f:
                    out.append(f"--- {d.name}\n" + "".join(f.readlines()[-lines:]))
            except OSError:
                pass
        return "\n".join(out)

    # -- internals -----------------------------------------------------------------

    def state_copies(self) -> dict[str, int]:
        """Per worker, the delta-layout state buckets (keyed/delta.py) whose working copy was
        written there last: where the job's state partitions ran (a bucket that moved keeps a
        stale copy on the worker it left, which this does not count)."""
        latest: dict[str, tuple[float, str]] = {}
        for name in self.worker_names():
            root = self._state_dir(name)
            for dirpath, _dirs, files in os.walk(root):
                if "tag" in files:
                    bucket = os.path.relpath(dirpath, root)
                    mtime = os.stat(os.path.join(dirpath, "tag")).st_mtime
                    if bucket not in latest or mtime > latest[bucket][0]:
                        latest[bucket] = (mtime, name)
        counts = dict.fromkeys(self.worker_names(), 0)
        for _mtime, name in latest.values():
            counts[name] += 1
        return counts

    def _state_dir(self, worker: str) -> str:
        return os.path.join(self.work_dir or "", worker, "ember-local-state")

    def _env(self, worker: int | None = None) -> dict[str, str]:
        """The daemons' environment; a worker's (inherited by its executors and their Python
        workers) names its own directory for Ember's working copies of keyed state, as if
        each worker were a machine with its own disk."""
        env = dict(os.environ)
        if worker is not None:
            env["EMBER_LOCAL_STATE_DIR"] = self._state_dir(f"worker-{worker}")
        env.update({
            "SPARK_HOME": spark_home(),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_WORKER_DIR": self.work_dir or "",
            "SPARK_LOG_DIR": self.work_dir or "",
            "SPARK_NO_DAEMONIZE": "1",
        })
        return env

    def _wait(self, ok: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if not self._daemons[0].alive:
                raise EmberError(f"the Spark master exited while waiting for {what}:\n{self.log_tail()}")
            if ok(self.status()):
                return
            time.sleep(0.25)
        raise EmberError(f"timed out after {self.start_timeout_s:.0f} s waiting for {what}:\n{self.log_tail()}")
