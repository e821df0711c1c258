"""rows_frame builds a call's output frame column by column; it must give what pandas
gives from the same records (values and nulls), whatever shape the rows have."""

import pandas as pd
import pytest

from ember.runner.spark.keyed.runtime import rows_frame

FIELDS = ["k", "n", "x"]


def pandas_frame(rows, fields):
    return pd.DataFrame([r if type(r) is dict else dict(zip(fields, r)) for r in rows], columns=fields)


def same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b)
    for c in a.columns:
        left = [None if (v is None or (isinstance(v, float) and v != v)) else v for v in a[c].tolist()]
        right = [None if (v is None or (isinstance(v, float) and v != v)) else v for v in b[c].tolist()]
        assert left == right, c


@pytest.mark.parametrize(
    "rows",
    [
        [{"k": "a", "n": 1, "x": 0.5}, {"k": "b", "n": 2, "x": 1.5}],
        [("a", 1, 0.5), ("b", 2, None)],
        [{"k": "a", "n": 1, "x": 0.5}, ("b", 2, 2.5)],  # dicts and tuples mixed
        [{"k": "a", "n": 1}, {"k": "b", "n": None, "x": 3.0}],  # a missing field is null
        [{"k": "a", "n": 1, "x": 0.5, "extra": 9}],  # fields not declared are ignored
        [("a", [1, 2], 0.5), ("b", [3, 4], 1.5)],  # nested values (array columns)
        [("a", 1), ("b", 2, 3.0)],  # a short tuple: the rest is null, as pandas does
        [["a", 1, True], ["b", 2, False]],  # lists as rows
        [{"k": None, "n": 2**70, "x": "s"}],  # values numpy cannot type
    ],
)
def test_rows_frame_equals_pandas_records(rows):
    got = rows_frame(rows, FIELDS)
    same(got, pandas_frame(rows, FIELDS))


def test_one_field_and_integer_columns():
    got = rows_frame([{"n": 1}, (2,), {"n": 3}], ["n"])
    assert got["n"].tolist() == [1, 2, 3]
    assert str(got["n"].dtype) == "int64"


def test_strings_stay_python_objects():
    got = rows_frame([("a", 1, 1.0), ("bb", 2, 2.0)], FIELDS)
    assert got["k"].dtype == object and got["k"].tolist() == ["a", "bb"]


def test_mixed_types_are_not_converted():
    got = rows_frame([("a", 1, 1.0), (7, "2", 2.0)], FIELDS)
    assert got["k"].tolist() == ["a", 7] and got["n"].tolist() == [1, "2"]
