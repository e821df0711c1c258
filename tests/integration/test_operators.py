"""Every stream operation, run on the shared SparkSession against expected results."""

import os

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import functions as F

from ember import CollectSink, JobFailedError, PipelineError, ScriptedSource

pytestmark = pytest.mark.spark

ROWS = [(1, "alpha", 10), (2, "beta", 20), (3, "gamma", 30), (4, "delta", 40)]
SCHEMA = "id bigint, word string, n int"


def _run(env, build, batches=None):
    src = env.from_source(ScriptedSource(batches or [ROWS[:2], ROWS[2:]], SCHEMA), name="rows")
    sink = CollectSink()
    build(src).sink_to(sink)
    result = env.execute("t", progress=False)
    assert result.stopped_because == "sources ended"
    return sorted(sink.rows(), key=lambda r: tuple(str(v) for v in r.values()))


def test_python_map_filter_flat_map(env):
    rows = _run(
        env,
        lambda s: s.map(lambda r: {"id": r["id"], "word": r["word"].upper(), "n": r["n"] + 1})
        .filter(lambda r: r["n"] > 15)
        .flat_map(lambda r: [(r["id"], c) for c in r["word"][:2]], "id bigint, letter string"),
    )
    assert rows == [
        {"id": 2, "letter": "B"}, {"id": 2, "letter": "E"},
        {"id": 3, "letter": "A"}, {"id": 3, "letter": "G"},
        {"id": 4, "letter": "D"}, {"id": 4, "letter": "E"},
    ]


def test_map_with_tuple_and_scalar_results(env):
    rows = _run(env, lambda s: s.map(lambda r: r["n"] * 2, "double int"))
    assert [r["double"] for r in rows] == [20, 40, 60, 80]


def test_map_to_a_timestamp_field(env):
    """A map may produce timestamps (an Arrow timestamp needs a zone: the instant is what counts)."""
    from datetime import datetime, timezone

    rows = _run(env, lambda s: s.map(lambda r: {"id": r["id"], "at": datetime.fromtimestamp(r["id"] * 60, timezone.utc)},
                                     "id bigint, at timestamp"))
    assert [(r["id"], r["at"].replace(tzinfo=timezone.utc).timestamp() if r["at"].tzinfo is None else r["at"].timestamp())
            for r in rows] == [(1, 60.0), (2, 120.0), (3, 180.0), (4, 240.0)]


def test_native_filter_select_and_column_forms(env):
    rows = _run(
        env,
        lambda s: s.filter("n >= 20").filter(F.col("word") != "gamma").select("id", "upper(word) AS w", F.col("n") * 10),
    )
    assert rows == [{"id": 2, "w": "BETA", "(n * 10)": 200}, {"id": 4, "w": "DELTA", "(n * 10)": 400}]


def test_map_batches_arrow_and_pandas(env):
    def arrow_fn(batch: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([batch.column("id"), pc.utf8_length(batch.column("word"))], names=["id", "len"])

    rows = _run(env, lambda s: s.map_batches(arrow_fn, "id bigint, len int"))
    assert [(r["id"], r["len"]) for r in rows] == [(1, 5), (2, 4), (3, 5), (4, 5)]


def test_map_batches_pandas(env):
    def pandas_fn(df: pd.DataFrame) -> pd.DataFrame:
        return df.assign(n=df["n"] * 3)

    rows = _run(env, lambda s: s.map_batches(pandas_fn, batch_format="pandas"))
    assert [r["n"] for r in rows] == [30, 60, 90, 120]


def test_union(env):
    other = env.from_source(ScriptedSource([[(9, "omega", 90)]], SCHEMA), name="more")
    rows = _run(env, lambda s: s.union(other).select("id"))
    assert [r["id"] for r in rows] == [1, 2, 3, 4, 9]


def test_lookup_join_inner_and_left(env, spark):
    table = pd.DataFrame({"word": ["alpha", "gamma"], "lang": ["greek", "greek-too"]})
    rows = _run(env, lambda s: s.join_lookup(table, on="word").select("id", "lang"))
    assert rows == [{"id": 1, "lang": "greek"}, {"id": 3, "lang": "greek-too"}]


def test_lookup_join_left_keeps_unmatched(env):
    table = [{"word": "beta", "lang": "b"}]
    rows = _run(env, lambda s: s.join_lookup(table, on="word", how="left").select("id", "lang"))
    assert rows == [{"id": 1, "lang": None}, {"id": 2, "lang": "b"}, {"id": 3, "lang": None}, {"id": 4, "lang": None}]


def test_key_by_then_map_keeps_every_record(env):
    rows = _run(env, lambda s: s.key_by("word").map(lambda r: (r["id"],), "id bigint"))
    assert [r["id"] for r in rows] == [1, 2, 3, 4]


def test_user_function_error_names_step_and_record(env):
    def explode(r):
        if r["id"] == 3:
            raise ValueError("bad id")
        return r

    src = env.from_source(ScriptedSource([ROWS], SCHEMA), name="rows")
    src.map(explode, name="fragile").sink_to(CollectSink())
    with pytest.raises(JobFailedError) as err:
        env.execute("t", progress=False)
    message = str(err.value)
    assert "step 'fragile'" in message and "explode" in message and "ValueError: bad id" in message
    assert "'word': 'gamma'" in message


def test_wrong_output_type_is_reported(env):
    src = env.from_source(ScriptedSource([ROWS], SCHEMA), name="rows")
    src.map(lambda r: {"x": "not-a-number"}, "x int", name="typed").sink_to(CollectSink())
    with pytest.raises(JobFailedError, match="step 'typed': output does not match the output schema"):
        env.execute("t", progress=False)


def test_unknown_column_fails_before_start_naming_the_step(env):
    src = env.from_source(ScriptedSource([ROWS], SCHEMA), name="rows")
    src.select("nope + 1", name="broken").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'broken'.*nope"):
        env.execute("t", progress=False)
    # the query never started: Spark wrote no offset log
    assert not os.path.exists(os.path.join(env.config.checkpoint_dir, "t", "offsets"))


def test_lookup_join_missing_field_fails_before_start(env):
    src = env.from_source(ScriptedSource([ROWS], SCHEMA), name="rows")
    src.join_lookup([{"ad": "x"}], on="word", name="lookup").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'lookup': join field 'word' is not in the lookup table"):
        env.execute("t", progress=False)


def test_collect_sink_takes_arrow_only_where_its_values_equal_rows(spark):
    """The collecting sink reads a batch through Arrow (faster) only for types whose Python
    values equal Row.asDict(recursive=True)'s; the rest take Rows."""
    from ember.runner.spark.translators.sinks import arrow_collectable

    df = spark.sql(
        "SELECT id, CAST(id AS INT) i, CAST(id AS SMALLINT) sm, id / 3.0 d, CAST(id / 7 AS FLOAT) f, "
        "CAST(id AS DECIMAL(10, 2)) dec, CAST(id AS STRING) s, id % 2 = 0 b, DATE '2026-01-01' + CAST(id AS INT) dt, "
        "IF(id % 3 = 0, NULL, id) n, array(id, id + 1) arr, named_struct('x', id, 'y', array(named_struct('z', 's'))) st, "
        "array(named_struct('a', id)) arr_st FROM range(50)"
    )
    assert arrow_collectable(df.schema)
    assert df.toArrow().to_pylist() == [r.asDict(recursive=True) for r in df.collect()]
    for other in ("TIMESTAMP '2026-01-01 10:00:00' t", "map('k', id) m", "CAST('x' AS BINARY) bin",
                  "array(TIMESTAMP '2026-01-01 10:00:00') at", "named_struct('a', id, 'a', id) dup"):
        assert not arrow_collectable(spark.sql(f"SELECT id, {other} FROM range(3)").schema), other
