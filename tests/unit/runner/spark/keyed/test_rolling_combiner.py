"""The rolling aggregation's combiner before the shuffle (emit="batch"): partial rows per key
and partition, folded by the keyed step as records are — compared, batch by batch over seeded
random streams cut into partitions, with the step folding the records themselves."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from bucket_driver import BucketDriver

from ember.rolling import RollingField
from ember.runner.spark.keyed.rolling import rolling_combiner

FIELDS = ["k", "x", "tag"]
SCHEMA = pa.schema([("k", pa.string()), ("x", pa.int32()), ("tag", pa.string()), ("__time", pa.int64())])


def _combine(kind, rows, time_column="__time"):
    combine = rolling_combiner(kind, "x", ("k",), FIELDS, SCHEMA if time_column else SCHEMA.remove(3), time_column)
    batch = pa.RecordBatch.from_pylist([dict(zip(["k", "x", "tag", "__time"], r)) for r in rows], schema=SCHEMA)
    return pa.Table.from_batches(list(combine(iter([batch])))).to_pylist()


def test_one_partial_row_per_key_with_its_first_record_and_the_partitions_sum():
    rows = [("a", 1, "a1", 30), ("b", 5, "b1", 10), ("a", 2, "a0", 20), ("a", None, "a2", 40)]
    got = sorted(_combine("sum", rows), key=lambda r: r["k"])
    assert got == [{"k": "a", "x": 3, "tag": "a0", "__time": 20}, {"k": "b", "x": 5, "tag": "b1", "__time": 10}]


def test_without_event_time_the_first_record_is_the_first_to_arrive():
    rows = [("a", 1, "a1", 30), ("a", 7, "a0", 20)]
    assert _combine("max", rows, time_column=None) == [{"k": "a", "x": 7, "tag": "a1"}]


def test_a_key_whose_values_are_all_null_keeps_a_null():
    assert _combine("min", [("a", None, "a1", 5), ("a", None, "a2", 6)]) == [{"k": "a", "x": None, "tag": "a1", "__time": 5}]


def _stream(seed):
    rng = random.Random(seed)
    for b in range(6):
        # (no nulls: this driver hands records over as pandas does, a null int as NaN; on Spark an
        # int column with nulls arrives as None, which the rolling step skips as the combiner does)
        yield [(rng.choice("abcd"), rng.randint(-9, 9), f"t{b}-{i}", b * 1000 + rng.randint(0, 999))
               for i in range(rng.randint(0, 30))]


@pytest.mark.parametrize("kind", ["sum", "min", "max"])
@pytest.mark.parametrize("seed", [1, 2])
def test_folding_the_partials_equals_folding_the_records(kind, seed):
    fields = ["k", "x", "tag", "ts"]
    on_records = BucketDriver(RollingField(kind, "x", emit="batch"), fields, fields, keys=("k",), time_field="ts")
    on_partials = BucketDriver(RollingField(kind, "x", emit="batch"), fields, fields, keys=("k",), time_field="ts")
    for batch in _stream(seed):
        cut = random.Random(seed).randint(0, len(batch))
        partials = [p for part in (batch[:cut], batch[cut:]) if part for p in _combine(kind, part)]
        want, _ = on_records.batch([(k, x, tag, ts) for k, x, tag, ts in batch])
        got, _ = on_partials.batch([(p["k"], p["x"], p["tag"], p["__time"]) for p in partials])
        assert {r["k"]: repr(r) for r in got} == {r["k"]: repr(r) for r in want}
