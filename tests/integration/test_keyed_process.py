"""KeyedProcessFunction with ValueState: exact results, state across batches and restarts."""

import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from ember import (
    CollectSink,
    JobFailedError,
    PipelineError,
    ScriptedSource,
    StateMachineSource,
    StreamEnvironment,
    WatermarkStrategy,
)
from ember.functions import KeyedProcessFunction, VectorizedKeyedFunction
from ember.state import ValueStateDescriptor

pytestmark = pytest.mark.spark



class RunningCount(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        yield {"k": ctx.current_key, "n": n, "ts": ctx.timestamp}


SCHEMA = "ts bigint, k string"
BATCHES = [
    [(1, "a"), (2, "b"), (3, "a")],
    [(5, "a"), (4, "c")],
    [(6, "b"), (7, "a")],
]


MONOTONOUS = WatermarkStrategy.for_monotonous_timestamps("ts")


def _counts(env, batches, name="counts", strategy=MONOTONOUS, **execute):
    src = env.from_source(ScriptedSource(batches, SCHEMA), strategy, name="events")
    sink = CollectSink()
    src.key_by("k").process(RunningCount(), "k string, n bigint, ts bigint").sink_to(sink)
    env.execute(name, progress=False, **execute)
    return sink


def test_value_state_counts_per_key_across_batches(env):
    sink = _counts(env, BATCHES)
    expected, seen = [], Counter()
    for batch in BATCHES:
        for ts, k in batch:
            seen[k] += 1
            expected.append((k, seen[k], ts))
    assert sorted((r["k"], r["n"], r["ts"]) for r in sink.rows()) == sorted(expected)


def test_records_of_a_key_are_processed_in_timestamp_order_within_a_batch(env):
    sink = _counts(env, [[(30, "a"), (10, "a"), (20, "a")]])
    assert [(r["ts"], r["n"]) for r in sorted(sink.rows(), key=lambda r: r["n"])] == [(10, 1), (20, 2), (30, 3)]


def test_state_survives_a_restart_from_the_checkpoint(spark, tmp_path):
    def env():
        return StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark)

    # Without event time there is no final watermark: a job that read two batches
    # restarts later on the same checkpoint with a source that has a third.
    first = _counts(env(), BATCHES[:2], name="restart", strategy=None)
    assert max(r["n"] for r in first.rows() if r["k"] == "a") == 3
    second = _counts(env(), BATCHES, name="restart", strategy=None)
    assert sorted((r["k"], r["n"]) for r in second.rows()) == [("a", 4), ("b", 2)]


def test_state_machine_alerts_equal_injected_events(env, load_example):
    """The example: a dedupe and the state machine chained (reinterpret_as_keyed). One event
    per ms of event time: the dedupe drops an event not newer than its address's last one."""
    example = load_example("state_machine")
    source = StateMachineSource(partitions=2, max_events=120_000, active_addresses=200, frames_per_epoch=20, invalid_rate=0.002,
                                nominal_rate=1_000)
    sink = example.build(env, source)
    assert "dedupe -> state-machine" in env.explain(spark_plan=False)
    result = env.execute("sm", progress=False)
    assert result.events == 120_000
    got = sorted((r["address"], r["state"], r["type"]) for r in sink.rows())
    expected = source.expected_alerts(120_000)
    assert len(expected) > 50
    assert got == expected


def test_process_validation(env):
    keyed = env.from_source(ScriptedSource(BATCHES, SCHEMA)).key_by("k")
    with pytest.raises(PipelineError, match="process takes a KeyedProcessFunction instance"):
        keyed.process(lambda r: r, "k string")
    with pytest.raises(PipelineError, match="needs an output_schema"):
        keyed.process(RunningCount(), "")


class EveryKind(KeyedProcessFunction):
    """Exercises list, map, reducing and aggregating state on each element."""

    def open(self, ctx):
        from ember.functions import AggregateFunction
        from ember.state import AggregatingStateDescriptor, ListStateDescriptor, MapStateDescriptor, ReducingStateDescriptor

        class Mean(AggregateFunction):
            def create_accumulator(self):
                return (0, 0)

            def add(self, value, acc):
                return (acc[0] + value, acc[1] + 1)

            def merge(self, a, b):
                return (a[0] + b[0], a[1] + b[1])

            def get_result(self, acc):
                return acc[0] / acc[1]

        self.seen = ctx.get_state(ListStateDescriptor("seen"))
        self.per_word = ctx.get_state(MapStateDescriptor("per_word"))
        self.biggest = ctx.get_state(ReducingStateDescriptor("biggest", reduce_fn=max))
        self.mean = ctx.get_state(AggregatingStateDescriptor("mean", aggregate_fn=Mean()))

    def process_element(self, value, ctx):
        self.seen.add(value["v"])
        self.per_word.put(value["w"], self.per_word.get(value["w"], 0) + 1)
        self.biggest.add(value["v"])
        self.mean.add(value["v"])
        yield (ctx.current_key, value["ts"], ",".join(map(str, self.seen.get())), self.per_word.get(value["w"]),
               len(self.per_word.keys()), self.biggest.get(), self.mean.get())


def test_list_map_reducing_and_aggregating_state(env):
    batches = [[(1, "a", "x", 5), (2, "b", "x", 1)], [(3, "a", "y", 2), (4, "a", "x", 9)], [(5, "b", "x", 4)]]
    src = env.from_source(ScriptedSource(batches, "ts bigint, k string, w string, v int"),
                          WatermarkStrategy.for_monotonous_timestamps("ts"))
    sink = CollectSink()
    src.key_by("k").process(EveryKind(), "k string, ts bigint, seen string, word_count int, words int, biggest int, mean double").sink_to(sink)
    env.execute("kinds", progress=False)
    expected, state = [], {}
    for ts, k, w, v in sorted(r for b in batches for r in b):
        s = state.setdefault(k, {"seen": [], "words": {}})
        s["seen"].append(v)
        s["words"][w] = s["words"].get(w, 0) + 1
        expected.append((k, ts, ",".join(map(str, s["seen"])), s["words"][w], len(s["words"]), max(s["seen"]), sum(s["seen"]) / len(s["seen"])))
    got = sorted(tuple(r.values()) for r in sink.rows())
    assert got == sorted(expected)


class Remember(KeyedProcessFunction):
    def __init__(self, ttl_ms):
        self.ttl_ms = ttl_ms

    def open(self, ctx):
        from ember.state import StateTtlConfig

        self.last = ctx.get_state(ValueStateDescriptor("last", default="(none)", ttl=StateTtlConfig.of(self.ttl_ms)))

    def process_element(self, value, ctx):
        yield (ctx.current_key, value["ts"], self.last.value(), ctx.current_processing_time)
        if value["v"] != "read-only":
            self.last.update(value["v"])


def test_state_ttl_expires_by_processing_time(spark, tmp_path):
    # Batches start on 1 s boundaries; the TTL is 2.5 s. Reads 1 batch after a write
    # (<= ~1 s) find the value; a read 4 batches after the write (>= 3 s) does not.
    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark, trigger_interval=1_000)
    batches = [
        [(1, "a", "a0"), (2, "b", "b0")],
        [(3, "a", "read-only"), (4, "b", "read-only")],
        [],
        [(5, "c", "c0")],
        [(6, "c", "read-only"), (7, "b", "read-only")],
    ]
    src = env.from_source(ScriptedSource(batches, "ts bigint, k string, v string"), WatermarkStrategy.for_monotonous_timestamps("ts"))
    sink = CollectSink()
    src.key_by("k").process(Remember(2_500), "k string, ts bigint, last string, now bigint").sink_to(sink)
    env.execute("ttl", progress=False)
    rows = {r["ts"]: r for r in sink.rows()}
    now = {ts: rows[ts]["now"] for ts in rows}
    assert now[3] - now[1] < 2_500 and now[6] - now[5] < 2_500 <= now[7] - now[2]  # the premise
    assert [rows[ts]["last"] for ts in (1, 2, 3, 4, 5)] == ["(none)", "(none)", "a0", "b0", "(none)"]
    assert rows[6]["last"] == "c0"  # written one batch earlier: alive
    assert rows[7]["last"] == "(none)"  # written in batch 0, only read since (no refresh): expired


class SessionEnd(KeyedProcessFunction):
    """An event-time timer 1 s after each element; a timer reports when it fires."""

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value, ctx):
        self.count.update(self.count.value() + 1)
        ctx.register_event_time_timer(value["ts"] + 1_000)
        if value["k"] == "x":
            ctx.register_event_time_timer(value["ts"] + 50)  # deleted again: must never fire
            ctx.delete_event_time_timer(value["ts"] + 50)
        return ()

    def on_timer(self, timestamp, ctx):
        yield (ctx.current_key, timestamp, ctx.current_watermark, self.count.value())


def test_event_time_timers_fire_after_the_watermark_passes(env):
    batches = [[(1_000, "a"), (1_500, "x")], [(1_200, "a"), (4_000, "b")], [(9_000, "a")], []]
    src = env.from_source(
        ScriptedSource(batches, SCHEMA), WatermarkStrategy.for_bounded_out_of_orderness(500, "ts"), name="events"
    )
    sink = CollectSink()
    src.key_by("k").process(SessionEnd(), "k string, ts bigint, wm bigint, count bigint").sink_to(sink)
    result = env.execute("timers", progress=False)
    assert result.stopped_because == "sources ended, windows flushed"
    rows = sink.rows()
    fired = sorted((r["k"], r["ts"]) for r in rows)
    expected = sorted({(k, ts + 1_000) for b in batches for ts, k in b})
    assert fired == expected  # every timer once, deleted ones never
    for r in rows:
        assert r["wm"] >= r["ts"], r  # fired only once the watermark passed it
    by_ts = {(r["k"], r["ts"]): r for r in rows}
    # (a, 2_000) is due at watermark 2_000, reached after batch 1 (max 4_000 - 500): by then a has 2 elements
    assert by_ts[("a", 2_000)]["count"] == 2
    # (a, 10_000) fires only at the end of input (final watermark), with all three elements counted
    assert by_ts[("a", 10_000)]["count"] == 3


class Reminder(KeyedProcessFunction):
    def process_element(self, value, ctx):
        ctx.register_processing_time_timer(ctx.current_processing_time + 1_000)
        return ()

    def on_timer(self, timestamp, ctx):
        yield (ctx.current_key, timestamp, ctx.current_processing_time)


def test_processing_time_timers_fire_in_a_later_batch(spark, tmp_path):
    from ember import RateSource

    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark, trigger_interval=500)
    src = env.from_source(RateSource(rows_per_second=2), name="ticks").select("value % 2 AS k")
    sink = CollectSink()
    src.key_by("k").process(Reminder(), "k bigint, ts bigint, now bigint").sink_to(sink)
    env.execute("pt-timers", duration_s=9, progress=False)
    rows = sink.rows()
    assert rows, "no processing-time timer fired in 9 s"
    assert all(r["now"] >= r["ts"] for r in rows)
    assert {r["k"] for r in rows} <= {0, 1}


def test_string_event_times_are_ordered_numerically(env):
    # "900" sorts after "1000" as text; as a timestamp it comes first.
    batches = [[("1000", "a"), ("900", "a"), ("20000", "a")]]
    src = env.from_source(
        ScriptedSource(batches, "ts string, k string"), WatermarkStrategy.for_monotonous_timestamps("ts"), name="events"
    )
    sink = CollectSink()
    src.key_by("k").process(RunningCount(), "k string, n bigint, ts bigint").sink_to(sink)
    env.execute("string-ts", progress=False)
    assert sorted((r["n"], r["ts"]) for r in sink.rows()) == [(1, 900), (2, 1000), (3, 20000)]


class RunningTotals(VectorizedKeyedFunction):
    """Per key: a running total of x over all batches; emits each record with the total so far."""

    state_schema = "total bigint"

    def process_batch(self, events, state, ctx):
        totals = state["total"].reindex(events["k"]).fillna(0).to_numpy()
        running = events.groupby("k", sort=False)["x"].cumsum().to_numpy() + totals
        out = pd.DataFrame({"k": events["k"], "ts": events["ts"], "total": running.astype("int64")})
        last = out.groupby("k", sort=False).tail(1).set_index("k")
        updates = last[["total"]].astype("float64")
        updates.loc[updates["total"] >= 100, "total"] = np.nan  # a null row clears the key's state
        return out, updates


def test_vectorized_keyed_function_with_columnar_state_across_batches_and_restart(spark, tmp_path):
    batches = [
        [(3, "a", 5), (1, "a", 1), (2, "b", 10)],
        [(4, "a", 100), (5, "b", 1), (6, "c", 7)],
        [(7, "a", 2), (8, "b", 1)],
    ]

    def run(upto):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark)
        sink = CollectSink()
        (env.from_source(ScriptedSource(batches[:upto], "ts bigint, k string, x bigint"), MONOTONOUS, name="events")
         .key_by("k").process_batches(RunningTotals(), "k string, ts bigint, total bigint").sink_to(sink))
        env.execute("vectorized", progress=False)
        return sorted((r["k"], r["ts"], r["total"]) for r in sink.rows())

    expected, totals = [], {}
    for batch in batches:  # independent model; within a batch each key's records in timestamp order
        for ts, k, x in sorted(batch):
            totals[k] = totals.get(k, 0) + x
            expected.append((k, ts, totals[k]))
        totals = {k: v for k, v in totals.items() if v < 100}
    first = run(2)
    assert first == sorted(e for e in expected if e[1] <= 6)
    assert run(3) == sorted(e for e in expected if e[1] > 6)  # restarted from the checkpoint


def test_vectorized_function_errors_name_the_step(env):
    class Broken(VectorizedKeyedFunction):
        state_schema = "n bigint"

        def process_batch(self, events, state, ctx):
            return events  # not (output, updates)

    (env.from_source(ScriptedSource([[(1, "a", 1)]], "ts bigint, k string, x bigint"), name="events")
     .key_by("k").process_batches(Broken(), "k string", name="broken").sink_to(CollectSink()))
    with pytest.raises(JobFailedError, match="step 'broken'.*must return \\(output DataFrame or None"):
        env.execute("broken", progress=False)


class PositiveTotals(RunningTotals):
    """RunningTotals that refuses a negative x (the whole call raises)."""

    def process_batch(self, events, state, ctx):
        if (events["x"] < 0).any():
            raise ValueError("negative amount")
        return super().process_batch(events, state, ctx)


def test_the_keys_a_vectorized_call_fails_on_are_dead_letters_and_keep_their_state(env):
    """On Spark, with a restart-free run of three batches: a key whose records of a batch hold a
    negative amount sends them to the dead letters and keeps its total; the others are exact."""
    from ember import OutputTag

    batches = [[(1, "a", 5), (2, "b", 10), (3, "c", 1)], [(4, "a", 3), (5, "b", -1), (6, "b", 4), (7, "c", 2)],
               [(8, "a", 1), (9, "b", 1)]]
    bad = OutputTag("bad")
    totals = (env.from_source(ScriptedSource(batches, "ts bigint, k string, x bigint"), MONOTONOUS, name="events")
              .key_by("k").process_batches(PositiveTotals(), "k string, ts bigint, total bigint", dead_letter=bad,
                                           name="totals"))
    sink, dead = CollectSink(), CollectSink()
    totals.sink_to(sink)
    totals.get_side_output(bad).sink_to(dead)
    env.execute("vectorized-dead-letters", progress=False)
    assert sorted((r["k"], r["ts"], r["total"]) for r in sink.rows()) == [
        ("a", 1, 5), ("a", 4, 8), ("a", 8, 9), ("b", 2, 10), ("b", 9, 11), ("c", 3, 1), ("c", 7, 3)]
    assert sorted(json.loads(r["raw"])["ts"] for r in dead.rows()) == [5, 6]  # both of b's records of batch 2
    assert {r["error"] for r in dead.rows()} == {"step 'totals': PositiveTotals.process_batch raised ValueError: negative amount"}


class FireAfter500(KeyedProcessFunction):
    def process_element(self, value, ctx):
        ctx.register_event_time_timer(value["ts"] + 500)
        return ()

    def on_timer(self, timestamp, ctx):
        yield (ctx.current_key, timestamp, ctx.current_watermark)


def test_a_timer_fires_when_the_watermark_reaches_it_whatever_other_keys_do(env):
    """Issue 16, finding 5, on Spark. a's timer (1500) is due once Ember's watermark (Flink's:
    max - bound - 1) is 1500, i.e. after the records of the batch of (1600, b). Its bucket has
    no record then; the batch's packing tells every bucket the batch's latest time, so it fires
    in that batch (issue 19: the step advances its watermark after the batch's records), not
    later, and not earlier."""
    batches = [[(1_000, "a")], [(1_500, "b")], [(1_600, "b")], [(3_000, "c")]]
    src = env.from_source(ScriptedSource(batches, SCHEMA), MONOTONOUS, name="events")
    sink = CollectSink()
    src.key_by("k").process(FireAfter500(), "k string, ts bigint, wm bigint", name="timers").sink_to(sink)
    env.execute("timer-at-watermark", progress=False)
    fired = sorted((r["k"], r["ts"], r["wm"], b.batch_id) for b in sink.batches for r in b.rows if r["k"] != "c")
    # Watermarks after each batch's records (bound 0): 999, 1499, 1599, 2999; b's timers (2_000,
    # 2_100) are reached by the one (3_000, c) makes, in its batch.
    assert fired == [("a", 1_500, 1_599, 2), ("b", 2_000, 2_999, 3), ("b", 2_100, 2_999, 3)]


class Ratio(KeyedProcessFunction):
    """A running sum of 100 // v per key; raises on v == 0 after emitting (the output and the
    side output it emitted before raising must be discarded) and before touching state."""

    def open(self, ctx):
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    def process_element(self, value, ctx):
        from ember import OutputTag

        ctx.output(OutputTag("seen", "k string"), {"k": ctx.current_key})
        yield {"k": ctx.current_key, "total": -1}
        part = 100 // value["v"]
        self.total.update(self.total.value() + part)
        yield {"k": ctx.current_key, "total": self.total.value()}


def test_records_a_process_function_raises_on_become_dead_letters(env):
    from ember import OutputTag

    batches = [[(1, "a", 5), (2, "b", 0), (3, "a", 0)], [(4, "a", 20), (5, "b", 4), (6, "b", 0)]]
    bad = OutputTag("bad")
    src = env.from_source(ScriptedSource(batches, "ts bigint, k string, v int"), MONOTONOUS, name="events")
    totals = src.key_by("k").process(Ratio(), "k string, total bigint", dead_letter=bad, name="ratio")
    main, seen, dead = CollectSink(), CollectSink(), CollectSink()
    totals.filter("total >= 0").sink_to(main, name="main")
    totals.get_side_output(bad).sink_to(dead, name="dead")
    totals.get_side_output(OutputTag("seen", "k string")).sink_to(seen, name="seen")
    env.execute("dead-letters", progress=False)

    expected, running = [], Counter()
    for batch in batches:
        for _ts, k, v in batch:
            if v:
                running[k] += 100 // v
                expected.append((k, running[k]))
    assert sorted((r["k"], r["total"]) for r in main.rows()) == sorted(expected)
    letters = sorted((json.loads(r["raw"])["ts"], r["error"]) for r in dead.rows())
    assert [ts for ts, _ in letters] == [2, 3, 6]
    assert all("step 'ratio': Ratio.process_element raised ZeroDivisionError" in e for _, e in letters)
    assert json.loads(sorted(dead.rows(), key=lambda r: r["raw"])[0]["raw"]) == {"ts": 2, "k": "b", "v": 0}
    assert sorted(r["k"] for r in seen.rows()) == sorted(k for b in batches for _, k, v in b if v)


def test_dead_letters_nobody_reads_are_refused_before_the_job_starts(env):
    from ember import OutputTag

    src = env.from_source(ScriptedSource(BATCHES, SCHEMA), MONOTONOUS, name="events")
    src.key_by("k").process(RunningCount(), "k string, n bigint, ts bigint", dead_letter=OutputTag("bad"),
                            name="counts").sink_to(CollectSink())
    with pytest.raises(PipelineError, match="step 'counts'.*side output 'bad', which the pipeline does not read"):
        env.execute("dead-letters-refused", progress=False)


def test_meter_readings_example(spark, load_example):
    used, bad = load_example("meter_readings").run()
    assert sorted((r["meter"], r["ts"], r["kwh"]) for r in used.rows()) == [
        ("m-1", 2_000, 4), ("m-1", 4_000, 6), ("m-2", 2_500, 5), ("m-2", 3_000, 2)]
    letters = sorted((json.loads(r["raw"])["meter"], json.loads(r["raw"])["ts"], r["error"]) for r in bad.rows())
    assert [(m, ts) for m, ts, _ in letters] == [("m-1", 3_000), ("m-2", 2_000)]
    assert "TypeError" in letters[0][2] and "meter went backwards: 40 -> 38" in letters[1][2]


def test_a_record_that_does_not_fit_the_output_schema_fails_the_job_naming_the_step(env):
    """Spark's message names the column and the Arrow type only; Ember adds the steps whose
    declared output has that column."""
    class Stamp(KeyedProcessFunction):
        def process_element(self, value, ctx):
            yield {"ts": f"at {value['ts']}", "k": value["k"]}  # a text where the schema says bigint

    events = env.from_source(ScriptedSource([[(1, "a"), (2, "b")]], SCHEMA), name="events")
    events.key_by("k").process(Stamp(), SCHEMA, name="stamp").sink_to(CollectSink())
    with pytest.raises(JobFailedError, match=r"column 'ts'.*check the records these steps emit against their "
                                             r"output_schema: 'stamp' \(bigint\)"):
        env.execute("misfit", progress=False)
