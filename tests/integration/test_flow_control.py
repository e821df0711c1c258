"""Flow control (issue 4): a sink slower than the source. Input keeps arriving in Redis
faster than the sink writes; admission control bounds every batch, lag is reported and
grows, then drains; memory stays bounded; nothing crashes and nothing is lost."""

import os
import threading
import time

import pytest

from ember import RedisSink, RedisStreamSource
from ember.tools.produce import STATEMACHINE_SCHEMA, ProduceConfig, produce, stream_names

pytestmark = pytest.mark.spark

BOUND = 4_000  # records per micro-batch (admission control)
RATE, SECONDS = 25_000, 4  # produced events/s, for this long
SINK_ROW_S = 2e-4  # the sink spends this per row: ~5 k rows/s per task, ~10 k/s with 2 tasks


def _tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and all its descendants (the JVM, Spark's Python workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return total


def test_slow_sink_throttles_the_source_with_bounded_memory_and_no_loss(env, r, prefix):
    counter = f"{prefix}:written"

    def slow_write(pipe, row):
        time.sleep(SINK_ROW_S)
        pipe.incr(counter)

    produced = ProduceConfig("statemachine", prefix=prefix, partitions=2, rate=RATE, duration_s=SECONDS)
    report = {}
    feeder = threading.Thread(target=lambda: report.update(done=produce(produced)), daemon=True)
    feeder.start()
    while r.xlen(stream_names(prefix, 2)[0]) < 100:  # the source must find input at its first batch
        time.sleep(0.02)

    # Memory once warm (JVM heap grown, Python workers started: after the 3rd batch)
    # against its peak while the backlog grows and drains.
    warm, peak, stop = [0], [0], threading.Event()
    progress = []

    def sample():
        while not stop.is_set():
            rss = _tree_rss_bytes(os.getpid())
            if sum(1 for p in progress if p["numInputRows"]) >= 3:
                warm[0] = warm[0] or rss
                peak[0] = max(peak[0], rss)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    source = RedisStreamSource(stream_names(prefix, 2), STATEMACHINE_SCHEMA, max_records_per_batch=BOUND)
    env.from_source(source, None, name="events").sink_to(RedisSink(slow_write), name="slow")
    result = env.execute("flow", progress=progress.append, stop_when_idle=3)
    stop.set()
    sampler.join()
    feeder.join()

    events = report["done"].events
    assert events == RATE * SECONDS
    assert int(r.get(counter)) == events == result.events  # nothing lost, nothing twice
    batches = [p for p in progress if p["numInputRows"]]
    assert max(p["numInputRows"] for p in batches) <= BOUND  # admission control held every batch
    lags = [p["lag"] for p in batches]
    assert max(lags) > 5 * BOUND  # the source was throttled: input waited in Redis, not in memory
    assert lags[-1] == 0
    growth = peak[0] - warm[0]
    print(f"\nflow control: {events:,} events, {len(batches)} batches, max lag {max(lags):,}, "
          f"RSS warm {warm[0] / 2**20:.0f} MiB, peak {peak[0] / 2**20:.0f} MiB")
    assert warm[0] > 0 and growth < 256 * 2**20  # memory does not follow the backlog
