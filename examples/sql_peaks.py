"""SQL between keyed steps: clicks deduplicated by a process function, counted per user and
second by an Ember window, then each user's busiest second per 5 s found by Spark SQL over the
window's results — whose ``rowtime`` is their Flink timestamp (``window_end - 1``), no field of
theirs — and last a process function marking each user's new records, reading the query's
rows by the ``rowtime`` it selects. The result is checked against the same figures computed in
plain Python.

    python examples/sql_peaks.py
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from datetime import timedelta

from ember import (
    AggregateFunction,
    CollectSink,
    KeyedProcessFunction,
    ScriptedSource,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from ember.state import StateTtlConfig, ValueStateDescriptor

SCHEMA = "ts bigint, user string, click_id bigint"
BOUND_MS = 500


def clicks(seed: int = 7, batches: int = 8, per_batch: int = 40) -> list[list[tuple]]:
    """Clicks of three users over ~16 s, slightly out of order (within the bound), with some
    redelivered (the same click id again, in the same or a later batch)."""
    rng = random.Random(seed)
    out: list[list[tuple]] = []
    sent: list[tuple] = []
    front, next_id = 0, 0
    for _ in range(batches):
        batch = []
        for _ in range(per_batch):
            front += rng.randint(0, 100)
            click = (max(0, front - rng.randint(0, BOUND_MS)), rng.choice(["ann", "bob", "cem"]), next_id)
            next_id += 1
            batch.append(click)
            sent.append(click)
        batch += rng.sample(sent, 5)  # redelivered
        out.append(batch)
    return out


class FirstDelivery(KeyedProcessFunction):
    """Forwards a click the first time its id arrives (the id remembered for a minute)."""

    def open(self, ctx):
        self.seen = ctx.get_state(ValueStateDescriptor("seen", ttl=StateTtlConfig.of(timedelta(minutes=1))))

    def process_element(self, click, ctx):
        if self.seen.value() is None:
            self.seen.update(True)
            yield click


class Count(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, acc):
        return acc + 1

    def merge(self, a, b):
        return a + b

    def get_result(self, acc):
        return {"n": acc}


PEAKS = """
    SELECT user, unix_millis(window.start) AS start_ms, max(n) AS peak, sum(n) AS total,
           window.end - INTERVAL 1 MILLISECOND AS rowtime
    FROM per_second
    GROUP BY user, window(rowtime, '5 seconds')
"""
OUT = "user string, start_ms bigint, peak bigint, total bigint, record boolean"


class NewRecord(KeyedProcessFunction):
    """Each 5 s window's figures, marked ``record`` when its peak beats the user's best so far
    (windows reach it in event-time order)."""

    def open(self, ctx):
        self.best = ctx.get_state(ValueStateDescriptor("best", default=0))

    def process_element(self, row, ctx):
        record = row["peak"] > self.best.value()
        if record:
            self.best.update(row["peak"])
        yield {"user": row["user"], "start_ms": row["start_ms"], "peak": row["peak"], "total": row["total"],
               "record": record}


def run(batches: list[list[tuple]] | None = None) -> list[dict]:
    """The job's rows: per user and 5 s window, the busiest second's count, the total and
    whether the peak is the user's record so far."""
    batches = batches if batches is not None else clicks()
    root = tempfile.mkdtemp(prefix="ember-sql-peaks-")
    try:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2)
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND_MS), "ts")
        (env.from_source(ScriptedSource(batches, SCHEMA), strategy, name="clicks")
         .key_by("click_id").process(FirstDelivery(), SCHEMA, name="first-delivery")
         .key_by("user").window(TumblingEventTimeWindows.of(1_000)).aggregate(Count(), output_schema="n bigint", name="per-second")
         .select("user", "n").create_view("per_second"))
        sink = CollectSink()
        env.sql(PEAKS, name="peaks").key_by("user").process(NewRecord(), OUT, name="new-record").sink_to(sink)
        env.execute("sql-peaks", progress=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return sorted(sink.rows(), key=lambda r: (r["user"], r["start_ms"]))


def expected(batches: list[list[tuple]]) -> list[dict]:
    """The same figures in plain Python: distinct click ids, counted per user and second,
    then per user and 5 s the largest count, the sum, and whether it beats the user's earlier
    windows' peaks."""
    first: dict[int, tuple] = {}
    for batch in batches:
        for click in batch:
            first.setdefault(click[2], click)
    per_second = Counter((user, ts // 1_000) for ts, user, _ in first.values())
    peaks: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for (user, second), n in per_second.items():
        acc = peaks[(user, second // 5 * 5_000)]
        acc[0], acc[1] = max(acc[0], n), acc[1] + n
    out, best = [], defaultdict(int)
    for (u, s), (p, t) in sorted(peaks.items()):
        out.append({"user": u, "start_ms": s, "peak": p, "total": t, "record": p > best[u]})
        best[u] = max(best[u], p)
    return out


def main() -> int:
    batches = clicks()
    got = run(batches)
    want = expected(batches)
    print("busiest second per user and 5 s (dedupe -> Ember window -> Spark SQL -> process function):")
    for r in got:
        print(f"  {r['user']}  [{r['start_ms'] / 1000:>4.0f} s, +5 s)  peak {r['peak']:>2} clicks/s  total {r['total']:>3}"
              + ("  new record" if r["record"] else ""))
    same = [{k: r[k] for k in ("user", "start_ms", "peak", "total", "record")} for r in got] == want
    print(f"{sum(len(b) for b in batches)} deliveries, {sum(r['total'] for r in want)} distinct clicks; "
          f"matches the plain-Python computation: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
