"""Rolling sum/min/max on the keyed runtime's whole-batch path (numpy, per key) against the
same function called once per record, batch by batch over seeded random streams, and against
a plain running aggregate computed here."""

from __future__ import annotations

import random

import pytest
from bucket_driver import BucketDriver

from ember.rolling import RollingField

pytestmark = pytest.mark.usefixtures("state_layout")  # both keyed state layouts (conftest.py)

FIELDS = ["ts", "k", "x", "tag"]


def _drivers(kind: str, by: bool = False):
    batched = RollingField(kind, "x", by=by)
    per_record = RollingField(kind, "x", by=by)
    per_record.process_batch = None  # the runtime then calls process_element per record
    make = lambda fn: BucketDriver(fn, FIELDS, FIELDS, event_time=False)  # noqa: E731
    return make(batched), make(per_record), batched


def _stream(seed: int, *, floats: bool = False, nulls: bool = False):
    rng = random.Random(seed)
    batches = []
    for b in range(6):
        batch = []
        for i in range(rng.randint(0, 40)):
            x = rng.uniform(-5, 5) if floats else rng.randint(-9, 9)
            if nulls and rng.random() < 0.2:
                x = None
            batch.append((b * 100 + i, rng.choice("abcde"), x, f"t{b}-{i}"))
        batches.append(batch)
    return batches


@pytest.mark.parametrize("kind", ["sum", "min", "max"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_batch_path_emits_what_one_call_per_record_emits(kind, seed):
    fast, slow, fn = _drivers(kind)
    calls = []
    original = fn.process_batch
    fn.process_batch = lambda *a: calls.append(1) or original(*a)
    for batch in _stream(seed, floats=seed == 3):
        got, _ = fast.batch(batch)
        want, _ = slow.batch(batch)
        key = lambda r: r["k"]  # noqa: E731 - keys may come in another order; per key, the records' order
        assert sorted(got, key=key) == sorted(want, key=key)
        for k in "abcde":  # per key, in the records' order
            assert [r["x"] for r in got if r["k"] == k] == [r["x"] for r in want if r["k"] == k]
    assert calls  # the batch path ran (it is not the per-record fallback being compared with itself)


def test_a_running_sum_per_key_equals_a_plain_running_total():
    fast, _, _ = _drivers("sum")
    totals: dict[str, int] = {}
    firsts: dict[str, tuple] = {}
    for batch in _stream(7):
        got, _ = fast.batch(batch)
        expected = []
        for ts, k, x, tag in batch:
            totals[k] = totals.get(k, 0) + x
            firsts.setdefault(k, (ts, tag))
            expected.append({"ts": firsts[k][0], "k": k, "x": totals[k], "tag": firsts[k][1]})
        for k in "abcde":  # the key's first record with the running total
            assert [r for r in got if r["k"] == k] == [r for r in expected if r["k"] == k]


@pytest.mark.parametrize("kind", ["sum", "max"])
def test_nulls_and_by_variants_take_the_per_record_path_with_the_same_results(kind):
    fast, slow, _ = _drivers(kind)
    for batch in _stream(11, nulls=True):
        got, _ = fast.batch(batch)
        want, _ = slow.batch(batch)
        for k in "abcde":  # (repr: a null reaches a function as pandas' NaN here, which is not == itself)
            assert [repr(r["x"]) for r in got if r["k"] == k] == [repr(r["x"]) for r in want if r["k"] == k]
    fast, slow, _ = _drivers("max", by=True)
    for batch in _stream(12):
        assert fast.batch(batch) == slow.batch(batch)


def _last_per_key(rows):
    last = {}
    for r in rows:
        last[r["k"]] = r
    return last


@pytest.mark.parametrize(("kind", "by", "nulls"), [
    ("sum", False, False), ("min", False, False), ("max", False, True), ("max", True, False), ("min", True, True),
])
def test_emit_batch_emits_each_keys_last_per_record_output(kind, by, nulls):
    batched = BucketDriver(RollingField(kind, "x", by=by, emit="batch"), FIELDS, FIELDS, event_time=False)
    _, per_record, _ = _drivers(kind, by=by)
    for batch in _stream(21, nulls=nulls):
        got, _ = batched.batch(batch)
        want, _ = per_record.batch(batch)
        assert len(got) == len({r[1] for r in batch})  # one row per key of the batch
        assert {r["k"]: repr(r) for r in got} == {k: repr(r) for k, r in _last_per_key(want).items()}


def test_emit_batch_of_a_reduce_folds_every_record():
    from ember.rolling import RollingReduce

    fn = lambda a, b: {**a, "x": a["x"] * 2 + b["x"]}  # noqa: E731 - order-sensitive on purpose
    batched = BucketDriver(RollingReduce(fn, emit="batch"), FIELDS, FIELDS, event_time=False)
    per_record = BucketDriver(RollingReduce(fn), FIELDS, FIELDS, event_time=False)
    for batch in _stream(22):
        got, _ = batched.batch(batch)
        want, _ = per_record.batch(batch)
        assert {r["k"]: r for r in got} == _last_per_key(want)
