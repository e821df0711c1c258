"""``ember bench peers``' Bytewax program: run by the peer's own virtualenv, not by Ember.

    python bytewax_job.py CONFIG_JSON PROC_ID

CONFIG_JSON: ``{"workload": "running"|"final"|"window", "events", "keys", "per_second",
"paced", "processes", "addresses", "batch", "out"}``. Each process writes
``<out>.<proc_id>.json`` with what its sink partitions saw (counts, sums, per-key maxima or
window counts, latency samples) and the wall time of its first and last event; the caller
merges and verifies them (ember/bench/peers/runner.py).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import DynamicSource, StatelessSourcePartition
from bytewax.operators.windowing import EventClock, TumblingWindower, count_window
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.testing import cluster_main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_events import WINDOW_MS, event_index, key_of, time_of  # noqa: E402

EPOCH = datetime(2026, 1, 1, tzinfo=timezone.utc)
SAMPLE = 97  # latency: one output in SAMPLE (a prime, so every key is sampled)


class Events(StatelessSourcePartition):
    """This worker's share of the events (i = worker, worker + workers, ...), in batches;
    paced: event i is not emitted before ``start + i / per_second``."""

    def __init__(self, cfg: dict, worker: int, workers: int, start: float) -> None:
        self.i, self.step, self.n = worker, workers, cfg["events"]
        self.keys, self.ps, self.batch = cfg["keys"], cfg["per_second"], cfg["batch"]
        self.paced, self.start = cfg["paced"], start
        self.first: float | None = None

    def next_batch(self) -> list:
        if self.i >= self.n:
            raise StopIteration
        if self.first is None:
            self.first = time.time()
        hi = min(self.n, self.i + self.batch * self.step)
        if self.paced:
            due = self.start + hi / self.ps
            now = time.time()
            if due > now:
                hi = max(self.i + self.step, int((now - self.start) * self.ps) + 1)
                hi = min(hi, self.n)
        keys, ps = self.keys, self.ps
        out = [(str(key_of(i, keys)), time_of(i, ps)) for i in range(self.i, hi, self.step)]
        self.i = self.i + len(out) * self.step
        return out

    def next_awake(self) -> datetime | None:
        if not self.paced or self.i >= self.n:
            return None
        return datetime.fromtimestamp(self.start + self.i / self.ps, tz=timezone.utc)


class Source(DynamicSource):
    def __init__(self, cfg: dict, start: float) -> None:
        self.cfg, self.start = cfg, start

    def build(self, step_id: str, worker_index: int, worker_count: int) -> Events:
        return Events(self.cfg, worker_index, worker_count, self.start)


class Tally(StatelessSinkPartition):
    """Counts, sums, per-key maxima / window counts and sampled latencies of what arrives."""

    def __init__(self, cfg: dict, path: str, start: float) -> None:
        self.cfg, self.path, self.start = cfg, path, start
        self.outputs = self.total = self.late = 0
        self.latest: dict[str, int] = {}
        self.windows: list = []
        self.latency: list[float] = []
        self.last = 0.0

    def write_batch(self, items: list) -> None:
        now = time.time()
        self.last = now
        self.outputs += len(items)
        cfg = self.cfg
        if cfg["workload"] == "window":
            for key, (_, count, start_ms) in items:
                if count is None:  # a late event
                    self.late += 1
                    continue
                self.windows.append((int(key), start_ms, count))
                if cfg["paced"]:
                    self.latency.append((now - self.start) * 1000 - (start_ms + WINDOW_MS))
            return
        latest = self.latest
        for key, count in items:
            self.total += count
            if count > latest.get(key, 0):
                latest[key] = count
            if cfg["paced"] and count % SAMPLE == 0:
                i = event_index(int(key), count, cfg["keys"])
                self.latency.append((now - self.start - i / cfg["per_second"]) * 1000)

    def close(self) -> None:
        Path(self.path).write_text(json.dumps({
            "outputs": self.outputs, "late": self.late, "total": self.total, "latest": self.latest, "windows": self.windows,
            "latency_ms": self.latency, "last": self.last}))


class Sink(DynamicSink):
    def __init__(self, cfg: dict, proc: int, start: float) -> None:
        self.cfg, self.proc, self.start = cfg, proc, start

    def build(self, step_id: str, worker_index: int, worker_count: int) -> Tally:
        return Tally(self.cfg, f"{self.cfg['out']}.{worker_index}.json", self.start)


def _count(state: int | None, _value: object) -> tuple[int, int]:
    n = (state or 0) + 1
    return n, n


def flow(cfg: dict, proc: int, start: float) -> Dataflow:
    f = Dataflow("peers")
    events = op.input("events", f, Source(cfg, start))
    if cfg["workload"] == "window":
        # The watermark is the latest event time seen (for_monotonous_timestamps, as Ember's and
        # Flink's jobs here): a clock that stands still. Bytewax's default clock also advances the
        # watermark with the system clock between a key's events, which makes every event that
        # reaches the window after its due time late (and dropped) in a paced run. Paced, event
        # time counts from ``start``, so windows align with the events' own.
        origin = datetime.fromtimestamp(start, tz=timezone.utc) if cfg["paced"] else EPOCH
        clock = EventClock(lambda e: origin + timedelta(milliseconds=e[1]), wait_for_system_duration=timedelta(0),
                           now_getter=lambda: EPOCH, to_system_utc=lambda _: None)
        windower = TumblingWindower(length=timedelta(milliseconds=WINDOW_MS), align_to=origin)
        counted = count_window("count", events, clock, windower, lambda e: e[0])
        # a tumbling window's id counts windows from align_to: its start is id * length
        rows = op.map("row", counted.down, lambda kv: (kv[0], (kv[1][0], kv[1][1], kv[1][0] * WINDOW_MS)))
        late = op.map("late-row", counted.late, lambda kv: (kv[0], (kv[1][0], None, None)))
        rows = op.merge("rows", rows, late)
        op.output("tally", rows, Sink(cfg, proc, start))
    elif cfg["workload"] == "final":
        counted = op.count_final("count", events, lambda e: e[0])
        op.output("tally", counted, Sink(cfg, proc, start))
    else:
        keyed = op.key_on("key", events, lambda e: e[0])
        counted = op.stateful_map("count", keyed, _count)
        op.output("tally", counted, Sink(cfg, proc, start))
    return f


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    proc = int(sys.argv[2])
    start = float(cfg["start"])
    while time.time() < start:  # every process starts its clock at the same instant
        time.sleep(0.001)
    cluster_main(flow(cfg, proc, start), cfg["addresses"], proc)


if __name__ == "__main__":
    main()
