"""``ember bench peers``: Ember, Bytewax and PyFlink side by side on the same events (issue 19).

Two jobs, the same events for every system (peer_events.py: event ``i`` has key ``i % keys``
and event time ``i * 1000 // per_second`` ms):

- **running count**: per key, the count so far, emitted per event (Bytewax ``stateful_map``,
  Flink's rolling ``reduce``, Ember's ``sum(emit="record")``); Ember also with
  ``emit="batch"`` (once per key and micro-batch, combined before the shuffle), Bytewax also
  ``count_final`` (once per key at the end of input) and Flink SQL ``GROUP BY`` (a changelog);
- **1 s tumbling event-time count** per key (monotonous timestamps).

Throughput: each system processes ``events`` and ``events // 5`` events, each run timed from
the start of its process (or ``execute``) to its last result; events/s is the slope,
``0.8 * events / (T(events) - T(events // 5))``, so process, JVM and job start-up — fixed
costs — cancel alike for every system. PyFlink's Python DataStream runs ~10 k events/s here:
it gets ``python_events`` instead (said in each row). Every row is verified against the
events' arithmetic (final counts, the per-record checksum ``sum of outputs``, every window).

Latency: each system's running count and window job again, paced (event ``i`` due at
``start + i / rate`` s of wall time): a running count's latency is its arrival time minus its
event's due time (one output in 97), a window's its arrival minus the window's end. Flink SQL
gets no latency row (its data path has no Python hook to stamp arrivals).

Peers run in their own virtualenvs (``pip install`` on first use, under ``EMBER_PEERS_DIR``,
default ``~/.cache/ember/peers``); this module never imports them.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ember.bench.peers import peer_events as ev
from ember.job import DEFAULT_MAX_PARALLELISM

__all__ = ["PeersConfig", "run_peers", "PEER_PACKAGES", "peer_python", "verify", "merge_tallies", "expected_windows",
           "markdown", "SIZED"]

HERE = Path(__file__).resolve().parent
PEER_PACKAGES = {"bytewax": "bytewax==0.21.1", "pyflink": "apache-flink==2.3.0"}
SMALL = 5  # the short run of each pair has events // SMALL events
# ``ember bench report --peers`` at each report size: (events, python_events, latency_seconds)
SIZED = {"tiny": (200_000, 5_000, 5.0), "quick": (2_000_000, 40_000, 10.0), "full": (10_000_000, 200_000, 20.0)}


@dataclass
class PeersConfig:
    events: int = 10_000_000
    keys: int = 100
    per_second: int = 100_000  # events per second of event time (throughput runs)
    python_events: int = 200_000  # PyFlink's Python DataStream (it runs ~10 k events/s)
    latency_rate: int = 2_000  # events/s of wall time in the paced runs
    latency_seconds: float = 20.0
    systems: tuple[str, ...] = ("ember", "bytewax", "pyflink")
    master: str = "local[2]"
    max_parallelism: int = DEFAULT_MAX_PARALLELISM  # Ember's state buckets (StreamEnvironment(max_parallelism=...))
    timeout_s: float = 1800.0
    verbose: bool = True
    stop_spark: bool = True  # False when the session is shared (ember bench report)
    peers_dir: Path = field(default_factory=lambda: Path(os.environ.get("EMBER_PEERS_DIR", "~/.cache/ember/peers")).expanduser())


def _log(cfg: PeersConfig, msg: str) -> None:
    if cfg.verbose:
        print(f"[ember bench peers] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- virtualenvs
def peer_python(system: str, cfg: PeersConfig) -> Path:
    """The Python of ``system``'s own virtualenv, created and installed on first use."""
    requirement = PEER_PACKAGES[system]
    venv = cfg.peers_dir / system
    python = venv / "bin" / "python"
    stamp = venv / ".ember-installed"
    if stamp.exists() and stamp.read_text() == requirement and python.exists():
        return python
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _log(cfg, f"creating {venv} and installing {requirement} (once; a few minutes for PyFlink) ...")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", requirement],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip install {requirement} failed:\n{done.stderr[-2000:]}")
    stamp.write_text(requirement)
    return python


# --------------------------------------------------------------------------- what each job must output
def expected_windows(events: int, keys: int, per_second: int) -> dict[tuple[int, int], int]:
    """``{(key, window start ms): count}``: window ``j`` holds events ``[j * per_second,
    (j + 1) * per_second)`` (``i * 1000 // per_second >= 1000 j`` exactly when ``i >= j * per_second``)."""
    out: dict[tuple[int, int], int] = {}

    def below(x: int, k: int) -> int:  # events i < x with i % keys == k
        return max(0, (x - k + keys - 1) // keys)

    j = 0
    while j * per_second < events:
        lo, hi = j * per_second, min(events, (j + 1) * per_second)
        for k in range(keys):
            n = below(hi, k) - below(lo, k)
            if n:
                out[(k, j * ev.WINDOW_MS)] = n
        j += 1
    return out


def merge_tallies(paths: list[Path]) -> dict[str, Any]:
    """What every sink partition of one run saw, together."""
    merged: dict[str, Any] = {"outputs": 0, "total": 0, "late": 0, "latest": {}, "windows": [], "latency_ms": [], "last": 0.0}
    for p in paths:
        t = json.loads(p.read_text())
        for k in ("outputs", "total", "late"):
            merged[k] += int(t.get(k) or 0)
        for key, n in t.get("latest", {}).items():
            merged["latest"][int(key)] = max(merged["latest"].get(int(key), 0), int(n))
        merged["windows"] += [tuple(w) for w in t.get("windows", [])]
        merged["latency_ms"] += t.get("latency_ms", [])
        merged["last"] = max(merged["last"], float(t.get("last") or 0.0))
    return merged


def verify(kind: str, tally: dict[str, Any], events: int, keys: int, per_second: int) -> tuple[bool, dict[str, Any]]:
    """Whether a run's output is exactly what its job must produce from ``events`` events.

    ``kind``: ``per-record`` (a running count emitting once per event: final counts, the
    number of outputs and their sum), ``final`` (the last count per key is right: once-per-batch
    or changelog emitters), ``window`` (every window's count, none twice, nothing late)."""
    if kind == "window":
        expected = expected_windows(events, keys, per_second)
        got: dict[tuple[int, int], int] = {}
        twice = 0
        for k, start, n in tally["windows"]:
            twice += (int(k), int(start)) in got
            got[(int(k), int(start))] = int(n)
        ok = got == expected and not twice and not tally.get("late")
        return ok, {"windows": len(got), "expected_windows": len(expected), "duplicated": twice, "late": tally.get("late", 0)}
    final_ok = tally["latest"] == ev.expected_final_counts(events, keys)
    detail: dict[str, Any] = {"keys_counted": len(tally["latest"]), "outputs": tally["outputs"]}
    if kind == "per-record":
        outputs, total = ev.running_count_checksum(events, keys)
        detail.update(expected_outputs=outputs, sum_of_outputs=tally["total"], expected_sum=total)
        return final_ok and tally["outputs"] == outputs and tally["total"] == total, detail
    return final_ok, detail


# --------------------------------------------------------------------------- peers' runs
def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _run_peer(system: str, python: Path, job: dict[str, Any], cfg: PeersConfig, processes: int = 1) -> tuple[dict[str, Any], float]:
    """One run of a peer program: ``(merged tallies, seconds from launch to the last result)``."""
    work = Path(tempfile.mkdtemp(prefix=f"ember-peers-{system}-"))
    try:
        job = dict(job, out=str(work / "tally"), start=time.time() + (1.0 if system == "bytewax" else 0.0))
        if system == "bytewax":
            job["addresses"] = [f"127.0.0.1:{p}" for p in _free_ports(processes)] if processes > 1 else []
        (work / "job.json").write_text(json.dumps(job))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_site_packages(python)), str(HERE)]))
        script = HERE / ("bytewax_job.py" if system == "bytewax" else "pyflink_job.py")
        launched = time.time()
        procs = [subprocess.Popen([str(python), str(script), str(work / "job.json"), str(i)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for i in range(processes)]
        errors = []
        for p in procs:
            try:
                _, err = p.communicate(timeout=cfg.timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
                errors.append(f"timed out after {cfg.timeout_s:.0f} s")
            if p.returncode:
                errors.append(err[-3000:])
        if errors:
            raise RuntimeError(f"{system} run failed ({job['workload']}):\n" + "\n".join(errors))
        tallies = sorted(work.glob("tally.*.json"))
        if not tallies:
            raise RuntimeError(f"{system} run ({job['workload']}) wrote no results")
        merged = merge_tallies(tallies)
        origin = job["start"] if system == "bytewax" else launched
        return merged, merged["last"] - origin
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _site_packages(python: Path) -> Path:
    venv = python.parent.parent
    found = sorted(venv.glob("lib/python*/site-packages"))
    return found[0] if found else venv


# --------------------------------------------------------------------------- Ember's runs
class _Ember:
    """Ember's jobs on one Spark session (the session's start is not timed)."""

    def __init__(self, cfg: PeersConfig) -> None:
        from ember.bench.harness import bench_session

        self.cfg = cfg
        self.spark = bench_session(cfg.master)
        self.native_batch = True

    def run(self, workload: str, events: int, paced: bool = False) -> tuple[dict[str, Any], float, int]:
        """One job: ``(tally, seconds of execute, events processed)``.

        Every job reads a bounded generator of ``events`` events, as the peers' jobs do (the end
        of input closes every window); the running counts without event time (the peers' have
        none). With ``native_batch`` (default), the ``emit="batch"`` count reads the generator compiled to
        Spark's own ``rate-micro-batch`` instead and stops after ``events`` (whole micro-batches:
        the few more processed are counted and verified) — measured faster for it; the
        per-record count is faster on the bounded one, whose Python reader hands the keyed step
        its records already packed per state bucket (source fusion)."""
        from datetime import timedelta

        from ember import Agg, CollectSink, CountSink, GroupingSource, StreamEnvironment, TumblingEventTimeWindows, WatermarkStrategy

        cfg = self.cfg
        ckpt = tempfile.mkdtemp(prefix="ember-peers-")
        try:
            env = StreamEnvironment(master=cfg.master, checkpoint_dir=ckpt, spark=self.spark, max_events_per_batch=2_000_000,
                                    max_parallelism=cfg.max_parallelism)
            rate = cfg.latency_rate if paced else None
            # Paced: event time is wall time from a whole second a little ahead (the job's compile
            # and first batch come before it), so 1 s windows align with the events' own.
            origin = (int(time.time()) + 10) * 1000 if paced else 0
            window = workload == "window"
            bounded = not (self.native_batch and workload == "running-batch" and not paced)
            src = GroupingSource(rate=rate, partitions=self.spark.sparkContext.defaultParallelism, hosts=cfg.keys,
                                 event_time=True, max_events=events if bounded else None, nominal_rate=cfg.per_second,
                                 start_ms=origin)
            if window:
                stream = env.from_source(src, WatermarkStrategy.for_monotonous_timestamps("ts"), name="events")
            else:
                stream = env.from_source(src, name="events")
            rows = stream.select("host_id AS key", "1 AS n", "ts", name="ones")
            count_sink = CountSink(sum_field="n")
            sink = CollectSink()
            if window:
                (rows.key_by("key").window(TumblingEventTimeWindows.of(timedelta(milliseconds=ev.WINDOW_MS)))
                 .aggregate(n=Agg.count(), name="per-second").sink_to(sink))
            elif workload == "running" and not paced:  # 10 M outputs: counted and summed; the last per key collected
                counts = rows.key_by("key").sum("n", name="running-count")
                counts.sink_to(count_sink)
                counts.filter(f"n >= {max(1, events // cfg.keys)}", name="final-counts").sink_to(sink)
            else:
                emit = "batch" if workload == "running-batch" else "record"
                rows.key_by("key").sum("n", emit=emit, name="running-count").sink_to(sink)
            started = time.time()
            result = env.execute(f"peers-{workload}", progress=False, max_events=None if bounded else events)
            seconds = time.time() - started
            return self._tally(workload, sink, count_sink, paced, origin), seconds, int(result.events)
        finally:
            shutil.rmtree(ckpt, ignore_errors=True)

    def _tally(self, workload: str, sink: Any, count_sink: Any, paced: bool, origin_ms: int) -> dict[str, Any]:
        cfg = self.cfg
        t: dict[str, Any] = {"outputs": 0, "total": 0, "late": 0, "latest": {}, "windows": [], "latency_ms": [], "last": 0.0}
        for batch in sink.batches:
            for r in batch.rows:
                t["outputs"] += 1
                if workload == "window":
                    t["windows"].append((r["key"], r["window_start"] - origin_ms, r["n"]))
                    if paced:
                        t["latency_ms"].append(batch.arrival_ms - (r["window_start"] + ev.WINDOW_MS))
                    continue
                key, n = int(r["key"]), int(r["n"])
                t["total"] += n
                t["latest"][key] = max(t["latest"].get(key, 0), n)
                if paced and n % 97 == 0:
                    due = origin_ms + ev.event_index(key, n, cfg.keys) * 1000 / cfg.latency_rate
                    t["latency_ms"].append(batch.arrival_ms - due)
        if workload == "running" and not paced:  # the sink kept only the last counts; all outputs counted here
            t["outputs"], t["total"] = count_sink.count, count_sink.total
        return t

    def stop(self) -> None:
        self.spark.stop()


# --------------------------------------------------------------------------- the whole comparison
# (system, job label, workload, verification kind, runner kwargs)
THROUGHPUT_JOBS: list[tuple[str, str, str, str, dict[str, Any]]] = [
    ("ember", "running count, per record (sum, emit='record')", "running", "per-record", {}),
    ("ember", "running count, per key and micro-batch (emit='batch')", "running-batch", "final", {}),
    ("ember", "1 s tumbling window count (native window)", "window", "window", {}),
    ("bytewax", "running count, per record (stateful_map), 1 process", "running", "per-record", {"processes": 1}),
    ("bytewax", "running count, per record (stateful_map), 2 processes", "running", "per-record", {"processes": 2}),
    ("bytewax", "final count, once per key at the end (count_final), 1 process", "final", "final", {"processes": 1}),
    ("bytewax", "1 s tumbling window count (count_window), 1 process", "window", "window", {"processes": 1}),
    ("bytewax", "1 s tumbling window count (count_window), 2 processes", "window", "window", {"processes": 2}),
    ("pyflink", "running count, per record (Python DataStream reduce, thread mode)", "running", "per-record", {"api": "datastream"}),
    ("pyflink", "1 s tumbling window count (Python DataStream window)", "window", "window", {"api": "datastream"}),
    ("pyflink", "running count (Flink SQL GROUP BY, JVM only, changelog)", "running", "final", {"api": "sql"}),
    ("pyflink", "1 s tumbling window count (Flink SQL TUMBLE, JVM only)", "window", "window", {"api": "sql"}),
]
LATENCY_JOBS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("ember", "running count, per record", "running", {}),
    ("ember", "1 s tumbling window count", "window", {}),
    ("bytewax", "running count, per record, 1 process", "running", {"processes": 1}),
    ("bytewax", "1 s tumbling window count, 1 process", "window", {"processes": 1}),
    ("pyflink", "running count, per record (Python DataStream)", "running", {"api": "datastream"}),
    ("pyflink", "1 s tumbling window count (Python DataStream)", "window", {"api": "datastream"}),
]


def run_peers(cfg: PeersConfig) -> dict[str, Any]:
    """Every system's jobs, throughput then latency; returns the report (``--json``)."""
    unknown = set(cfg.systems) - {"ember", *PEER_PACKAGES}
    if unknown:
        raise ValueError(f"unknown systems {sorted(unknown)}: choose among ember, {', '.join(PEER_PACKAGES)}")
    pythons = {s: peer_python(s, cfg) for s in cfg.systems if s in PEER_PACKAGES}
    ember = _Ember(cfg) if "ember" in cfg.systems else None
    if ember is not None:  # Spark's first job in a session starts its Python workers: not timed
        _log(cfg, "ember: a warm-up job (not timed) ...")
        for workload in ("running", "window"):
            ember.run(workload, 10_000)
    report: dict[str, Any] = {
        "events": cfg.events, "keys": cfg.keys, "per_second": cfg.per_second, "python_events": cfg.python_events,
        "latency_rate": cfg.latency_rate, "latency_seconds": cfg.latency_seconds,
        "ember_max_parallelism": cfg.max_parallelism, "cores": os.cpu_count(),
        "machine": f"{platform.node()} {os.cpu_count()} cpus {platform.machine()} Python {platform.python_version()}",
        "packages": {s: PEER_PACKAGES[s] for s in pythons}, "throughput": [], "latency": [],
    }
    try:
        for system, label, workload, kind, kw in THROUGHPUT_JOBS:
            if system not in cfg.systems:
                continue
            n = cfg.python_events if system == "pyflink" and kw.get("api") == "datastream" else cfg.events
            one: Run
            if system == "ember":
                assert ember is not None
                one = _ember_runner(ember, workload)
            else:
                one = _peer_runner(system, pythons[system], workload, cfg, kw)
            _log(cfg, f"{system}: {label}: {n // SMALL:,} then {n:,} events ...")
            try:
                row = _throughput_row(system, label, workload, kind, n, one, cfg)
            except Exception as exc:  # one system's failure is its row's, not the comparison's
                row = {"system": system, "job": label, "workload": workload, "events": n, "events_per_second": None,
                       "seconds": {"small": None, "full": None}, "verified": False, "error": str(exc)[-2000:]}
            _log(cfg, f"  failed: {row['error']}" if "error" in row else
                 f"  {row['events_per_second'] or 'n/a'} events/s (runs {row['seconds']['small']} s, "
                 f"{row['seconds']['full']} s), verified: {row['verified']}")
            report["throughput"].append(row)
        paced_events = int(cfg.latency_rate * cfg.latency_seconds)
        for system, label, workload, kw in LATENCY_JOBS:
            if system not in cfg.systems:
                continue
            _log(cfg, f"{system}: {label}: paced at {cfg.latency_rate:,} events/s for {cfg.latency_seconds:.0f} s ...")
            try:
                if system == "ember":
                    assert ember is not None
                    tally, _, _ = ember.run(workload, paced_events, paced=True)
                else:
                    tally, _, _ = _peer_runner(system, pythons[system], workload, cfg, kw, paced=True)(paced_events)
                ok, detail = verify("per-record" if workload == "running" else "window", tally, paced_events, cfg.keys,
                                    cfg.latency_rate)
                row = {"system": system, "job": label, "workload": workload, "events": paced_events,
                       "latency_ms": ev.percentiles(tally["latency_ms"]), "verified": ok, "detail": detail}
            except Exception as exc:
                row = {"system": system, "job": label, "workload": workload, "events": paced_events, "latency_ms": {},
                       "verified": False, "error": str(exc)[-2000:]}
            _log(cfg, f"  failed: {row['error']}" if "error" in row else f"  latency {row['latency_ms']}, verified: {row['verified']}")
            report["latency"].append(row)
    finally:
        if ember is not None and cfg.stop_spark:
            ember.stop()
    report["verified"] = all(r["verified"] for r in report["throughput"] + report["latency"])
    return report


Run = Callable[[int], tuple[dict[str, Any], float, int]]  # events asked -> (tally, seconds, events processed)


def _ember_runner(ember: _Ember, workload: str) -> Run:
    def one(n: int) -> tuple[dict[str, Any], float, int]:
        return ember.run(workload, n)

    return one


def markdown(report: dict[str, Any]) -> list[str]:
    """The report's two tables (throughput, paced latency) as Markdown lines."""
    lines = ["| system | job | events | events/s (slope) | runs (s) | verified |", "|---|---|---|---|---|---|"]
    for r in report["throughput"]:
        eps = f"{r['events_per_second']:,}" if r["events_per_second"] else "n/a"
        runs = f"failed: {r['error'].splitlines()[0]}" if r.get("error") else f"{r['seconds']['small']} / {r['seconds']['full']}"
        lines.append(f"| {r['system']} | {r['job']} | {r['events']:,} | {eps} | {runs} | {'yes' if r['verified'] else 'no'} |")
    lines += ["", f"| system | job (paced at {report['latency_rate']:,} events/s for {report['latency_seconds']:g} s) | "
                  "p50 ms | p90 ms | p99 ms | verified |", "|---|---|---|---|---|---|"]
    for r in report["latency"]:
        q = r["latency_ms"]
        lines.append(f"| {r['system']} | {r['job']} | {q.get('p50', 'n/a')} | {q.get('p90', 'n/a')} | {q.get('p99', 'n/a')} | "
                     f"{'yes' if r['verified'] else 'no'} |")
    return lines


def _peer_runner(system: str, python: Path, workload: str, cfg: PeersConfig, kw: dict[str, Any],
                 paced: bool = False) -> Run:
    def one(n: int) -> tuple[dict[str, Any], float, int]:
        job = {"workload": workload, "events": n, "keys": cfg.keys, "paced": paced, "batch": 10_000,
               "per_second": cfg.latency_rate if paced else cfg.per_second, "api": kw.get("api", "datastream"),
               "parallelism": kw.get("parallelism", os.cpu_count() or 2), "processes": kw.get("processes", 1)}
        tally, seconds = _run_peer(system, python, job, cfg, processes=int(kw.get("processes", 1)) if system == "bytewax" else 1)
        return tally, seconds, n

    return one


def _throughput_row(system: str, label: str, workload: str, kind: str, n: int, one: Run, cfg: PeersConfig) -> dict[str, Any]:
    tally_small, t_small, n_small = one(n // SMALL)
    tally, t_full, n_full = one(n)
    ok_small, _ = verify(kind, tally_small, n_small, cfg.keys, cfg.per_second)
    ok, detail = verify(kind, tally, n_full, cfg.keys, cfg.per_second)
    slope = t_full - t_small
    return {
        "system": system, "job": label, "workload": workload, "events": n_full,
        "events_per_second": round((n_full - n_small) / slope) if slope > 0 else None,
        "seconds": {"small": round(t_small, 2), "full": round(t_full, 2)},
        "events_small": n_small,
        "events_per_second_full_run": round(n_full / t_full) if t_full > 0 else None,
        "verified": ok and ok_small, "detail": detail,
    }
