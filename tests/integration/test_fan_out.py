"""Fan-out (issue 17): a keyed step's output read by several keyed steps and sinks in one
job — the readers run as lanes of one Spark operator (keyed/lanes.py). Checked against the
independent model (tests/flink_model.py) and against a plain-Python count, batch-split
invariant, and through a savepoint rescaled 2 -> 4."""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict

import flink_model as model
import pytest
from test_chains import BOUND, SCHEMA, CountSum, Dedupe, Report, _distinct, _fired, _reported
from test_savepoints import OUT, RunningTotal

from ember import CollectSink, KeyedProcessFunction, OutputTag, ScriptedSource, StreamEnvironment, TumblingEventTimeWindows
from ember.state.descriptors import ValueStateDescriptor

pytestmark = pytest.mark.spark


def test_a_dedupe_feeding_two_windows_and_a_sink_equals_the_flink_model(env):
    """Each window reads the deduplicated records through its own filter (SQL on one
    lane, Python on the other) and fires in the micro-batch Flink fires it; the raw
    sink gets every distinct record once; each lane drops its own late records."""
    batches = model.random_batches(8)
    with_duplicates = [b + b[:2] for b in batches]
    distinct = _distinct(with_duplicates)
    small_expected = model.windows(distinct, 1_000, "tumbling", 2_000, keep=lambda r: r[2] > 0)
    large_expected = model.windows(distinct, 1_000, "tumbling", 6_000, keep=lambda r: r[1] != "c")
    assert small_expected.late > 0 and large_expected.late > 0
    small, large, raw = CollectSink(), CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(with_duplicates, SCHEMA), BOUND, name="events")
    deduped = src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    (deduped.filter("v > 0").key_by("k").window(TumblingEventTimeWindows.of(2_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="small").sink_to(small))
    (deduped.filter(lambda r: r["k"] != "c").key_by("k").window(TumblingEventTimeWindows.of(6_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="large").sink_to(large))
    deduped.sink_to(raw, name="raw")
    result = env.execute("fan-out-windows", progress=False)
    assert _fired(small, batches, "v") == small_expected.fired
    assert _fired(large, batches, "v") == large_expected.fired
    assert Counter((r["ts"], r["k"], r["v"]) for r in raw.rows()) == Counter(r for b in distinct for r in b)
    assert result.late_dropped == small_expected.late + large_expected.late


class Running(KeyedProcessFunction):
    """Per key of the step: the count and sum so far, with every record."""

    def __init__(self, key):
        self.key = key

    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n", default=0))
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))

    def process_element(self, value, ctx):
        n, total = self.n.value() + 1, self.total.value() + value["v"]
        self.n.update(n)
        self.total.update(total)
        if n % 3 == 0:
            ctx.output(THIRDS, {"key": str(value[self.key]), "n": n})
        yield {"key": str(value[self.key]), "n": n, "total": total}


THIRDS = OutputTag("thirds", "key string, n bigint")
RUNNING = "key string, n bigint, total bigint"


def _records(parts):
    records = [(i, "abcde"[(i * i) % 5], (i * 7) % 11, i % 3) for i in range(120)]
    return model.split_evenly(records, parts)


def _expected(records, key):
    """Per key: its counts 1..n and final sum (the order of a key's records across
    partitions is Spark's, as across parallel instances in Flink), and the thirds."""
    n, total = Counter(), Counter()
    for r in records:
        n[str(r[key])] += 1
        total[str(r[key])] += r[2]
    thirds = sorted((k, i) for k in n for i in range(3, n[k] + 1, 3))
    return {k: (list(range(1, n[k] + 1)), total[k]) for k in n}, thirds


@pytest.mark.parametrize("parts", [1, pytest.param(5, marks=pytest.mark.slow), pytest.param(17, marks=pytest.mark.slow)])
def test_processing_time_lanes_give_the_same_results_however_the_input_splits_into_batches(spark, tmp_path, parts):
    """Without event time: a keyed step and a map after it, read by two running aggregates
    keyed differently (one's side output read by a sink, the other behind a filter) and a
    sink; per key, each lane's counts and sums are the plain-Python ones for 1, 5 or 17
    micro-batches."""
    batches = _records(parts)
    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path / "ckpt", parallelism=2, spark=spark)
    by_k, by_g, thirds, raw = CollectSink(), CollectSink(), CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(batches, "i bigint, k string, v bigint, g bigint"), name="events")
    first = (src.key_by("i").process(Dedupe(), "i bigint, k string, v bigint, g bigint", name="first")
             .map(lambda r: {**r, "v": r["v"] * 2}, name="doubled"))  # shared by every reader: runs once
    k_lane = first.key_by("k").process(Running("k"), RUNNING, name="by-k")
    k_lane.sink_to(by_k, name="by-k-out")
    k_lane.get_side_output(THIRDS).sink_to(thirds, name="thirds-out")
    first.filter("g <> 2").key_by("g").process(Running("g"), RUNNING, name="by-g").sink_to(by_g, name="by-g-out")
    first.select("i", name="ids").sink_to(raw, name="raw")
    env.execute(f"fan-out-split-{parts}", progress=False)
    records = [(i, k, v * 2, g) for b in batches for i, k, v, g in b]
    want_k, want_thirds = _expected(records, 1)
    want_g, _ = _expected([r for r in records if r[3] != 2], 3)

    def running(sink):
        seqs = defaultdict(list)
        for r in sink.rows():
            seqs[r["key"]].append((r["n"], r["total"]))
        return {k: ([n for n, _ in sorted(v)], max(v)[1]) for k, v in seqs.items()}

    assert running(by_k) == want_k
    assert running(by_g) == want_g
    assert sorted((r["key"], r["n"]) for r in thirds.rows()) == want_thirds
    assert sorted(r["i"] for r in raw.rows()) == list(range(120))


def test_click_fan_out_example(spark, load_example):
    example = load_example("click_fan_out")
    sinks = example.run()
    unique = {c[3]: c for b in example.BATCHES for c in b}.values()  # the first of each click id (all equal)
    campaigns = {c["campaign"] for c in example.CAMPAIGNS}
    windows = Counter((c[0] - c[0] % 2_000, c[2]) for c in unique if c[2] in campaigns)
    unknown = sorted(c[3] for c in unique if c[2] not in campaigns)
    assert unknown and sorted(json.loads(r["raw"])["click_id"] for r in sinks["unknown"].rows()) == unknown
    assert Counter({(r["window_start"], r["campaign"]): r["count"] for r in sinks["per_campaign"].rows()}) == windows
    assert sorted((r["window_start"], r["campaign"], r["clicks"]) for r in sinks["hot"].rows()) == sorted(
        (w, c, n) for (w, c), n in windows.items() if n >= 3)
    assert any(n >= 3 for n in windows.values())
    per_user = Counter(c[1] for c in unique)
    assert Counter(r["user"] for r in sinks["per_user"].rows()) == per_user  # one running count per click
    assert sorted(r["user"] for r in sinks["flagged"].rows()) == sorted(u for u, n in per_user.items() if n >= 3)
    assert sorted(r["click_id"] for r in sinks["clicks"].rows()) == sorted(c[3] for c in unique)
    assert sorted(r["click_id"] for r in sinks["received"].rows()) == sorted(c[3] for b in example.BATCHES for c in b)


ODD = OutputTag("odd", SCHEMA)


class SplitOdd(KeyedProcessFunction):
    """Even values to the main output, odd ones to the side output ``odd``."""

    def process_element(self, value, ctx):
        if value["v"] % 2:
            ctx.output(ODD, value)
        else:
            yield value


@pytest.mark.parametrize("fanned", [pytest.param(False, marks=pytest.mark.slow), True], ids=["chain", "fan-out"])
def test_a_side_output_feeds_a_window_with_its_records_event_time(env, fanned):
    """Flink: a side output's records carry their timestamps, so a window reading it fires as
    one reading the main output would. Alone (a chain through the side output) and beside a
    window and a sink of the main output (a fan-out), against the model."""
    batches = model.random_batches(8)
    odd_expected = model.windows(batches, 1_000, "tumbling", 2_000, keep=lambda r: r[2] % 2 == 1)
    even_expected = model.windows(batches, 1_000, "tumbling", 6_000, keep=lambda r: r[2] % 2 == 0)
    assert odd_expected.fired and even_expected.fired
    odd, even, raw = CollectSink(), CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
    split = src.key_by("k").process(SplitOdd(), SCHEMA, name="split")
    (split.get_side_output(ODD).key_by("k").window(TumblingEventTimeWindows.of(2_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="odd-windows").sink_to(odd, name="odd-out"))
    if fanned:
        (split.key_by("k").window(TumblingEventTimeWindows.of(6_000))
            .aggregate(CountSum(), output_schema="n bigint, v bigint", name="even-windows").sink_to(even, name="even-out"))
        split.sink_to(raw, name="raw")
    result = env.execute("side-output-window", progress=False)
    assert _fired(odd, batches, "v") == odd_expected.fired
    late = odd_expected.late
    if fanned:
        assert _fired(even, batches, "v") == even_expected.fired
        assert sorted((r["ts"], r["k"], r["v"]) for r in raw.rows()) == sorted(
            r for b in batches for r in b if r[2] % 2 == 0)
        late += even_expected.late
    assert result.late_dropped == late


def test_filters_and_a_map_on_a_side_output_read_by_lanes_see_its_records(env):
    """A side output read by three window lanes, through a filter of their own (SQL; Python)
    or a map of its own, beside a window on the main output and a sink of it: the side
    output's fields have the main output's names, and each filter and the map see the side
    output's records; every window equals the model's on the records its lane reads."""
    batches = model.random_batches(8)
    big = model.windows(batches, 1_000, "tumbling", 2_000, keep=lambda r: r[2] % 2 == 1 and r[2] > 4)
    small = model.windows(batches, 1_000, "tumbling", 3_000, keep=lambda r: r[2] % 2 == 1 and r[2] < 5 and r[1] != "a")
    tenfold = [[(ts, k.upper(), v * 10) for ts, k, v in b] for b in batches]  # (every record: the watermark's)
    mapped = model.windows(tenfold, 1_000, "tumbling", 2_000, keep=lambda r: r[2] // 10 % 2 == 1)
    even = model.windows(batches, 1_000, "tumbling", 6_000, keep=lambda r: r[2] % 2 == 0)
    assert big.fired and small.fired and mapped.fired and even.fired
    sinks = {name: CollectSink() for name in ("big", "small", "mapped", "even", "raw")}
    src = env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
    split = src.key_by("k").process(SplitOdd(), SCHEMA, name="split")
    odd = split.get_side_output(ODD)
    (odd.filter("v > 4", name="big").key_by("k").window(TumblingEventTimeWindows.of(2_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="big-windows").sink_to(sinks["big"], name="big-out"))
    (odd.filter(lambda r: r["v"] < 5 and r["k"] != "a", name="small").key_by("k").window(TumblingEventTimeWindows.of(3_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="small-windows").sink_to(sinks["small"], name="small-out"))
    (odd.map(lambda r: {"ts": r["ts"], "k": r["k"].upper(), "v": r["v"] * 10}, SCHEMA, name="tenfold")
        .key_by("k").window(TumblingEventTimeWindows.of(2_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="mapped-windows").sink_to(sinks["mapped"], name="mapped-out"))
    (split.key_by("k").window(TumblingEventTimeWindows.of(6_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="even-windows").sink_to(sinks["even"], name="even-out"))
    split.sink_to(sinks["raw"], name="raw")
    result = env.execute("side-output-filters", progress=False)
    assert _fired(sinks["big"], batches, "v") == big.fired
    assert _fired(sinks["small"], batches, "v") == small.fired
    assert _fired(sinks["mapped"], batches, "v") == mapped.fired
    assert _fired(sinks["even"], batches, "v") == even.fired
    assert sorted((r["ts"], r["k"], r["v"]) for r in sinks["raw"].rows()) == sorted(
        r for b in batches for r in b if r[2] % 2 == 0)
    assert result.late_dropped == big.late + small.late + mapped.late + even.late


DROP = "\0dropped"  # the model's stand-in for a record a lane's steps drop (its time still moves the watermark)


WEIGHTS = {"A": 1, "B": 3}  # (no "C": an inner lookup drops its records)


def _tenfold(r):
    if r["k"] == "a" and r["v"] in (3, 7):
        raise ValueError("no tenfold a")
    return {"ts": r["ts"], "k": r["k"].upper(), "v": r["v"] * 10}


def _threefold(pdf):
    if ((pdf["k"] == "c") & (pdf["v"] == 2)).any():
        raise ValueError("no threefold c 2")
    return pdf.assign(v=pdf["v"] * 3)


def _several(r):
    if r["k"] == "c":
        raise ValueError("c cannot be counted")
    return r["n"] > 10


def test_chains_of_filters_maps_flat_maps_and_selects_on_the_lanes_own_paths(env):
    """Each lane reads the records through a chain of its own: on the side output a map
    (with dead letters), a Python filter, a lookup join (its unmatched records to a sink), a
    flat_map and a select; on the main output a SQL filter, a map, a map_batches (with dead
    letters: a failing batch narrowed down to its bad record) and a SQL filter on the mapped
    fields; between that lane's window and a process function (a second level) a map,
    a Python filter (with dead letters) and a select. Every output equals the model's on the
    records its chain makes, with the event time each map kept; the records a step raised on
    (or found no match for) are its dead letters, once each, the job going on."""
    batches = model.random_batches(32)  # (a seed whose records reach every path: kept, dropped, failed)

    def side(ts, k, v):  # map (upper key, tenfold) -> filter (> 20) -> lookup (weight; C: none) -> flat_map (+/-)
        w = WEIGHTS.get(k.upper())
        if v % 2 and v > 2 and w is not None and not (k == "a" and v in (3, 7)):
            return [(ts, k.upper(), v * 10 * w), (ts, k.upper(), -v * 10 * w)]
        return [(ts, DROP, 0)]

    def main(ts, k, v):  # filter (v > 2) -> map (v // 2) -> map_batches (threefold; fails on c 2) -> filter (k <> 'b')
        return (ts, k, v // 2 * 3) if v % 2 == 0 and v > 2 and k != "b" and (k, v // 2) != ("c", 2) else (ts, DROP, 0)

    odd = model.windows([[r for t in b for r in side(*t)] for b in batches], 1_000, "tumbling", 2_000,
                        keep=lambda r: r[1] != DROP)
    w = model.windows([[main(*t) for t in b] for b in batches], 1_000, "tumbling", 2_000, keep=lambda r: r[1] != DROP)
    results, _ = model.window_then_timers([[main(*t) for t in b] for b in batches], 1_000, 2_000, 1_500,
                                          keep=lambda k, n: k != DROP)
    seen, fired = model.window_then_timers([[main(*t) for t in b] for b in batches], 1_000, 2_000, 1_500,
                                           keep=lambda k, n: k not in (DROP, "c") and n > 1)
    seen = [(k, end, n * 10, *rest) for k, end, n, *rest in seen]
    failed_maps = Counter((ts, k, v) for b in batches for ts, k, v in b if v % 2 and k == "a" and v in (3, 7))
    failed_filters = Counter((k, end) for k, end, *_ in results if k == "c")
    failed_batches = Counter((ts, k, v // 2) for b in batches for ts, k, v in b if v % 2 == 0 and (k, v // 2) == ("c", 2))
    unmatched = Counter((ts, k.upper(), v * 10) for b in batches for ts, k, v in b if v % 2 and v > 2 and k.upper() not in WEIGHTS)
    assert odd.fired and seen and fired and failed_maps and failed_filters and unmatched and failed_batches
    assert odd.late + w.late > 0
    odd_out, reports, raw, dead_maps, dead_filters, unweighed, dead_batches = (CollectSink() for _ in range(7))
    src = env.from_source(ScriptedSource(batches, SCHEMA), BOUND, name="events")
    split = src.key_by("k").process(SplitOdd(), SCHEMA, name="split")
    ten = split.get_side_output(ODD).map(_tenfold, SCHEMA, dead_letter=OutputTag("no_ten"), name="ten")
    ten.get_side_output(OutputTag("no_ten")).sink_to(dead_maps, name="dead-maps")
    weighed = ten.filter(lambda r: r["v"] > 20, name="big").join_lookup(
        [{"k": k, "w": w} for k, w in WEIGHTS.items()], "k", unmatched=OutputTag("unweighed"), name="weigh")
    weighed.get_side_output(OutputTag("unweighed")).sink_to(unweighed, name="unweighed")
    (weighed.flat_map(lambda r: [{**r, "v": r["v"] * r["w"]}, {**r, "v": -r["v"] * r["w"]}], SCHEMA, name="twice")
        .select("ts", "k", "v", name="fields").key_by("k").window(TumblingEventTimeWindows.of(2_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="odd-windows").sink_to(odd_out, name="odd-out"))
    tripled = (split.filter("v > 2", name="over-two").map(lambda r: {**r, "v": r["v"] // 2}, SCHEMA, name="half")
               .map_batches(_threefold, SCHEMA, batch_format="pandas", dead_letter=OutputTag("not_tripled"), name="triple"))
    tripled.get_side_output(OutputTag("not_tripled")).sink_to(dead_batches, name="dead-batches")
    several = (tripled.filter("k <> 'b'", name="not-b").key_by("k").window(TumblingEventTimeWindows.of(2_000))
               .aggregate(CountSum(), output_schema="n bigint, v bigint", name="w")
               .map(lambda r: {**r, "n": r["n"] * 10}, "k string, window_start bigint, window_end bigint, n bigint, v bigint",
                    name="tenfold").filter(_several, dead_letter=OutputTag("unsure"), name="several"))
    several.get_side_output(OutputTag("unsure")).sink_to(dead_filters, name="dead-filters")
    (several.select("k", "window_start", "window_end", "n", name="result")
        .key_by("k").process(Report(1_500), "k string, what string, end bigint, n bigint, ts bigint, wm bigint",
                             name="report").sink_to(reports, name="reports"))
    split.sink_to(raw, name="raw")
    result = env.execute("fan-out-chains", progress=False)
    assert _fired(odd_out, batches, "v") == odd.fired
    assert result.late_dropped == odd.late + w.late  # (each window drops its own lane's late records)
    assert _reported(reports, batches) == (seen, fired)
    assert Counter((r["ts"], r["k"], r["v"]) for r in raw.rows()) == Counter(r for b in batches for r in b if r[2] % 2 == 0)
    letters = [(json.loads(r["raw"]), r["error"]) for r in dead_maps.rows()]
    assert Counter((d["ts"], d["k"], d["v"]) for d, _ in letters) == failed_maps
    assert all(e == "step 'ten': _tenfold raised ValueError: no tenfold a" for _, e in letters)
    letters = [(json.loads(r["raw"]), r["error"]) for r in dead_filters.rows()]
    assert Counter((d["k"], d["window_end"]) for d, _ in letters) == failed_filters
    assert all(e == "step 'several': _several raised ValueError: c cannot be counted" for _, e in letters)
    letters = [(json.loads(r["raw"]), r["error"]) for r in dead_batches.rows()]
    assert Counter((d["ts"], d["k"], d["v"]) for d, _ in letters) == failed_batches
    assert all(e == "step 'triple': _threefold raised ValueError: no threefold c 2" for _, e in letters)
    letters = [(json.loads(r["raw"]), r["error"]) for r in unweighed.rows()]
    assert Counter((d["ts"], d["k"], d["v"]) for d, _ in letters) == unmatched
    assert all(e == 'no match in the lookup table for k = {"k":"C"}' for _, e in letters)


def test_keyed_steps_after_a_lane_run_as_a_second_level_with_flinks_timestamps(env):
    """dedupe -> {2 s window -> filters (SQL, Python) -> select -> a process function with
    timers, 6 s window, raw sink}: the process function reads the window lane's results that
    pass the filters, through the select (a second level of lanes), with Flink's timestamps
    and watermark, and fires its timers when Flink would; the other outputs pass the second
    level and equal the model's."""
    batches = model.random_batches(8)
    given = [b + b[:1] for b in batches]
    distinct = _distinct(given)
    seen, fired = model.window_then_timers(distinct, 1_000, 2_000, 1_500, keep=lambda k, n: n > 1 and k != "c")
    unfiltered, _ = model.window_then_timers(distinct, 1_000, 2_000, 1_500)
    assert 0 < len(seen) < len(unfiltered)  # the filters let some results through, not all
    seen = [(k, end, n * 10, *rest) for k, end, n, *rest in seen]  # (the select's tenfold count)
    large_expected = model.windows(distinct, 1_000, "tumbling", 6_000)
    reports, large, raw = CollectSink(), CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(given, SCHEMA), BOUND, name="events")
    deduped = src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    (deduped.key_by("k").window(TumblingEventTimeWindows.of(2_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="w")
        .filter("n > 1", name="several").filter(lambda r: r["k"] != "c", name="not-c")
        .select("k", "window_start", "window_end", "n * 10 AS n", name="tenfold")
        .key_by("k").process(Report(1_500), "k string, what string, end bigint, n bigint, ts bigint, wm bigint",
                             name="report").sink_to(reports, name="reports"))
    (deduped.key_by("k").window(TumblingEventTimeWindows.of(6_000))
        .aggregate(CountSum(), output_schema="n bigint, v bigint", name="large").sink_to(large, name="large-out"))
    deduped.sink_to(raw, name="raw")
    env.execute("fan-out-levels", progress=False)
    assert _reported(reports, batches) == (seen, fired)
    assert _fired(large, batches, "v") == large_expected.fired
    assert Counter((r["ts"], r["k"], r["v"]) for r in raw.rows()) == Counter(r for b in distinct for r in b)


@pytest.mark.parametrize("beside", [True, False])
def test_a_keyed_step_reading_a_union_of_branches_of_a_fan_out_sees_each_branchs_records(env, beside):
    """dedupe -> {even values, not key 'a' -> hundredfold} -> union -> a per-key tally (and,
    ``beside``, a raw sink of the dedupe): the tally sees every record of each branch once
    (a record on both branches twice), as Flink's union forwards both inputs; each key's
    counts are 1..m and its last total the sum of its values on both branches. One Spark
    operator per keyed step: before, the job planned the dedupe once per branch of the union
    (3 operators, each with its state) or, with the raw sink, was refused."""
    batches = model.random_batches(11)
    given = [b + b[:2] for b in batches]
    distinct = [r for b in _distinct(given) for r in b]
    left = [r for r in distinct if r[2] % 2 == 0]
    right = [(ts, k, v * 100) for ts, k, v in distinct if k != "a"]
    assert set(left) & {(ts, k, v) for ts, k, v in distinct if k != "a"} and left and right  # both branches share records
    tallies, raw = CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(given, SCHEMA), None, name="events")
    deduped = src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    evens = deduped.filter("v % 2 = 0", name="evens")
    hundredfold = deduped.filter(lambda r: r["k"] != "a", name="not-a").map(
        lambda r: {**r, "v": r["v"] * 100}, SCHEMA, name="hundredfold")
    (evens.union(hundredfold, name="both").key_by("k")
        .process(RunningTotal(), OUT, name="tally").sink_to(tallies, name="tallies"))
    name = f"fan-out-union-{beside}"
    if beside:
        deduped.sink_to(raw, name="raw")
    env.execute(name, progress=False)
    rows = tallies.rows()
    assert Counter((r["ts"], r["k"]) for r in rows) == Counter((ts, k) for ts, k, _ in left + right)
    by_key = defaultdict(list)
    for r in rows:
        by_key[r["k"]].append((r["n"], r["total"]))
    for k, seen in by_key.items():
        expected = [v for _, key, v in left + right if key == k]
        assert sorted(n for n, _ in seen) == list(range(1, len(expected) + 1))
        assert max(seen)[1] == sum(expected)
    if beside:
        assert Counter((r["ts"], r["k"], r["v"]) for r in raw.rows()) == Counter(distinct)
    assert len(os.listdir(os.path.join(env.config.checkpoint_dir, name, "state"))) == 2


class Scaled(KeyedProcessFunction):
    """Passes each record on with its value times ``factor`` (a keyed step that keeps no state)."""

    def __init__(self, factor):
        self.factor = factor

    def process_element(self, value, ctx):
        yield {**value, "v": value["v"] * self.factor}


def test_a_second_level_step_reading_two_lanes_through_a_union_sees_each_branchs_records(env):
    """dedupe -> {twice, thrice} (two lanes) -> {twice's values divisible by 4, thrice's plus
    one} -> union -> a per-key tally (a second level reading both lanes through the union),
    and a raw sink of 'twice': the tally sees every record of both branches once, its counts
    per key 1..m and its last total their sum (refused before)."""
    batches = model.random_batches(12)
    given = [b + b[:1] for b in batches]
    distinct = [r for b in _distinct(given) for r in b]
    twice = [(ts, k, v * 2) for ts, k, v in distinct]
    branches = [r for r in twice if r[2] % 4 == 0] + [(ts, k, v * 3 + 1) for ts, k, v in distinct]
    assert 0 < len([r for r in twice if r[2] % 4 == 0]) < len(twice)
    tallies, raw = CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(given, SCHEMA), None, name="events")
    deduped = src.key_by("k", "ts", "v").process(Dedupe(), SCHEMA, name="dedupe")
    doubled = deduped.key_by("k").process(Scaled(2), SCHEMA, name="twice")
    tripled = deduped.key_by("k").process(Scaled(3), SCHEMA, name="thrice")
    (doubled.filter("v % 4 = 0", name="fours").union(tripled.map(lambda r: {**r, "v": r["v"] + 1}, SCHEMA, name="plus-one"),
                                                     name="both")
        .key_by("k").process(RunningTotal(), OUT, name="tally").sink_to(tallies, name="tallies"))
    doubled.sink_to(raw, name="raw")
    env.execute("fan-out-level-union", progress=False)
    rows = tallies.rows()
    assert Counter((r["ts"], r["k"]) for r in rows) == Counter((ts, k) for ts, k, _ in branches)
    for k in {k for _, k, _ in branches}:
        seen = sorted((r["n"], r["total"]) for r in rows if r["k"] == k)
        expected = [v for _, key, v in branches if key == k]
        assert [n for n, _ in seen] == list(range(1, len(expected) + 1)) and seen[-1][1] == sum(expected)
    assert Counter((r["ts"], r["k"], r["v"]) for r in raw.rows()) == Counter(twice)
