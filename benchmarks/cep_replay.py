"""CEP step cost without Spark: E4 events replayed through the step's bucket function.

``ember bench cep``'s pattern (a flow opening with a or c and closing with g within 10 s, per
address) and its hand-written baseline (``FlowByHand``), each driven through Ember's bucket
function (keyed/bucket.py) with a stand-in for Spark's group state: 16 state buckets, micro-batches of
``--batch`` events, the watermark advanced within the batch as in the engine (the job's only
stateful step) with an out-of-orderness bound of ``--bound-ms`` (default 0: ``ember bench cep``'s
monotonous timestamps; until 2026-11-27 the replay used 1,000). Six variants, alternating, in
one process on one core: ``cep`` (the pattern), ``cep-every-event`` (the pattern with every event queued: before the step dropped the events
no stage can take, 2026-11-26) and ``by-hand`` (the hand-written process function); their
settled matches are checked equal; ``cep-general`` (the pattern on the matcher's general loop:
before its plain-sequence fast path, 2026-11-27) too; ``cep-sql`` (the pattern with SQL
conditions, their columns computed as Spark would before the step) and ``cep-sql-per-event``
(the same testing relevance on a dict per event: before the columnar test, 2026-11-28) too. Prints events/s per variant (median of
``--rounds``) and, with ``--json``, one JSON line.

    python benchmarks/cep_replay.py --events 1000000 --batch 250000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import pandas as pd

from ember.bench.jobs import FlowByHand
from ember.bench.workloads import CEP_WINDOW_MS, CLOSE, OPENS
from ember.cep import Pattern, SkipStrategy
from ember.cep.nfa import Matcher
from ember.cep.operator import SQL_PREFIX, CepFunction, SelectFunction
from ember.connectors.generators import StateMachineSource
from ember.runner.spark.keyed.bucket import BucketFunction

BUCKETS = 16


class _State:
    """Spark's side of applyInPandasWithState for one bucket."""

    def __init__(self, blob: bytes | None, watermark: int) -> None:
        self.blob, self.watermark = blob, watermark

    @property
    def exists(self) -> bool:
        return self.blob is not None

    @property
    def get(self) -> tuple[bytes | None]:
        return (self.blob,)

    def update(self, value: tuple[bytes]) -> None:
        self.blob = value[0]

    def getCurrentWatermarkMs(self) -> int:  # noqa: N802 - Spark's names
        return self.watermark

    def getCurrentProcessingTimeMs(self) -> int:  # noqa: N802
        return 0

    def setTimeoutTimestamp(self, ts: int) -> None:  # noqa: N802
        pass

    def setTimeoutDuration(self, ms: int) -> None:  # noqa: N802
        pass


RATE = 100_000  # event time: events per second of it (a 250 k-event batch spans 2.5 s)


SQL_OPEN, SQL_CLOSE = f"type IN ({', '.join(map(str, OPENS))})", f"type = {CLOSE}"
SQL_COLUMNS = {SQL_OPEN: f"{SQL_PREFIX}0", SQL_CLOSE: f"{SQL_PREFIX}1"}


def _events(n: int) -> pd.DataFrame:
    """E4 events, with the SQL conditions' columns as Spark computes them before the step."""
    src = StateMachineSource(rate=RATE, partitions=1, invalid_rate=0.0005, start_ms=1_700_000_000_000)
    address, kind, _ = src.events(0, 0, n)
    ts = 1_700_000_000_000 + (np.arange(n, dtype=np.int64) * 1000) // RATE
    return pd.DataFrame({"address": address.astype(np.int64), "type": kind.astype(np.int64), "ts": ts,
                         SQL_COLUMNS[SQL_OPEN]: np.isin(kind, OPENS), SQL_COLUMNS[SQL_CLOSE]: kind == CLOSE})


class _EveryEvent(CepFunction):
    """The CEP step queueing every event (none dropped as irrelevant)."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self._relevant = None


class _GeneralMatcher(CepFunction):
    """The CEP step with the matcher's general loop for every pattern (no plain-sequence fast
    path: nfa._sequence_of, 2026-11-27)."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.matcher = Matcher(self.matcher.plan, fast=False)


class _SqlPerEvent(CepFunction):
    """The CEP step with SQL conditions testing relevance per event on a dict (before the
    columnar test, 2026-11-28)."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self._relevant_columns = None


def _function(variant: str) -> Any:
    if variant == "by-hand":
        return FlowByHand(CEP_WINDOW_MS)
    if variant.startswith("cep-sql"):
        sql = (Pattern.begin("open", skip=SkipStrategy.skip_past_last_event()).where(SQL_OPEN)
               .followed_by("close").where(SQL_CLOSE).within(CEP_WINDOW_MS))
        pick = SelectFunction(lambda m: {"address": m["open"][0]["address"], "opened": m["open"][0]["ts"],
                                         "closed": m["close"][0]["ts"]})
        return (_SqlPerEvent if variant == "cep-sql-per-event" else CepFunction)(sql, pick, "flows", sql_columns=SQL_COLUMNS)
    pattern = (Pattern.begin("open", skip=SkipStrategy.skip_past_last_event()).where(lambda e: e["type"] in OPENS)
               .followed_by("close").where(lambda e: e["type"] == CLOSE).within(CEP_WINDOW_MS))
    select = SelectFunction(lambda m: {"address": m["open"][0]["address"], "opened": m["open"][0]["ts"],
                                       "closed": m["close"][0]["ts"]})
    kind = {"cep-every-event": _EveryEvent, "cep-general": _GeneralMatcher}.get(variant, CepFunction)
    return kind(pattern, select, "flows")


def run(variant: str, events: pd.DataFrame, batch: int, bound_ms: int = 0) -> tuple[float, list[tuple]]:
    fn = _function(variant)
    fields = ["address", "type", "ts", *SQL_COLUMNS.values()] if variant.startswith("cep-sql") else ["address", "type", "ts"]
    bucket_fn = BucketFunction(fn, "flows", ["address"], fields, ["address", "opened", "closed"],
                               "ts", True, advance_ms=bound_ms)
    blobs: dict[int, bytes | None] = {b: None for b in range(BUCKETS)}
    watermark, found = 0, []
    started = time.perf_counter()
    for start in range(0, len(events), batch):
        part = events.iloc[start:start + batch][fields]
        latest = int(part["ts"].max())
        groups = dict(tuple(part.groupby(part["address"] % BUCKETS)))
        for b in range(BUCKETS):
            state = _State(blobs[b], watermark)
            frames = [groups[b]] if b in groups else []
            for out in bucket_fn(b, iter(frames), state, latest):
                found.extend(out[["address", "opened", "closed"]].itertuples(index=False, name=None))
            blobs[b] = state.blob
        watermark = max(watermark, latest - bound_ms)
    seconds = time.perf_counter() - started
    return seconds, sorted(found)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=250_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bound-ms", type=int, default=0, help="out-of-orderness bound (default 0, as the bench's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    events = _events(args.events)
    variants = ["cep", "cep-every-event", "cep-general", "cep-sql", "cep-sql-per-event", "by-hand"]
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    results: dict[str, list[tuple]] = {}
    for _ in range(args.rounds):
        for v in variants:
            s, found = run(v, events, args.batch, args.bound_ms)
            seconds[v].append(s)
            results[v] = found
    # the matches settled by the end: every flow closed at or before the last watermark, Flink's
    # max - bound - 1 (runtime.ember_watermark), is out in all three; the CEP step has not yet
    # taken the events after it (it takes an event once the watermark reaches it), the
    # hand-written function emits a close at once
    final_watermark = int(events["ts"].max()) - args.bound_ms - 1
    settled = {v: [f for f in r if f[2] <= final_watermark] for v, r in results.items()}
    verified = all(settled[v] == settled["by-hand"] for v in variants) and len(settled["cep"]) > 0
    rates = {v: args.events / statistics.median(s) for v, s in seconds.items()}
    for v in variants:
        print(f"{v:>11}: {rates[v] / 1e3:8.1f} k events/s (rounds: {', '.join(f'{x:.2f} s' for x in seconds[v])})")
    print(f"cep / by-hand: {rates['cep'] / rates['by-hand']:.2f}x; cep / cep-every-event: "
          f"{rates['cep'] / rates['cep-every-event']:.2f}x; cep / cep-general: {rates['cep'] / rates['cep-general']:.2f}x; "
          f"cep-sql / cep-sql-per-event: {rates['cep-sql'] / rates['cep-sql-per-event']:.2f}x; "
          f"matches: {len(settled['cep'])}, equal: {verified}")
    if args.json:
        print(json.dumps({"events_per_second": rates, "verified": verified, "matches": len(settled["cep"]),
                          "events": args.events, "batch": args.batch, "bound_ms": args.bound_ms, "rounds": args.rounds}))
    return 0 if verified else 1


if __name__ == "__main__":
    raise SystemExit(main())
