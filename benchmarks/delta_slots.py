"""A process function's bucket calls on the delta layout, without Spark.

One state bucket of ``--keys`` keys (each with a running count and a waiting processing-time
timer: ``ember bench grouping-keyed --step process``'s function), driven through the real
``transformWithStateInPandas`` adapter (keyed/tws.py ``DeltaSlotProcessor``) with a stand-in for
Spark's state handle; each call brings ``--records`` records of random keys. Prints the median
call time and the median time of the working copy's lookup of ``--records`` keys. With
``--timers moved`` each record moves its key's idle timer instead (deletes it and sets a new
one: Flink's usual inactivity timeout), so every call pushes ``--records`` timers and the
bucket's timer queue changes each call. To compare two versions, run it with each on
``PYTHONPATH``, alternating::

    PYTHONPATH=src python benchmarks/delta_slots.py --calls 150 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import pandas as pd

from ember.bench.jobs import IDLE_MS, KeyedCountWithTimer
from ember.functions import KeyedProcessFunction
from ember.runner.spark.keyed.bucket import BucketFunction
from ember.runner.spark.keyed.delta import SlotTable
from ember.runner.spark.keyed.tws import DeltaSlotProcessor
from ember.state import ValueStateDescriptor


class _Value:
    def __init__(self) -> None:
        self.value: Any = None

    def get(self) -> Any:
        return self.value

    def update(self, value: Any) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class _List:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def get(self) -> Any:
        return iter(list(self.items))

    def appendList(self, values: list[Any]) -> None:  # noqa: N802 - Spark's names
        self.items += values

    def put(self, values: list[Any]) -> None:
        self.items = list(values)


class _Handle:
    """Spark's ``StatefulProcessorHandle`` as the adapter uses it."""

    def __init__(self) -> None:
        self.values: dict[str, _Value] = {}
        self.lists: dict[str, _List] = {}

    def getValueState(self, name: str, schema: str) -> _Value:  # noqa: N802
        return self.values.setdefault(name, _Value())

    def getListState(self, name: str, schema: str) -> _List:  # noqa: N802
        return self.lists.setdefault(name, _List())

    def registerTimer(self, at: int) -> None:  # noqa: N802
        pass

    def deleteTimer(self, at: int) -> None:  # noqa: N802
        pass


class _Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802
        return 0

    def getCurrentProcessingTimeInMs(self) -> int:  # noqa: N802
        return self.now


class MovedIdleTimer(KeyedProcessFunction):
    """A running count per key whose idle timer each record moves ``IDLE_MS`` past the
    record's processing time (the old one deleted): a timer pushed per record."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count"))
        self.timer = ctx.get_state(ValueStateDescriptor("timer"))

    def process_element(self, value: dict[str, Any], ctx: Any) -> Any:
        old = self.timer.value()
        if old is not None:
            ctx.delete_processing_time_timer(old)
        at = ctx.current_processing_time + IDLE_MS
        ctx.register_processing_time_timer(at)
        self.timer.update(at)
        n = self.count.value()
        self.count.update(1 if n is None else n + 1)
        return iter(({"new": int(n is None)},))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=8000, help="keys in the bucket (default 8,000: 1 M keys over 128 buckets)")
    parser.add_argument("--records", type=int, default=800, help="records per call (default 800: 100 k per batch)")
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--timers", choices=("idle", "moved"), default="idle",
                        help="idle: one timer per key, set with its first record; moved: each record moves its key's timer")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    function = KeyedCountWithTimer() if args.timers == "idle" else MovedIdleTimer()
    fn = BucketFunction(function, "count", ["host_id"], ["host_id"], ["new"], None, False)
    proc = DeltaSlotProcessor(fn, ["host_id"], None, tempfile.mkdtemp(prefix="delta-slots-"), {})
    proc.init(_Handle())

    def call(keys: list[int], now: int) -> None:
        for _ in proc.handleInputRows((0,), iter([pd.DataFrame({"host_id": keys})]), _Clock(now)):
            pass

    call(list(range(args.keys)), 1)  # every key created, with its timer
    rng = np.random.default_rng(1)
    calls = []
    for i in range(args.calls):
        keys = rng.integers(0, args.keys, args.records).tolist()
        started = time.perf_counter()
        call(keys, 2 + i)
        calls.append(time.perf_counter() - started)
    import os

    from ember.runner.spark.keyed.delta import local_state_root

    table = SlotTable(os.path.join(local_state_root(), proc.directory, "0"))
    table.load()
    lookups = []
    for _ in range(args.calls):
        wanted = np.unique(rng.choice(np.asarray(table.keys), args.records, replace=False))
        started = time.perf_counter()
        table.lookup(wanted)
        lookups.append(time.perf_counter() - started)
    table.close()
    result = {"call_ms": round(statistics.median(calls) * 1000, 3), "lookup_ms": round(statistics.median(lookups) * 1000, 3),
              "keys": args.keys, "records": args.records, "calls": args.calls, "timers": args.timers}
    print(json.dumps(result) if args.json else f"call {result['call_ms']} ms, lookup of {args.records} keys {result['lookup_ms']} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
