"""Dead letters from a process function: per-meter consumption from cumulative readings.

Each meter reports its cumulative reading ``(ts, meter, reading)``; a keyed ``process`` step
keeps the meter's last reading in a ``ValueState`` and emits the consumption since then. A
reading that goes backwards, or one that is missing, makes ``process_element`` raise: with
``dead_letter=tag`` that record goes to a side output (``raw``: the record as JSON, ``error``:
the step, the function and the exception) and the job goes on; what the failing call emitted
is discarded. The function checks before it updates state — Ember does not roll a call's
state changes back (docs/connectors.md).

    python examples/meter_readings.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile

from ember import CollectSink, KeyedProcessFunction, OutputTag, ScriptedSource, StreamEnvironment, WatermarkStrategy
from ember.state.descriptors import ValueStateDescriptor

READINGS = [  # (event time ms, meter, cumulative kWh), in micro-batches
    [(1_000, "m-1", 100), (1_000, "m-2", 40)],
    [(2_000, "m-1", 104), (2_000, "m-2", 38), (2_500, "m-2", 45)],  # m-2 at 2 000: backwards
    [(3_000, "m-1", None), (3_000, "m-2", 47), (4_000, "m-1", 110)],  # m-1 at 3 000: no reading
]
SCHEMA = "ts bigint, meter string, reading int"
LAST = ValueStateDescriptor("last")
BAD = OutputTag("bad_readings")


class Consumption(KeyedProcessFunction):
    def open(self, ctx):
        self.last = ctx.get_state(LAST)

    def process_element(self, r, ctx):
        last = self.last.value()
        if last is not None and r["reading"] < last:  # (None < int raises TypeError: a dead letter too)
            raise ValueError(f"meter went backwards: {last} -> {r['reading']}")
        if last is not None:
            yield {"meter": r["meter"], "ts": r["ts"], "kwh": r["reading"] - last}
        self.last.update(r["reading"])


def run() -> tuple[CollectSink, CollectSink]:
    root = tempfile.mkdtemp(prefix="ember-meters-")
    try:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2)
        readings = env.from_source(ScriptedSource(READINGS, SCHEMA), WatermarkStrategy.for_monotonous_timestamps("ts"),
                                   name="readings")
        usage = readings.key_by("meter").process(Consumption(), "meter string, ts bigint, kwh int", dead_letter=BAD,
                                                 name="consumption")
        used, bad = CollectSink(), CollectSink()
        usage.sink_to(used, name="usage")
        usage.get_side_output(BAD).sink_to(bad, name="dead-letters")
        env.execute("meter-readings", progress=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return used, bad


def main() -> int:
    used, bad = run()
    print("consumption since each meter's last reading:")
    for r in sorted(used.rows(), key=lambda r: (r["ts"], r["meter"])):
        print(f"  {r['meter']} at {r['ts']:>5} ms: {r['kwh']} kWh")
    print("dead letters (the job went on):")
    for r in sorted(bad.rows(), key=lambda r: r["raw"]):
        print(f"  {r['raw']}: {r['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
