"""Windows over a whole (non-keyed) stream on Ember's window operator — Flink's ``windowAll`` /
``countWindowAll``: a Python function, a session window, count windows, and a plain window that
reads or feeds another stateful step or sits beside other sinks (each crashed the planner or
the compiler before). Checked batch by batch against the independent model (tests/flink_model.py)
with every record under one key."""

from __future__ import annotations

from datetime import timedelta

import flink_model as model
import pytest
from window_functions import CountSum

from ember import (
    Agg,
    CollectSink,
    EventTimeSessionWindows,
    KeyedProcessFunction,
    ScriptedSource,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
BOUND = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts")


class Forward(KeyedProcessFunction):
    """Each record as it came (with its timestamp): a keyed step before the window."""

    def process_element(self, value, ctx):
        yield value


def _one_key(batches):
    """The stream as the model sees a non-keyed window: every record under one key."""
    return [[(ts, "all", v) for ts, _, v in batch] for batch in batches]


def _fired(sink, batches):
    """What the window emitted, as the model's ``fired``: ``("all", start, end) -> (n, total, batch)``."""
    fired = {}
    for b in sink.batches:
        for r in b.rows:
            window = ("all", r["window_start"], r["window_end"])
            assert window not in fired, f"window {window} emitted twice"
            fired[window] = (r["n"], r["total"], b.batch_id if b.batch_id < len(batches) else model.END)
    return fired


@pytest.mark.parametrize("kind", ["tumbling", "session"])
def test_a_python_aggregate_over_the_whole_stream_equals_the_model(env, kind):
    batches = model.random_batches(8)
    size = 4_000 if kind == "tumbling" else 1_500
    expected = model.windows(_one_key(batches), 1_000, kind, size, in_batch=True)
    assert expected.late > 0 and len(expected.fired) > 2
    assigner = TumblingEventTimeWindows.of(size) if kind == "tumbling" else EventTimeSessionWindows.with_gap(size)
    sink = CollectSink()
    (env.from_source(ScriptedSource(batches, SCHEMA), BOUND).window_all(assigner)
        .aggregate(CountSum(), output_schema="n bigint, total bigint").sink_to(sink))
    result = env.execute("window-all", progress=False)
    assert _fired(sink, batches) == expected.fired
    assert result.late_dropped == expected.late


def test_count_window_all_fires_as_the_model_says(env):
    batches = model.random_batches(8)
    expected = [(n, total, k) for _, n, total, k in model.count_windows(_one_key(batches), 4, 2)]
    sink = CollectSink()
    (env.from_source(ScriptedSource(batches, SCHEMA), BOUND).count_window_all(4, 2)
        .aggregate(CountSum(), output_schema="n bigint, total bigint").sink_to(sink))
    env.execute("count-window-all", progress=False)
    assert sorted((r["n"], r["total"], b.batch_id) for b in sink.batches for r in b.rows) == expected
    assert len(expected) > 3


@pytest.mark.parametrize("shape", ["after-a-keyed-step", "lane-beside-a-sink", "beside-the-raw-records"])
def test_a_plain_window_over_the_whole_stream_among_other_steps_equals_the_model(env, shape):
    """Built-in aggregates on a tumbling ``window_all`` that Spark's native windowing cannot run
    here — after a keyed step (event time flows between them), as a lane of that step's fan-out,
    or beside a sink of the raw records — run on Ember's operator, one key; there a window
    fires one batch later than alone, as a keyed one does (README, "Latency")."""
    batches = model.random_batches(8)
    expected = model.windows(_one_key(batches), 1_000, "tumbling", 4_000)
    sink, raw = CollectSink(), CollectSink()
    events = env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
    if shape == "beside-the-raw-records":
        before = events
    else:
        before = events.key_by("k").process(Forward(), SCHEMA, name="forward")
    if shape != "after-a-keyed-step":
        before.sink_to(raw, name="raw")
    (before.window_all(TumblingEventTimeWindows.of(4_000)).aggregate(n=Agg.count(), total=Agg.sum("v"), name="w")
        .sink_to(sink, name="windows"))
    env.execute("window-all-among-steps", progress=False)
    assert _fired(sink, batches) == expected.fired
    if shape != "after-a-keyed-step":
        assert sorted((r["ts"], r["k"], r["v"]) for r in raw.rows()) == sorted(r for b in batches for r in b)


def test_a_window_keyed_by_a_column_on_the_keyed_runtime_is_refused_naming_the_step(env):
    """``key_by(Column)`` is for windows Spark's native windowing runs; one after a keyed step
    runs on Ember's runtime, whose keys are fields: a clear error before the job starts (it
    was Spark's "cannot convert column into bool")."""
    from pyspark.sql import functions as F

    from ember import PipelineError

    env.spark  # noqa: B018 - a Column needs the session's context
    events = env.from_source(ScriptedSource(model.random_batches(8), SCHEMA), BOUND)
    forwarded = events.key_by("k").process(Forward(), SCHEMA, name="forward")
    (forwarded.key_by(F.upper(F.col("k"))).window(TumblingEventTimeWindows.of(4_000)).aggregate(n=Agg.count(), name="w")
        .sink_to(CollectSink()))
    with pytest.raises(PipelineError, match="step 'w': this step runs on Ember's keyed runtime .* key_by got the Column"):
        env.execute("column-key", progress=False)


@pytest.mark.parametrize("layout", ["blob", "delta"])
def test_a_count_window_all_keeps_its_records_across_a_restart(spark, tmp_path, layout):
    """The whole stream's one key is state like any other: kept in the checkpoint (and on the
    delta layout's disk) across a restart."""
    from ember import StreamEnvironment

    batches = [[(1, "a", 1), (2, "b", 2)], [(3, "c", 4), (4, "a", 8)], [(5, "b", 16), (6, "c", 32)]]

    def run(upto):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark,
                                state_layout=layout)
        sink = CollectSink()
        (env.from_source(ScriptedSource(batches[:upto], SCHEMA), name="events").count_window_all(4)
            .aggregate(total=Agg.sum("v"), name="fours").sink_to(sink))
        env.execute("restart", progress=False)
        return [r["total"] for r in sink.rows()]

    assert run(2) == [15]
    assert run(3) == []  # restarted from the checkpoint: 16 and 32 wait in state for two more records
    batches.append([(7, "a", 64), (8, "b", 128)])
    assert run(4) == [16 + 32 + 64 + 128]


def test_steps_over_the_whole_stream_in_a_savepoint_read_back_and_rescale_2_to_4(spark, tmp_path):
    """The one key ``()`` of a count_window_all and of a non-keyed CEP step: read from a
    savepoint (it made a frame of the wrong width before) and restored at parallelism 4, the
    same results as an uninterrupted run."""
    from ember import StreamEnvironment
    from ember.cep import CEP, Pattern
    from ember.savepoints import create_savepoint

    keys = ["a", "b", "c", "d", "e"]
    batches = [[(b * 10 + i, keys[(b + i * i) % 5], b * 7 + i) for i in range(8)] for b in range(8)]

    def run(name, upto, parallelism=2, from_savepoint=None):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path / "ckpt", parallelism=parallelism, spark=spark)
        events = env.from_source(ScriptedSource(batches[:upto], SCHEMA), name="events")
        fives, pairs = CollectSink(), CollectSink()
        events.count_window_all(5).aggregate(total=Agg.sum("v"), name="fives").sink_to(fives, name="fives-out")
        a_then_b = Pattern.begin("x").where(lambda e: e["k"] == "a").next("y").where(lambda e: e["k"] == "b")
        CEP.pattern(events, a_then_b).select(lambda m: {"ts": m["y"][0]["ts"]}, "ts bigint", name="ab").sink_to(pairs)
        env.execute(name, progress=False, from_savepoint=from_savepoint)
        return [r["total"] for r in fives.rows()], [r["ts"] for r in pairs.rows()]

    whole = run("whole", 8)
    head = run("p2", 3)
    point = create_savepoint(str(tmp_path / "ckpt" / "p2"), root=str(tmp_path / "sp"))
    window_state, pattern_state = point.read_state("fives", spark), point.read_state("ab", spark)
    assert list(window_state.columns) == ["state", "value"] and len(window_state) > 0  # no key columns: one key
    assert list(pattern_state.columns) == ["state", "value"]
    rest = run("p4", 8, parallelism=4, from_savepoint=point.path)
    assert sorted(head[0] + rest[0]) == sorted(whole[0]) and sorted(head[1] + rest[1]) == sorted(whole[1])
    assert len(whole[0]) > 5 and whole[1]
