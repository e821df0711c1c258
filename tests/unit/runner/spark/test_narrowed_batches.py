"""``map_batches(..., dead_letter=tag)`` narrows a failing batch down to its bad records
(translators/python_ops.py ``narrowed``): checked against the plain answer — the records the
function fails on alone are the dead letters, every other record's result is emitted once."""

import random

import pyarrow as pa
import pytest

from ember.runner.spark.narrowing import narrowed


def _run(values, bad):
    calls = []

    def fn(part):
        calls.append(len(part))
        if any(v in bad for v in part):
            raise ValueError(f"bad value in {part}")
        return [v * 10 for v in part]

    failed = []
    results = narrowed(fn, values, len, lambda p, a, b: p[a:b], lambda rec, exc: failed.append((rec[0], str(exc))))
    return [v for r in results for v in r], failed, calls


@pytest.mark.parametrize("seed", range(20))
def test_the_dead_letters_are_exactly_the_records_that_fail_alone(seed):
    rng = random.Random(seed)
    values = list(range(rng.randint(0, 300)))
    bad = set(rng.sample(values, min(len(values), rng.randint(0, 6))))
    out, failed, calls = _run(values, bad)
    assert sorted(out) == [v * 10 for v in values if v not in bad]
    assert sorted(v for v, _ in failed) == sorted(bad)
    assert all(err == f"bad value in [{v}]" for v, err in failed)  # the error of the record's own call
    if not bad:
        assert calls == [len(values)]  # nothing extra when nothing fails
    else:
        assert len(calls) <= 1 + 2 * len(bad) * max(1, len(values)).bit_length()


def test_an_arrow_batch_is_narrowed_by_slices():
    batch = pa.RecordBatch.from_pydict({"v": [1, 2, 0, 4]})

    def fn(b):
        return pa.RecordBatch.from_pydict({"q": [12 // v for v in b.column("v").to_pylist()]})

    failed = []
    parts = narrowed(fn, batch, lambda b: b.num_rows, lambda b, a, z: b.slice(a, z - a),
                     lambda rec, exc: failed.append((rec.to_pylist(), type(exc).__name__)))
    assert [q for p in parts for q in p.column("q").to_pylist()] == [12, 6, 3]
    assert failed == [([{"v": 0}], "ZeroDivisionError")]
