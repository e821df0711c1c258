"""The watermark follows every record of an event-time source, as Flink's does (assigned at the
source), also where a step between the source and the stateful step drops records — a Spark
filter, a Python filter, a ``flat_map``, a filter before a SQL view: the records it drops still
move the watermark (placement.watermark_at_source). Against the model (tests/flink_model.py,
``keep``): windows fire in the batches it says and the same records are late."""

from __future__ import annotations

from datetime import timedelta

import flink_model as model
import pytest
from test_chains import CountSum

from ember import Agg, CollectSink, ScriptedSource, TumblingEventTimeWindows, WatermarkStrategy

pytestmark = pytest.mark.spark

SCHEMA = "ts bigint, k string, v int"
BOUND, SIZE, SEED = 1_000, 2_000, 3
STRATEGY = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND), "ts")


def _kept(r: tuple) -> bool:
    return r[2] % 3 != 0


def _fired(sink, batches, total):
    fired = {}
    for b in sink.batches:
        for r in b.rows:
            window = (r["k"], r["window_start"], r["window_end"])
            assert window not in fired, f"window {window} emitted twice"
            fired[window] = (r["n"], r[total], b.batch_id if b.batch_id < len(batches) else model.END)
    return fired


@pytest.mark.parametrize("drop", ["spark-filter", "python-filter", pytest.param("flat_map", marks=pytest.mark.slow)])
@pytest.mark.parametrize("path", ["native", "operator"])
def test_records_a_step_drops_before_a_window_still_move_the_watermark(env, drop, path):
    batches = model.random_batches(SEED, keys="ab")
    # Ember's operator advances the watermark within the batch on the records it reads
    expected = model.windows(batches, BOUND, "tumbling", SIZE, keep=_kept, in_batch=path == "operator",
                             advance_on_kept=True)
    filtered_first = model.windows([[r for r in b if _kept(r)] for b in batches], BOUND, "tumbling", SIZE,
                                   in_batch=path == "operator")
    assert expected != filtered_first and expected.late > 0  # the dropped records matter to the watermark
    stream = env.from_source(ScriptedSource(batches, SCHEMA), STRATEGY, name="events")
    if drop == "spark-filter":
        stream = stream.filter("v % 3 <> 0")
    elif drop == "python-filter":
        stream = stream.filter(lambda r: r["v"] % 3 != 0)
    else:
        stream = stream.flat_map(lambda r: [r] if r["v"] % 3 != 0 else [], SCHEMA)
    windowed = stream.key_by("k").window(TumblingEventTimeWindows.of(SIZE))
    sink = CollectSink()
    if path == "native":
        windowed.aggregate(n=Agg.count(), total=Agg.sum("v"), name="w").sink_to(sink)
    else:
        windowed.aggregate(CountSum(), output_schema="n bigint, v bigint", name="w").sink_to(sink)
    result = env.execute("dropped-records", progress=False)
    assert _fired(sink, batches, "total" if path == "native" else "v") == expected.fired
    assert result.late_dropped == expected.late


def test_a_filter_before_a_sql_view_leaves_the_watermark_to_every_record(env):
    batches = model.random_batches(SEED, keys="ab")
    expected = model.windows(batches, BOUND, "tumbling", SIZE, keep=_kept)
    (env.from_source(ScriptedSource(batches, SCHEMA), STRATEGY, name="events")
        .filter("v % 3 <> 0").create_view("events"))
    sink = CollectSink()
    env.sql(f"""SELECT k, window.start AS window_start, window.end AS window_end, count(*) AS n, sum(v) AS total
                FROM events GROUP BY k, window(rowtime, '{SIZE} milliseconds')""", name="per-window") \
        .select("k", "unix_millis(window_start) AS window_start", "unix_millis(window_end) AS window_end", "n", "total") \
        .sink_to(sink)
    result = env.execute("filter-then-sql", progress=False)
    assert _fired(sink, batches, "total") == expected.fired
    assert result.late_dropped == expected.late
