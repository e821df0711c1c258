"""Dead letters from a CEP step: two hot readings in a row per sensor, with garbled readings.

Sensors report ``(ts, sensor, value)`` with the value as the device sent it, as text; a pattern
flags a reading above 90 followed *next* by another one above 90 within five seconds. A
garbled value ("ERR") makes the condition ``float(e["value"]) > 90`` raise: with
``dead_letter=tag`` that event goes to a side output (``raw``: the event as JSON, ``error``:
the step and the exception) and leaves every partial match as it was — as if the event had
not arrived, so under ``next`` the reading after it counts as the next one (docs/cep.md,
"Bad events"). A second job averages each sensor's readings per 5 s window with a Python
``AggregateFunction`` whose ``add`` parses the value: with ``dead_letter=tag`` a garbled reading
goes into no window (docs/windows.md, "Bad records"). At the end the alerts and the averages are
checked against a plain scan of the valid readings.

    python examples/sensor_spikes.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from datetime import timedelta

from ember import (
    AggregateFunction,
    CollectSink,
    OutputTag,
    ScriptedSource,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from ember.cep import CEP, Pattern

READINGS = [  # (event time ms, sensor, value as sent), in micro-batches, out of order within 1 s
    [(1_000, "s-1", "95.5"), (1_200, "s-2", "40"), (1_500, "s-1", "ERR")],
    [(2_000, "s-1", "97"), (2_600, "s-2", "91"), (2_400, "s-2", "ERR"), (3_100, "s-2", "93.2")],
    [(4_000, "s-1", "60"), (4_500, "s-1", "99"), (9_800, "s-1", "98"), (10_000, "s-2", "12")],
]
SCHEMA = "ts bigint, sensor string, value string"
ALERTS = "sensor string, first_ts bigint, second_ts bigint"
BAD = OutputTag("bad_readings")
WITHIN_MS = 5_000


def hot(e: dict) -> bool:
    return float(e["value"]) > 90  # raises ValueError on "ERR"


def spikes() -> Pattern:
    return Pattern.begin("first").where(hot).next("second").where(hot).within(timedelta(milliseconds=WITHIN_MS))


def expected_alerts() -> list[tuple[str, int, int]]:
    """The pattern by hand: per sensor, the valid readings in time order, each pair of
    neighbours both above 90 and less than five seconds apart."""
    valid: dict[str, list[tuple[int, float]]] = {}
    for ts, sensor, value in (r for batch in READINGS for r in batch):
        try:
            valid.setdefault(sensor, []).append((ts, float(value)))
        except ValueError:
            continue
    out = []
    for sensor, readings in valid.items():
        readings.sort()
        out += [(sensor, a, b) for (a, x), (b, y) in zip(readings, readings[1:]) if x > 90 and y > 90 and b - a < WITHIN_MS]
    return sorted(out)


class Average(AggregateFunction):
    """The mean of the readings' values; ``add`` parses the text (raises on "ERR")."""

    def create_accumulator(self):
        return (0.0, 0)

    def add(self, value, acc):
        return acc[0] + float(value["value"]), acc[1] + 1

    def merge(self, a, b):
        return a[0] + b[0], a[1] + b[1]

    def get_result(self, acc):
        return round(acc[0] / acc[1], 2)


def expected_averages() -> list[tuple[str, int, float]]:
    """Per sensor and 5 s window, the mean of its valid readings, by hand."""
    sums: dict[tuple[str, int], list[float]] = {}
    for ts, sensor, value in (r for batch in READINGS for r in batch):
        try:
            sums.setdefault((sensor, ts - ts % 5_000), []).append(float(value))
        except ValueError:
            continue
    return sorted((sensor, start, round(sum(vs) / len(vs), 2)) for (sensor, start), vs in sums.items())


def averages(root: str) -> tuple[CollectSink, CollectSink]:
    """The second job: 5 s averages per sensor, garbled readings to dead letters."""
    env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts")
    readings = env.from_source(ScriptedSource(READINGS, SCHEMA), strategy, name="readings")
    means = readings.key_by("sensor").window(TumblingEventTimeWindows.of(5_000)).aggregate(
        Average(), output_schema="mean double", dead_letter=BAD, name="five-second-means")
    found, bad = CollectSink(), CollectSink()
    means.sink_to(found, name="means")
    means.get_side_output(BAD).sink_to(bad, name="dead-letters")
    env.execute("sensor-means", progress=False)
    return found, bad


def run() -> tuple[CollectSink, CollectSink]:
    root = tempfile.mkdtemp(prefix="ember-sensors-")
    try:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2)
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts")
        readings = env.from_source(ScriptedSource(READINGS, SCHEMA), strategy, name="readings")
        alerts = CEP.pattern(readings.key_by("sensor"), spikes()).select(
            lambda m: {"sensor": m["first"][0]["sensor"], "first_ts": m["first"][0]["ts"], "second_ts": m["second"][0]["ts"]},
            ALERTS, dead_letter=BAD, name="spikes")
        found, bad = CollectSink(), CollectSink()
        alerts.sink_to(found, name="alerts")
        alerts.get_side_output(BAD).sink_to(bad, name="dead-letters")
        env.execute("sensor-spikes", progress=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return found, bad


def main() -> int:
    found, bad = run()
    got = sorted((r["sensor"], r["first_ts"], r["second_ts"]) for r in found.rows())
    print("two hot readings in a row:")
    for sensor, first, second in got:
        print(f"  {sensor}: {first} ms and {second} ms")
    print("dead letters (the job went on; the partial matches did not see them):")
    for r in sorted(bad.rows(), key=lambda r: r["raw"]):
        print(f"  {r['raw']}: {r['error']}")
    want = expected_alerts()
    if got != want:
        print(f"check FAILED: expected {want}")
        return 1
    print(f"check: every alert exact ({len(got)} alerts, {len(bad.rows())} dead letters)")
    root = tempfile.mkdtemp(prefix="ember-sensor-means-")
    try:
        means, garbled = averages(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    got_means = sorted((r["sensor"], r["window_start"], r["mean"]) for r in means.rows())
    print("five-second means (garbled readings in no window):")
    for sensor, start, mean in got_means:
        print(f"  {sensor} [{start}, {start + 5_000}) ms: {mean}")
    if got_means != expected_averages() or len(garbled.rows()) != 2:
        print(f"check FAILED: expected {expected_averages()} and 2 dead letters")
        return 1
    print(f"check: every mean exact ({len(got_means)} windows, {len(garbled.rows())} dead letters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
