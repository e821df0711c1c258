"""What watching a job costs (issue 20, docs/dashboard.md): the same jobs with and without
``ui=`` (every step's rows counted as observed metrics, the page served and polled), rounds
alternating in one process after a discarded warm-up, medians of events/s over the batches
after the first two:

- ``yahoo``: the demo's pipeline (filter, projection, lookup join, native 10 s window) at
  unbounded rate;
- ``keyed``: E4 events -> the state machine (a Python keyed step) at unbounded rate.

    python benchmarks/dashboard_overhead.py --duration 20 --rounds 3 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import timedelta

import pandas as pd

from ember import TumblingEventTimeWindows, WatermarkStrategy, YahooSource
from ember.api.environment import StreamEnvironment
from ember.bench.harness import bench_session
from ember.bench.jobs import ALERT_SCHEMA, StateMachine
from ember.connectors.generators import StateMachineSource
from ember.connectors.sinks import NoopSink

PER_BATCH = 500_000


def build(env: StreamEnvironment, job: str) -> None:
    if job == "yahoo":
        src = YahooSource(rate=None, partitions=2, nominal_rate=PER_BATCH // 2)
        campaigns = pd.DataFrame(src.campaign_table(), columns=["ad_id", "campaign_id"])
        (env.from_source(src, WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "event_time"))
         .filter("event_type = 'view'").select("ad_id", "CAST(event_time AS BIGINT) AS event_time")
         .join_lookup(campaigns, on="ad_id").key_by("campaign_id")
         .window(TumblingEventTimeWindows.of(timedelta(seconds=10))).count().sink_to(NoopSink()))
    else:
        src = StateMachineSource(rate=None, partitions=2, invalid_rate=0.0005, nominal_rate=PER_BATCH // 2)
        (env.from_source(src, WatermarkStrategy.for_monotonous_timestamps("ts"))
         .key_by("address").process(StateMachine(), ALERT_SCHEMA).sink_to(NoopSink()))


def run(spark, job: str, ui: bool, duration: float) -> float:
    env = StreamEnvironment(checkpoint_dir=tempfile.mkdtemp(prefix="ember-ui-bench-"), spark=spark,
                            max_events_per_batch=PER_BATCH)
    build(env, job)
    done = threading.Event()

    def watch() -> None:  # a browser's load: the page polls /api/job once a second, Prometheus /metrics too
        while not done.is_set():
            board = env.dashboard
            if board is not None:
                for path in ("api/job", "metrics"):
                    try:
                        urllib.request.urlopen(board.url + path, timeout=5).read()
                    except OSError:
                        pass
            time.sleep(1.0)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = env.execute(f"ui-{job}", duration_s=duration, progress=False, min_batches=4, ui=0 if ui else False)
    finally:
        done.set()
    steady = [p for p in result.progress[2:] if p.get("numInputRows")]  # after start-up
    seconds = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
    return sum(int(p["numInputRows"]) for p in steady) / seconds if seconds else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jobs", nargs="*", default=["yahoo", "keyed"])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spark = bench_session("local[*]")
    out = {}
    for job in args.jobs:
        run(spark, job, False, min(args.duration, 10.0))  # warm-up (JIT, Python workers), discarded
        rates: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(args.rounds):
            for side in (("off", "on") if i % 2 == 0 else ("on", "off")):
                rates[side].append(run(spark, job, side == "on", args.duration))
                print(f"{job} ui {side}: {rates[side][-1]:,.0f} events/s", file=sys.stderr, flush=True)
        off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
        out[job] = {"events_per_second_ui_off": off, "events_per_second_ui_on": on, "ratio_on_off": on / off if off else None,
                    "rounds": rates}
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
