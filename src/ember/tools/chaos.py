"""``ember chaos``: exactly-once under repeated crashes (WORKLOADS.md E4).

A producer writes state-machine events, with invalid events injected at a
known rate, into Redis streams at a steady rate. The job (``chaos_jobs``) runs
in a child process — its own Spark driver — and is killed with SIGKILL at
random moments (the whole process group: Python driver, JVM and Python
workers), then restarted from its checkpoint. Every run is started to stop once no input
arrived for a few seconds: after the producer finished, the job running then
catches up to the end of the streams and ends by itself. Finally both sinks'
alerts (PostgreSQL and a Redis stream) are compared with the alerts the
injected events must cause: lost, duplicated and false alerts are counted.

Recovery time = kill -> the restarted job commits its first new micro-batch.
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ember.connectors.external import postgres_url, redis_url
from ember.connectors.generators import StateMachineSource
from ember.errors import ConfigError, EmberError
from ember.tools.produce import ProduceConfig, produce

__all__ = ["ChaosConfig", "run_chaos"]

WORKLOADS = ("statemachine", "pipeline", "fanout")


@dataclass(frozen=True)
class ChaosConfig:
    workload: str = "statemachine"
    kills: int = 2
    duration_s: float = 60.0
    rate: float = 10_000.0
    partitions: int = 2
    invalid_rate: float = 0.001
    batch: int = 50_000  # records per micro-batch at most (admission control)
    master: str = "local[2]"
    cluster: bool = False  # run on a standalone cluster on loopback; kill executors and workers too
    workers: int | None = None  # the cluster's workers (1 core each; default 2)
    state_layout: str = "blob"  # keyed state: one value per bucket, or a delta log (issue 18)
    standby: bool = False  # keep a standby driver waiting beside the job: it takes over a killed driver
    seed: int | None = None  # kill schedule; None: random
    keep: bool = False  # keep the work directory (checkpoint, logs)
    verbose: bool = True
    ui_port: int | None = None  # serve each run's dashboard on this port (restarts show in its history)
    ui_host: str | None = None

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ConfigError(f"chaos: workload must be one of {', '.join(WORKLOADS)}, got {self.workload!r}")
        if not isinstance(self.kills, int) or self.kills < 0:
            raise ConfigError(f"chaos: kills must be an int >= 0, got {self.kills!r}")
        if self.duration_s <= 0 or self.rate <= 0:
            raise ConfigError("chaos: duration and rate must be > 0")
        if self.batch < 1 or self.partitions < 1:
            raise ConfigError("chaos: batch and partitions must be >= 1")
        if self.workers is not None and not self.cluster:
            raise ConfigError("chaos: --workers applies to a cluster run (--cluster)")
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise ConfigError(f"chaos: workers must be an int >= 1, got {self.workers!r}")
        if self.state_layout not in ("blob", "delta"):
            raise ConfigError(f"chaos: state layout must be 'blob' or 'delta', got {self.state_layout!r}")

    @property
    def cluster_workers(self) -> int:
        return self.workers or 2


IDLE_S = 5  # a run stops once no input arrived for this long (after the producer finished)


@dataclass
class _Child:
    proc: subprocess.Popen
    started: float
    log: str
    ready: bool = False  # a standby: said it waits, warm (read from its log until it has)


@dataclass
class ChaosRun:
    cfg: ChaosConfig
    work: str
    prefix: str
    table: str
    master: str = "local[2]"
    log_lines: list[str] = field(default_factory=list)

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.work, "checkpoints", "chaos")

    def say(self, msg: str) -> None:
        if self.cfg.verbose:
            print(f"[ember chaos] {msg}", file=sys.stderr, flush=True)

    def committed(self) -> int:
        from ember.runner.spark.execution import last_committed_batch

        return last_committed_batch(self.checkpoint)

    def start(self, standby: bool = False) -> _Child:
        env = dict(os.environ)
        env.update({
            "EMBER_CHAOS_PREFIX": self.prefix,
            "EMBER_CHAOS_PARTITIONS": str(self.cfg.partitions),
            "EMBER_CHAOS_TABLE": self.table,
            "EMBER_CHAOS_BATCH": str(self.cfg.batch),
            "PYSPARK_PYTHON": sys.executable,
        })
        log = os.path.join(self.work, f"run-{len(self.log_lines)}{'-standby' if standby else ''}.log")
        self.log_lines.append(log)
        cmd = [
            sys.executable, "-m", "ember.cli", "run", f"ember.tools.chaos_jobs:{self.cfg.workload}",
            "--master", self.master, "--checkpoint-dir", os.path.join(self.work, "checkpoints"), "--name", "chaos",
            # While the producer runs every batch finds input; once it finished, the job drains
            # the streams and stops by itself.
            "--stop-when-idle", str(IDLE_S), "--state-layout", self.cfg.state_layout,
        ]
        if standby:
            cmd.append("--standby")
        if self.cfg.cluster:  # one state partition per worker core (not the cores registered when the query starts)
            cmd += ["--parallelism", str(self.cfg.cluster_workers)]
        if self.cfg.ui_port is not None:  # every run serves on the same port: the page reconnects after a kill
            cmd += ["--ui", "--ui-port", str(self.cfg.ui_port)] + (["--ui-host", self.cfg.ui_host] if self.cfg.ui_host else [])
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return _Child(proc, time.monotonic(), log)

    def standing_by(self, child: _Child) -> bool:
        """Whether a standby's driver is up and waiting for the lock (leader.py says so; its
        log is read until it has)."""
        if not child.ready:
            with open(child.log, errors="replace") as f:
                child.ready = "standby for the running job" in f.read()
        return child.ready

    def tail(self, child: _Child, lines: int = 30) -> str:
        with open(child.log, errors="replace") as f:
            return "".join(f.readlines()[-lines:])


def _kill_group(child: _Child, sig: int) -> None:
    try:
        os.killpg(child.proc.pid, sig)
    except ProcessLookupError:
        pass


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def run_chaos(cfg: ChaosConfig) -> dict[str, Any]:
    import psycopg
    import redis

    client = redis.Redis.from_url(redis_url())
    client.ping()
    with psycopg.connect(postgres_url(), connect_timeout=5) as conn:
        conn.execute("select 1")
    cluster = None
    if cfg.cluster:
        from ember.tools.cluster import LocalCluster

        cluster = LocalCluster(workers=cfg.cluster_workers, cores=1)
    try:
        if cluster is not None:
            cluster.start()
        return _run(cfg, client, cluster)
    finally:
        if cluster is not None:
            cluster.stop()


def _run(cfg: ChaosConfig, client: Any, cluster: Any) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    tag = uuid.uuid4().hex[:8]
    run = ChaosRun(
        cfg, tempfile.mkdtemp(prefix="ember-chaos-"), f"ember:chaos:{tag}", f"ember_chaos_alerts_{tag}",
        master=cluster.url if cluster is not None else cfg.master,
    )
    if cluster is not None:
        run.say(f"standalone cluster {cluster.url}: master + {len(cluster.worker_names())} workers")
    if cfg.ui_port is not None:
        run.say(f"every run's dashboard at http://{cfg.ui_host or '127.0.0.1'}:{cfg.ui_port}/ (restarts in its Runs table)")
    # Production goes on at the rate until the duration passed and the job recovered from
    # every kill (a restarted job always finds input), then stops.
    produced = ProduceConfig(
        "statemachine", prefix=run.prefix, partitions=cfg.partitions, rate=cfg.rate,
        duration_s=10 * cfg.duration_s + 3600, invalid_rate=cfg.invalid_rate,
    )
    stop_producing = threading.Event()
    report: dict[str, Any] = {"workload": cfg.workload, "master": run.master, "state_layout": cfg.state_layout,
                              "standby": cfg.standby, "work_dir": run.work}
    producer_result: dict[str, Any] = {}

    def producer() -> None:
        try:
            producer_result["report"] = produce(produced, stop=stop_producing)
        except Exception as exc:  # noqa: BLE001 - reported below
            producer_result["error"] = exc

    run.say(f"producing state-machine events at {cfg.rate:,.0f}/s into {run.prefix}:0..{cfg.partitions - 1}")
    feeder = threading.Thread(target=producer, name="ember-chaos-producer", daemon=True)
    feeder.start()
    t0 = time.monotonic()
    child = run.start()
    standby: _Child | None = None  # with cfg.standby: the driver waiting to take over
    kills: list[tuple[float, str]] = []  # (time, what was killed)
    recoveries: list[tuple[str, float]] = []  # (what was killed, ms until processing again)
    restarts: list[float] = []  # a driver kill: ms until the new process was about to start its query
    takeovers: list[float] = []  # ... of which until the new process held the job's leader lock
    restarted = True  # the pending driver kill's new process has started its query
    kill_wall = 0.0  # the last kill's wall-clock time (the marker's mtime is wall-clock)
    pending_kill: tuple[float, int, str] | None = None  # (kill time, last committed batch at the kill, target)
    dead_worker: tuple[int, float] | None = None  # (worker, restart time): a supervisor brings it back
    gap = cfg.duration_s / (cfg.kills + 1) if cfg.kills else cfg.duration_s
    next_kill = t0 + gap * rng.uniform(0.6, 1.4)
    try:
        # Until the production ends, every kill was made and the job recovered from the last one.
        while (
            time.monotonic() - t0 < cfg.duration_s
            or (len(kills) < cfg.kills and time.monotonic() - t0 < 4 * cfg.duration_s + 120)
            or (pending_kill is not None and time.monotonic() - pending_kill[0] < 300)
        ):
            if child.proc.poll() is not None:
                raise EmberError(f"the job exited on its own (code {child.proc.returncode}):\n{run.tail(child)}")
            if standby is not None and standby.proc.poll() is not None:
                raise EmberError(f"the standby exited (code {standby.proc.returncode}):\n{run.tail(standby)}")
            now = time.monotonic()
            if dead_worker is not None and now >= dead_worker[1]:
                cluster.restart_worker(dead_worker[0])
                run.say(f"worker-{dead_worker[0]} restarted")
                dead_worker = None
            committed = run.committed()
            if not restarted and pending_kill is not None:
                restarted = _query_started_since(run.checkpoint, kill_wall)
                if restarted:
                    restarts.append((time.time() - kill_wall) * 1000)
                    led = _leader_since(run.checkpoint)
                    if led is not None and led > kill_wall:
                        takeovers.append((led - kill_wall) * 1000)
            if pending_kill is not None and committed > pending_kill[1]:
                recoveries.append((pending_kill[2], (now - pending_kill[0]) * 1000))
                run.say(f"kill {len(kills)}: processing again after {recoveries[-1][1] / 1000:.1f} s (batch {committed})")
                pending_kill = None
                next_kill = max(next_kill, now + rng.uniform(1.0, 3.0))
            processing = pending_kill is None and dead_worker is None and committed >= 0
            if cfg.standby and standby is None and processing:
                standby = run.start(standby=True)  # (not while a new driver starts: they would share the cores)
            if standby is not None and not run.standing_by(standby):
                processing = False  # kill once the standby waits, warm
            if len(kills) < cfg.kills and processing and now >= next_kill:
                target = _pick_target(rng, cluster)
                at_batch = committed
                kill_wall = time.time()
                if target == "driver":
                    restarted = False
                    _kill_group(child, signal.SIGKILL)
                    child.proc.wait()
                    child, standby = (standby, None) if standby is not None else (run.start(), None)
                elif target == "executor":
                    os.kill(rng.choice(cluster.executor_pids()), signal.SIGKILL)
                else:
                    worker = rng.randrange(len(cluster.worker_names()))
                    cluster.kill_worker(worker)
                    dead_worker = (worker, time.monotonic() + rng.uniform(2.0, 5.0))
                kills.append((time.monotonic(), target))
                pending_kill = (kills[-1][0], at_batch, target)
                run.say(f"kill {len(kills)}/{cfg.kills}: SIGKILL to the {target} at batch {at_batch}")
                next_kill = kills[-1][0] + gap * rng.uniform(0.6, 1.4)
            time.sleep(0.05)
        stop_producing.set()
        feeder.join()
        if "error" in producer_result:
            raise EmberError(f"the producer failed: {producer_result['error']}")
        if dead_worker is not None:
            cluster.restart_worker(dead_worker[0])
        run.say("producer finished; the job drains the streams and stops once idle")
        try:
            child.proc.wait(timeout=max(300.0, 2 * cfg.duration_s))
        except subprocess.TimeoutExpired:
            _kill_group(child, signal.SIGKILL)
            raise EmberError(f"the job did not drain the streams and stop:\n{run.tail(child)}") from None
        if child.proc.returncode != 0:
            raise EmberError(f"the job failed while draining the streams (code {child.proc.returncode}):\n{run.tail(child)}")
        if standby is not None:  # the job ended by itself: its standby stands down
            try:
                standby.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                raise EmberError(f"the standby did not stand down after the job ended:\n{run.tail(standby)}") from None
        events = producer_result["report"].events
        if cfg.workload == "pipeline":
            report.update(_verify_windows(run, client, produced, events, producer_result["report"].origin_ms))
        else:
            report.update(_verify(run, client, produced, events))
    finally:
        stop_producing.set()
        for proc in (child, standby):
            if proc is not None and proc.proc.poll() is None:
                _kill_group(proc, signal.SIGKILL)
    report.update({
        "kills": len(kills),
        "killed": dict(collections.Counter(t for _, t in kills)),
        "events": producer_result["report"].events,
        "recovery_ms": _summary([ms for _, ms in recoveries]),
        "recovery_ms_by_target": {t: _summary([ms for k, ms in recoveries if k == t]) for t in sorted({k for k, _ in recoveries})},
        # A driver kill's recovery in two phases: until the new process starts its query (Python,
        # Spark's session, Ember's compile and restart checks), then until its first new commit.
        "recovery_phases_ms": {
            "restart": _summary(restarts),
            # the restart split: until the new driver holds the lock (a standby: at once; else its
            # Python, JVM and Spark session), then compiling the job and starting its query
            "lock": _summary(takeovers),
            "compile_and_start": _summary([r - t for r, t in zip(restarts, takeovers)]) if len(takeovers) == len(restarts) else _summary([]),
            "first_batch": _summary([ms - r for (k, ms), r in zip([x for x in recoveries if x[0] == "driver"], restarts)]),
        },
        "seconds": round(time.monotonic() - t0, 1),
    })
    if cluster is not None:
        report["workers"] = cfg.cluster_workers
        if cfg.state_layout == "delta":  # where the state partitions ran last
            report["state_buckets_by_worker"] = cluster.state_copies()
    if len(recoveries) < len(kills):
        report["verified"] = False
        report["unrecovered_kills"] = len(kills) - len(recoveries)
    if not cfg.keep and report.get("verified"):
        shutil.rmtree(run.work, ignore_errors=True)
        _cleanup(run, client)
        report.pop("work_dir")
    return report


def _pick_target(rng: random.Random, cluster: Any) -> str:
    """Local mode: the driver. On the cluster: the driver, an executor or a worker
    (an executor only while one is running)."""
    if cluster is None:
        return "driver"
    choices = ["driver", "worker"] + (["executor"] if cluster.executor_pids() else [])
    return rng.choice(choices)


def _leader_since(checkpoint: str) -> float | None:
    """When the job's current driver took its leader lock (wall clock), if it says."""
    from ember.runner.spark.checkpoint import CheckpointLayout
    from ember.runner.spark.leader import LeaderLock

    since = LeaderLock(CheckpointLayout(checkpoint).leader_lock, "chaos").holder().get("since")
    return float(since) if isinstance(since, (int, float)) else None


def _query_started_since(checkpoint: str, wall: float) -> bool:
    """Whether a job wrote the checkpoint's "running" marker (just before it starts its query) after ``wall``."""
    from ember.runner.spark.checkpoint import CheckpointLayout

    try:
        return os.path.getmtime(CheckpointLayout(checkpoint).running) > wall
    except FileNotFoundError:
        return False


def _summary(values: list[float]) -> dict[str, int | None]:
    return {
        "p50": _round(_percentile(values, 50)), "p99": _round(_percentile(values, 99)),
        "max": _round(max(values, default=None)),
    }


def _round(v: float | None) -> int | None:
    return None if v is None else int(round(v))


def _verify(run: ChaosRun, client: Any, produced: ProduceConfig, events: int) -> dict[str, Any]:
    """Each sink's alerts against the alerts the first ``events`` produced events must cause."""
    import psycopg

    source = produced.source()
    assert isinstance(source, StateMachineSource)  # both chaos workloads read state-machine events
    expected = collections.Counter(source.expected_alerts(events))
    with psycopg.connect(postgres_url()) as conn:
        rows = conn.execute(f'select address, state, type from "{run.table}"').fetchall()
    postgres = collections.Counter((int(a), s, int(t)) for a, s, t in rows)
    entries = client.xrange(f"{run.prefix}:alerts")
    redis_alerts = collections.Counter(
        (int(f[b"address"]), f[b"state"].decode(), int(f[b"type"])) for _, f in entries
    )
    sinks = {name: _compare(got, expected) for name, got in (("postgres", postgres), ("redis", redis_alerts))}
    worst = {k: max(s[k] for s in sinks.values()) for k in ("lost", "duplicated", "false_outputs")}
    return {
        "expected_alerts": sum(expected.values()),
        **worst,
        "sinks": sinks,
        "verified": bool(expected) and all(v == 0 for v in worst.values()),
    }


def _verify_windows(run: ChaosRun, client: Any, produced: ProduceConfig, events: int, origin_ms: int) -> dict[str, Any]:
    """``pipeline``: every alert the first ``events`` events must cause, listed once in the
    window of its event time, in each sink — up to the last window a sink holds (later
    windows close only when later events move the watermark: reported as pending)."""
    import psycopg

    from ember.tools.chaos_jobs import PIPELINE_WINDOW_MS

    source = produced.source()
    assert isinstance(source, StateMachineSource)
    expected_all: collections.Counter = collections.Counter()
    for address, kind, ts in source.expected_alert_events(events, origin_ms):
        expected_all[(ts - ts % PIPELINE_WINDOW_MS, f"{address}:{kind}")] += 1
    with psycopg.connect(postgres_url()) as conn:
        pg_rows = conn.execute(f'select window_start, alerts, detail from "{run.table}"').fetchall()
    redis_rows = [(f[b"window_start"], f[b"alerts"], f.get(b"detail", b"")) for _, f in client.xrange(f"{run.prefix}:alerts")]
    sinks: dict[str, dict[str, int]] = {}
    pending: dict[str, int] = {}
    for name, rows in (("postgres", pg_rows), ("redis", redis_rows)):
        got: collections.Counter = collections.Counter()
        miscounted = 0
        for start, alerts, detail in rows:
            text = detail.decode() if isinstance(detail, bytes) else (detail or "")
            items = text.split()
            miscounted += int(alerts) != len(items)
            got.update((int(start), item) for item in items)
        last = max((int(r[0]) for r in rows), default=-1)
        expected = collections.Counter({k: n for k, n in expected_all.items() if k[0] <= last})
        sinks[name] = {**_compare(got, expected), "windows": len(rows), "miscounted_windows": miscounted}
        pending[name] = sum(n for k, n in expected_all.items() if k[0] > last)
    worst = {k: max(s[k] for s in sinks.values()) for k in ("lost", "duplicated", "false_outputs", "miscounted_windows")}
    return {
        "expected_alerts": sum(expected_all.values()),
        **{k: v for k, v in worst.items() if k != "miscounted_windows"},
        "pending_alerts": pending,
        "sinks": sinks,
        "verified": all(s["alerts"] for s in sinks.values()) and all(v == 0 for v in worst.values()),
    }


def _compare(got: collections.Counter, expected: collections.Counter) -> dict[str, int]:
    return {
        "alerts": sum(got.values()),
        "lost": sum(max(0, n - got[k]) for k, n in expected.items()),
        "duplicated": sum(max(0, n - expected[k]) for k, n in got.items() if k in expected),
        "false_outputs": sum(n for k, n in got.items() if k not in expected),
    }


def _cleanup(run: ChaosRun, client: Any) -> None:
    import psycopg

    keys = list(client.scan_iter(f"{run.prefix}:*"))
    if keys:
        client.delete(*keys)
    with psycopg.connect(postgres_url(), autocommit=True) as conn:
        conn.execute(f'drop table if exists "{run.table}"')
