"""Rolling aggregations (issue 17): ``key_by(k).reduce / sum / min / max / min_by / max_by``
emit the key's aggregate per record, checked batch by batch against the model
(tests/flink_model.py: ``rolling``), on their own and chained with a window."""

from __future__ import annotations

import random
from datetime import timedelta

import flink_model as model
import pytest

from ember import CollectSink, ScriptedSource, TumblingEventTimeWindows, WatermarkStrategy
from ember.errors import PipelineError

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
BOUND = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=1_000), "ts")


def batches(seed: int, n: int = 5) -> list[list[tuple]]:
    """Out-of-order batches; timestamps distinct per key (the fold order is then defined)."""
    rng = random.Random(seed)
    used: set = set()
    out = []
    for b in range(n):
        batch = []
        for _ in range(rng.randint(0, 12)):
            key = rng.choice("abc")
            ts = b * 1_000 + rng.randint(-900, 900)
            while (key, ts) in used or ts < 0:
                ts += 7
            used.add((key, ts))
            batch.append((ts, key, rng.randint(-20, 20)))
        out.append(batch)
    return out


def _collected(sink: CollectSink) -> list[tuple]:
    return sorted((b.batch_id, r["k"], r["ts"], r["v"]) for b in sink.batches for r in b.rows)


STEPS = {
    "sum": lambda s: s.sum("v"),
    "min": lambda s: s.min("v"),
    "max": lambda s: s.max("v"),
    "min_by": lambda s: s.min_by("v"),
    "max_by": lambda s: s.max_by("v"),
    "reduce": lambda s: s.reduce(lambda a, b: {**b, "v": a["v"] + b["v"]}),
}


# min and max share sum's code path (RollingField): in `make test-all` only.
@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k in ("min", "max") else k for k in STEPS])
def test_rolling_aggregation_per_record_equals_the_model(env, kind):
    data = batches(11)
    sink = CollectSink()
    keyed = env.from_source(ScriptedSource(data, SCHEMA), BOUND, name="events").key_by("k")
    STEPS[kind](keyed).sink_to(sink)
    env.execute(f"rolling-{kind}", progress=False)
    assert _collected(sink) == sorted(model.rolling(data, kind))


@pytest.mark.parametrize("kind", ["sum", pytest.param("max_by", marks=pytest.mark.slow)])  # max_by: the uncombined path
def test_emit_batch_emits_each_keys_last_per_record_result_of_the_batch(env, kind):
    """``emit="batch"``: per key and micro-batch, the model's last per-record output of that
    batch (a key's records fold in timestamp order, so "last" is its latest record's)."""
    data = batches(12)
    sink = CollectSink()
    keyed = env.from_source(ScriptedSource(data, SCHEMA), BOUND, name="events").key_by("k")
    (keyed.sum("v", emit="batch") if kind == "sum" else keyed.max_by("v", emit="batch")).sink_to(sink)
    env.execute(f"rolling-batch-{kind}", progress=False)
    last: dict[tuple, tuple] = {}
    for batch_id, key, ts, value in model.rolling(data, kind):  # in fold order per batch and key
        last[(batch_id, key)] = (batch_id, key, ts, value)
    assert any(sum(1 for r in b if r[1] == k) > 1 for b in data for k in "abc")  # batches fold several records of a key
    assert _collected(sink) == sorted(last.values())


def test_emit_must_be_record_or_batch(env):
    keyed = env.from_source(ScriptedSource([[]], SCHEMA), BOUND, name="events").key_by("k")
    with pytest.raises(PipelineError, match="emit must be one of 'record', 'batch'"):
        keyed.sum("v", emit="window")


@pytest.mark.slow  # the example test below chains a rolling step too
def test_rolling_sum_feeds_a_window_downstream(env):
    """A rolling step chains with a window: the window sees every updated record with its
    record's timestamp (here: it counts them, and keeps the last running sum per window)."""
    data = batches(5, n=6)
    sink = CollectSink()
    (env.from_source(ScriptedSource(data, SCHEMA), BOUND, name="events").key_by("k").sum("v", name="running")
        .key_by("k").window(TumblingEventTimeWindows.of(10_000)).max("v", name="w").sink_to(sink))
    env.execute("rolling-window", progress=False)
    rolled = model.rolling(data, "sum")
    expected = {}
    for _, key, _, value in rolled:
        expected[key] = max(expected.get(key, value), value)
    got = {r["k"]: r["max_v"] for b in sink.batches for r in b.rows}
    assert got == expected


def test_rolling_on_a_missing_field_is_refused_naming_the_step(env):
    env.from_source(ScriptedSource([[(1, "a", 1)]], SCHEMA), BOUND, name="events").key_by("k").sum("x", name="total") \
        .sink_to(CollectSink())
    with pytest.raises(PipelineError, match="total.*no field 'x'|no field 'x'"):
        env.execute("rolling-missing", progress=False)


def test_a_rolling_sum_of_text_is_refused_naming_the_step(env):
    """It would concatenate the strings (Python's +), where Flink refuses a sum of a non-number."""
    events = env.from_source(ScriptedSource([[(1, "a", 2)]], SCHEMA), name="events")
    events.key_by("v").sum("k", name="total").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'total': a rolling sum takes a number; 'k' is string"):
        env.execute("rolling-text", progress=False)


def test_rolling_totals_example(spark, load_example):
    example = load_example("rolling_totals")
    sinks = example.run()
    # sum per user (ann: 30, 42, 49, 99; bob: 5, 45, 46), then the largest total so far (all of them grow)
    largest = sorted((b.batch_id, r["user"], r["amount"]) for b in sinks["largest_total"].batches for r in b.rows)
    assert largest == [(0, "ann", 30), (0, "ann", 42), (0, "bob", 5), (1, "ann", 49), (1, "bob", 45),
                       (2, "ann", 99), (2, "bob", 46)]
    with_total = sorted((r["ts"], r["user"], r["amount"]) for r in sinks["with_total"].rows())
    assert with_total == [(1_000, "ann", 30), (1_500, "bob", 5), (2_000, "ann", 42), (2_500, "ann", 49),
                          (3_000, "bob", 45), (4_000, "ann", 99), (4_500, "bob", 46)]
