"""The CEP step drops, before queueing them, the events no stage, negation, ``until`` or greedy
guard can see (nfa.relevance) — only where that cannot change a match: the step's output,
timed-out partial matches and late events included, is the same as with every event queued,
and its matches are the reference's (tests/cep_model.py). Driven through the keyed runtime's
bucket function (event time, the watermark a batch behind, as on Spark), without Spark."""

from __future__ import annotations

from collections import defaultdict

import cep_model
import pandas as pd
import pytest
from cep_bucket import BucketState, batches, drive

from ember import OutputTag
from ember.cep import Pattern, PatternProcessFunction, SkipStrategy
from ember.cep.nfa import compile_pattern, relevance, sql_relevance
from ember.cep.operator import SQL_PREFIX, CepFunction
from ember.runner.spark.keyed.bucket import BucketFunction
from ember.runner.spark.keyed.runtime import TAG, side_column

W = 6
BOUND = 3
FIELDS = ["k", "ts", "t", "v"]


def is_(kind):
    return lambda e: e["t"] == kind


PATTERNS = {
    "followed_by": Pattern.begin("a").where(is_("a")).followed_by("b").where(is_("b")).within(W),
    "any_loop_until": Pattern.begin("a").where(is_("a")).followed_by_any("b").where(is_("b")).times_or_more(1)
    .allow_combinations().until(is_("d")).followed_by("c").where(is_("c")).within(W),
    "not_followed_by": Pattern.begin("a").where(is_("a")).not_followed_by("x").where(is_("d"))
    .followed_by("c").where(lambda e: e["v"] > 4).within(W),
    "trailing_not": Pattern.begin("a").where(is_("a")).not_followed_by("x").where(is_("b")).within(W),
    "greedy_skip": Pattern.begin("a", skip=SkipStrategy.skip_past_last_event()).where(is_("a"))
    .followed_by("b").where(lambda e: e["t"] in "bc" and e["v"] < 5).one_or_more().greedy()
    .followed_by("c").where(is_("c")).within(W),
}
STRICT = {
    "next": Pattern.begin("a").where(is_("a")).next("b").where(is_("b")),
    "consecutive": Pattern.begin("a").where(is_("a")).followed_by("b").where(is_("b")).times(2).consecutive(),
    "not_next": Pattern.begin("a").where(is_("a")).not_next("x").where(is_("b")).followed_by("c").where(is_("c")),
    "iterative": Pattern.begin("a").where(is_("a")).followed_by("b").where(lambda e, ctx: e["v"] > ctx["a"][0]["v"]),
}


class Emit(PatternProcessFunction):
    def process_match(self, match, ctx):
        yield {"k": match[next(iter(match))][0]["k"], "seqs": " ".join(str(e["ts"] * 100 + e["n"]) for s in match.values() for e in s)}

    def process_timed_out_match(self, match, ctx):
        yield {"k": match[next(iter(match))][0]["k"], "seqs": " ".join(str(e["ts"] * 100 + e["n"]) for s in match.values() for e in s)}


class EveryEvent(CepFunction):
    def open(self, ctx):
        super().open(ctx)
        self._relevant = None



def run(fn_type, pattern, data, in_batch=False):
    fn = fn_type(pattern, Emit(), "cep", timed_out=OutputTag("partial", "k string, seqs string"))
    out, state = drive(fn, data, [*FIELDS, "n"], ["k", "seqs"], {"partial": ["k", "seqs"]}, BOUND, in_batch=in_batch)
    rows = [tuple(r) for r in out[["k", "seqs", TAG]].itertuples(index=False, name=None)]
    return sorted(rows, key=repr), state


def reference(pattern, data):
    """The reference's matches per key over the events that were not late when they came
    (``ts <=`` Flink's watermark ``max - bound - 1`` over the batches before)."""
    per_key, watermark = defaultdict(list), None
    for batch in data:
        for e in batch:
            if watermark is None or e["ts"] > watermark:
                per_key[e["k"]].append(e)
        if batch:
            latest = max(e["ts"] for e in batch) - BOUND - 1
            watermark = latest if watermark is None else max(watermark, latest)
    out = []
    for key, events in per_key.items():
        events = sorted(events, key=lambda e: e["ts"])
        for m in cep_model.emitted(pattern, events, [e["ts"] for e in events]):
            out.append((key, " ".join(str(e["ts"] * 100 + e["n"]) for s in m.values() for e in s)))
    return sorted(out)


@pytest.mark.parametrize("in_batch", [False, True], ids=["next-batch", "in-batch"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_dropping_what_no_stage_sees_changes_nothing(name, in_batch):
    """Also with the watermark advanced within each batch (events the batch makes due are
    matched in the batch's own call, from two frames sorted apart): the same output."""
    pattern = PATTERNS[name]
    relevant = relevance(compile_pattern(pattern))
    assert relevant is not None
    dropped = checked = 0
    for seed in range(12):
        data = batches(seed, BOUND)
        dropped += sum(not relevant(e) for b in data for e in b)
        got, _ = run(CepFunction, pattern, data, in_batch)
        assert got == run(EveryEvent, pattern, data, in_batch)[0], seed
        assert sorted((k, s) for k, s, tag in got if tag is None) == reference(pattern, data), seed
        if in_batch:
            assert got == run(CepFunction, pattern, data)[0], seed
        checked += any(tag is None for *_, tag in got)
    assert dropped > 0 and checked > 0


@pytest.mark.parametrize("name", ["followed_by", "strict"])
def test_matches_the_batch_makes_due_come_out_in_that_batch(name):
    """With the watermark advanced within the batch, a match whose events the batch's own
    records make due is emitted in that batch's call, not the next (bound 0: all but the
    batch's latest millisecond are due)."""
    pattern = PATTERNS["followed_by"] if name == "followed_by" else STRICT["next"]
    data = [[{"k": "x", "ts": 1, "t": "a", "v": 0, "n": 1}, {"k": "x", "ts": 2, "t": "b", "v": 0, "n": 2},
             {"k": "y", "ts": 3, "t": "c", "v": 0, "n": 3}], [{"k": "y", "ts": 4, "t": "c", "v": 0, "n": 4}]]
    fn = CepFunction(pattern, Emit(), "cep")
    bucket_fn = BucketFunction(fn, "cep", ["k"], [*FIELDS, "n"], ["k", "seqs"], "ts", True, counters={}, advance_ms=0)
    state = BucketState(None, 0)
    first = pd.concat(list(bucket_fn(0, iter([pd.DataFrame(data[0])]), state)))
    assert first[["k", "seqs"]].values.tolist() == [["x", "101 202"]]


@pytest.mark.parametrize("name", sorted(STRICT))
def test_every_event_counts_under_strict_contiguity_or_an_iterative_condition(name):
    assert relevance(compile_pattern(STRICT[name])) is None


# The same patterns with SQL conditions (Spark computes each as a column before the step:
# here from its Python twin), where the step tests relevance on those columns, building a
# dict only for the events it keeps (nfa.sql_relevance).
SQL = {"t = 'a'": is_("a"), "t = 'b'": is_("b"), "t = 'c'": is_("c"), "t = 'd'": is_("d"), "v > 4": lambda e: e["v"] > 4}
SQL_COLUMNS = {expr: f"{SQL_PREFIX}{i}" for i, expr in enumerate(SQL)}
SQL_PATTERNS = {
    "followed_by": Pattern.begin("a").where("t = 'a'").followed_by("b").where("t = 'b'").within(W),
    "any_loop_until": Pattern.begin("a").where("t = 'a'").followed_by_any("b").where("t = 'b'").times_or_more(1)
    .allow_combinations().until("t = 'd'").followed_by("c").where("t = 'c'").within(W),
    "not_followed_by": Pattern.begin("a").where("t = 'a'").not_followed_by("x").where("t = 'd'")
    .followed_by("c").where("v > 4").within(W),
    "trailing_not": Pattern.begin("a").where("t = 'a'").not_followed_by("x").where("t = 'b'").within(W),
}


def run_sql(fn_type, pattern, data, in_batch):
    with_columns = [[{**e, **{SQL_COLUMNS[x]: test(e) for x, test in SQL.items()}} for e in batch] for batch in data]
    fn = fn_type(pattern, Emit(), "cep", timed_out=OutputTag("partial", "k string, seqs string"), sql_columns=SQL_COLUMNS)
    out, _ = drive(fn, with_columns, [*FIELDS, "n", *SQL_COLUMNS.values()], ["k", "seqs"], {"partial": ["k", "seqs"]},
                   BOUND, in_batch=in_batch)
    return sorted((tuple(r) for r in out[["k", "seqs", TAG]].itertuples(index=False, name=None)), key=repr), fn


@pytest.mark.parametrize("in_batch", [False, True], ids=["next-batch", "in-batch"])
@pytest.mark.parametrize("name", sorted(SQL_PATTERNS))
def test_sql_conditions_are_tested_for_relevance_on_their_columns_and_change_nothing(name, in_batch):
    pattern = SQL_PATTERNS[name]
    dropped = checked = 0
    for seed in range(12):
        data = batches(seed, BOUND)
        got, fn = run_sql(CepFunction, pattern, data, in_batch)
        assert fn._relevant_columns is not None  # the columnar test ran
        assert got == run_sql(EveryEvent, pattern, data, in_batch)[0], seed
        assert got == run(CepFunction, PATTERNS[name], data, in_batch)[0], seed  # the Python twin's output
        assert sorted((k, s) for k, s, tag in got if tag is None) == reference(PATTERNS[name], data), seed
        used = {x for x, column in SQL_COLUMNS.items() if column in fn._relevant_columns}
        dropped += sum(not any(SQL[x](e) for x in used) for b in data for e in b)
        checked += any(tag is None for *_, tag in got)
    assert dropped > 0 and checked > 0


def test_a_python_condition_or_a_stage_without_one_keeps_the_test_per_event():
    assert sql_relevance(SQL_PATTERNS["followed_by"], SQL_COLUMNS) == (SQL_COLUMNS["t = 'a'"], SQL_COLUMNS["t = 'b'"])
    mixed = Pattern.begin("a").where("t = 'a'").followed_by("b").where(is_("b"))
    assert sql_relevance(mixed, SQL_COLUMNS) is None
    until = Pattern.begin("a").where("t = 'a'").followed_by("b").where("t = 'b'").one_or_more().until(is_("d"))
    assert sql_relevance(until, SQL_COLUMNS) is None
    bare = Pattern.begin("a").where("t = 'a'").followed_by("any")
    assert sql_relevance(bare, SQL_COLUMNS) is None


@pytest.mark.parametrize("in_batch", [False, True], ids=["next-batch", "in-batch"])
def test_late_events_reach_the_late_output_whatever_their_relevance_with_sql_conditions(in_batch):
    """A late event is sent on (or counted) whether or not a condition holds for it: the
    columnar relevance test keeps it, as the per-event one does."""
    late_fields = ["k", "ts", "t", "v", "n"]
    sent = irrelevant = 0
    for seed in range(12):
        data = batches(seed, BOUND)
        expected, watermark = [], None
        for batch in data:
            expected += [tuple(e[f] for f in late_fields) for e in batch if watermark is not None and e["ts"] <= watermark]
            if batch:
                latest = max(e["ts"] for e in batch) - BOUND - 1
                watermark = latest if watermark is None else max(watermark, latest)
        with_columns = [[{**e, **{SQL_COLUMNS[x]: test(e) for x, test in SQL.items()}} for e in batch] for batch in data]
        fn = CepFunction(SQL_PATTERNS["followed_by"], Emit(), "cep", sql_columns=SQL_COLUMNS,
                         late=OutputTag("late", "k string, ts bigint, t string, v bigint, n bigint"))
        out, _ = drive(fn, with_columns, [*FIELDS, "n", *SQL_COLUMNS.values()], ["k", "seqs"], {"late": late_fields},
                       BOUND, in_batch=in_batch)
        got = [tuple(r[side_column("late", f)] for f in late_fields) for _, r in out.iterrows() if r[TAG] == "late"]
        assert sorted(got) == sorted(expected), seed
        sent += len(got)
        irrelevant += sum(t not in "ab" for _, _, t, _, _ in got)  # no condition of the pattern holds for these
    assert sent > 0 and irrelevant > 0
