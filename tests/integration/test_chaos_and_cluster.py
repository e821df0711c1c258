"""Exactly-once under SIGKILL (the E4 chaos smoke) and the same job on a real
Spark standalone cluster, against the real Redis and PostgreSQL of this machine.

Both run the job in child processes: a process holds one SparkContext, and the
test session's is local. ``test_long_chaos_on_the_cluster`` is the long run of
``make chaos`` (marked slow).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import psycopg
import pytest
import redis

from ember.connectors.external import postgres_url, redis_url
from ember.tools.chaos import ChaosConfig, run_chaos
from ember.tools.cluster import LocalCluster
from ember.tools.produce import ProduceConfig, produce


def _assert_exact(report: dict) -> None:
    assert report["verified"] is True, report
    assert report["expected_alerts"] > 0
    for sink in ("postgres", "redis"):
        got = report["sinks"][sink]
        assert (got["lost"], got["duplicated"], got["false_outputs"]) == (0, 0, 0), report
        assert got["alerts"] == report["expected_alerts"]
    assert report["recovery_ms"]["p50"] is not None and report["recovery_ms"]["max"] >= report["recovery_ms"]["p50"]


def test_chaos_smoke_a_driver_kill_exact_alerts():
    """One SIGKILL of the driver mid-run, a standby driver beside it taking over (it stands down
    once the job has drained the streams and stopped); repeated kills of the driver, executors
    and workers are `make chaos` (24 kills, BENCHMARKS.md)."""
    report = run_chaos(ChaosConfig(kills=1, duration_s=8, rate=5_000, batch=20_000, seed=7, verbose=False,
                                   ui_port=_free_port(), keep=True, standby=True))
    try:  # every run served its dashboard on the same port; the restart is in the runs it shows
        with open(os.path.join(report["work_dir"], "checkpoints", "chaos", "ember", "dashboard-runs.json")) as f:
            runs = json.load(f)
    finally:
        shutil.rmtree(report["work_dir"], ignore_errors=True)
    assert [r["attempt"] for r in runs] == [1, 2], runs
    assert "without stopping" in runs[0]["ended"] and runs[1]["ended"].startswith("stopped:"), runs
    assert report["kills"] == 1 and report["killed"] == {"driver": 1}
    assert "unrecovered_kills" not in report
    _assert_exact(report)
    phases = report["recovery_phases_ms"]  # until the new process starts its query, then its first commit
    assert phases["restart"]["p50"] > 0 and phases["first_batch"]["p50"] > 0
    assert abs(phases["restart"]["p50"] + phases["first_batch"]["p50"] - report["recovery_ms"]["p50"]) <= 1


@pytest.mark.slow
def test_chaos_pipeline_of_three_stateful_steps_a_driver_kill_exact_alerts():
    """The same with dedupe -> state machine -> 1 s windows chained in one query (issue 17):
    every alert exactly once in its window, in both sinks, up to the last window emitted.
    Slow (~90 s: `make test-all`); the smoke above covers the kill-and-restart path in CI."""
    report = run_chaos(ChaosConfig(workload="pipeline", kills=1, duration_s=10, rate=5_000, batch=20_000, seed=7,
                                   verbose=False))
    assert report["kills"] == 1 and "unrecovered_kills" not in report
    assert report["verified"] is True, report
    for sink in ("postgres", "redis"):
        got = report["sinks"][sink]
        assert (got["lost"], got["duplicated"], got["false_outputs"], got["miscounted_windows"]) == (0, 0, 0, 0), report
        assert got["alerts"] > 0 and got["windows"] > 0
        # what is still pending are the alerts of windows after the last one emitted
        assert got["alerts"] + report["pending_alerts"][sink] == report["expected_alerts"], report


@pytest.mark.slow
def test_chaos_fan_out_a_driver_kill_exact_alerts_per_lane():
    """A fan-out (issue 17): a dedupe read by two state machines, lanes of one Spark operator,
    one lane's alerts to PostgreSQL, the other's to Redis — each exactly once through a driver
    kill. Slow (`make test-all`)."""
    report = run_chaos(ChaosConfig(workload="fanout", kills=1, duration_s=10, rate=5_000, batch=20_000, seed=7,
                                   verbose=False))
    assert report["kills"] == 1 and "unrecovered_kills" not in report
    _assert_exact(report)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run_job(master: str, workdir: str, prefix: str, table: str, alerts: str, layout: str = "blob") -> list[dict]:
    """Runs the job with its dashboard on; the snapshots its /api/job served while it ran."""
    env = dict(os.environ, EMBER_CHAOS_PREFIX=prefix, EMBER_CHAOS_PARTITIONS="2", EMBER_CHAOS_TABLE=table,
               EMBER_CHAOS_ALERTS=alerts, EMBER_CHAOS_BATCH="20000", PYSPARK_PYTHON=sys.executable)
    port = _free_port()
    cmd = [sys.executable, "-m", "ember.cli", "run", "ember.tools.chaos_jobs:statemachine", "--master", master,
           "--checkpoint-dir", workdir, "--name", "sm", "--stop-when-idle", "3", "--ui", "--ui-port", str(port), "--state-layout", layout]
    snapshots = []
    with tempfile.TemporaryFile("w+") as out:
        job = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 600
        while job.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/job", timeout=5) as page:
                    snapshots.append(json.load(page))
            except OSError:
                pass  # not serving yet, or already stopped
            time.sleep(0.5)
        if job.poll() is None:
            job.kill()
        job.wait()
        out.seek(0)
        assert job.returncode == 0, out.read()[-6000:]
    return snapshots


@pytest.mark.parametrize("layout", [pytest.param("blob", marks=pytest.mark.slow), "delta"])
def test_state_machine_on_a_standalone_cluster_gives_exactly_the_expected_alerts(tmp_path, layout):
    """On two workers, each with its own directory for the delta layout's working copies
    (as if on two machines): the state partitions ran on both, the alerts are exact."""
    client = redis.Redis.from_url(redis_url())
    prefix = f"ember:test:cluster:{uuid.uuid4().hex[:8]}"
    produced = ProduceConfig("statemachine", prefix=prefix, partitions=2, events=60_000, invalid_rate=0.002)
    produce(produced)
    expected = collections.Counter(produced.source().expected_alerts(60_000))
    assert sum(expected.values()) > 20
    results = {}
    try:
        with LocalCluster(workers=2, cores=1) as cluster:
            assert cluster.alive_workers() == 2
            seen = _run_job(cluster.url, str(tmp_path / "cluster"), prefix, f"ember_cl_{prefix[-8:]}_c", f"{prefix}:alerts:c", layout)
            if layout == "delta":
                spread = cluster.state_copies()
                assert sum(spread.values()) > 0 and all(spread.values()), spread
            # its dashboard served from the driver while the job ran on the cluster
            assert seen and all(s["master"] in (None, cluster.url) for s in seen)
            assert any(s["status"] == "running" and s["events_total"] > 0 for s in seen), seen[-1:]
            apps, deadline = [], time.monotonic() + 20
            while not apps and time.monotonic() < deadline:  # the master lists a finished app a moment later
                status = cluster.status()
                apps = status.get("completedapps", []) + status.get("activeapps", [])
                time.sleep(0 if apps else 0.5)
            assert apps, "the job did not run as an application of the cluster"
        # The same job in local mode gives the same alerts: the chaos smoke above checks them
        # against the generator too, so the cluster run is checked against the generator only.
        with psycopg.connect(postgres_url()) as conn:
            for mode in ("c",):
                rows = conn.execute(f'select address, state, type from "ember_cl_{prefix[-8:]}_{mode}"').fetchall()
                in_redis = [
                    (int(f[b"address"]), f[b"state"].decode(), int(f[b"type"]))
                    for _, f in client.xrange(f"{prefix}:alerts:{mode}")
                ]
                results[mode] = (collections.Counter((int(a), s, int(t)) for a, s, t in rows), collections.Counter(in_redis))
    finally:
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        with psycopg.connect(postgres_url(), autocommit=True) as conn:
            conn.execute(f'drop table if exists "ember_cl_{prefix[-8:]}_c"')
    assert results["c"] == (expected, expected)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_long_chaos_on_the_cluster():
    """>= 20 kills of the driver, executors and workers over >= 10 minutes (``make chaos``)."""
    kills = int(os.environ.get("EMBER_CHAOS_KILLS", "24"))
    duration = float(os.environ.get("EMBER_CHAOS_DURATION", "660"))
    report = run_chaos(ChaosConfig(kills=kills, duration_s=duration, rate=5_000, batch=20_000, cluster=True, verbose=True))
    print("\nember chaos report:", json.dumps(report))
    assert report["kills"] == kills and report["seconds"] >= duration
    assert set(report["killed"]) == {"driver", "executor", "worker"}
    _assert_exact(report)
