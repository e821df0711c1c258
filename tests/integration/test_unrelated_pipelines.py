"""Unrelated pipelines in one job: a stateless pipeline of its own (sources, steps, sinks that
share nothing with the rest) runs beside the rest in the one streaming query
(translators/parts.py), each part's sinks getting what the part would write as a job alone —
checked against plain-Python models, and across a stop and restart."""

import json
from collections import Counter
from datetime import timedelta

import pytest

from ember import (
    Agg,
    CollectSink,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    OutputTag,
    PipelineError,
    ScriptedSource,
    StreamEnvironment,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from ember.savepoints import create_savepoint
from ember.state.descriptors import ValueStateDescriptor

pytestmark = pytest.mark.spark

EVENTS = "ts bigint, k string, v int"
ORDERS = "id bigint, body string"
BOUND = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts")
SIZE = 4_000


def _events(batches=6, per_batch=12):
    """In order within the bound (no late record): each window's count is its records'."""
    out, ts = [], 0
    for b in range(batches):
        rows = []
        for i in range(per_batch):
            ts += 150
            rows.append((ts - (i % 3) * 100, "abc"[(b + i) % 3], b * per_batch + i))
        out.append(rows)
    return out


def _orders(batches=6, per_batch=5):
    """JSON bodies, every fourth not JSON at all and some with a zero amount."""
    out, n = [], 0
    for _ in range(batches):
        rows = []
        for _ in range(per_batch):
            body = "not json {" if n % 4 == 3 else json.dumps({"amount": n % 5, "who": f"u{n % 3}"})
            rows.append((n, body))
            n += 1
        out.append(rows)
    return out


def _window_model(batches):
    counts, totals = Counter(), Counter()
    for b in batches:
        for ts, k, v in b:
            start = ts // SIZE * SIZE
            counts[(k, start, start + SIZE)] += 1
            totals[(k, start, start + SIZE)] += v
    return {w: (counts[w], totals[w]) for w in counts}


def _orders_model(batches):
    good, bad = [], []
    for b in batches:
        for id_, body in b:
            try:
                doc = json.loads(body)
            except ValueError:
                bad.append((id_, body))
                continue
            if doc["amount"] > 0:
                good.append((id_, doc["amount"], doc["who"]))
    return good, bad


def _job(env, events, orders):
    """A window over ``events`` and, unrelated, ``orders`` decoded into two sinks (split after
    the decoding) with their dead letters into a third."""
    sinks = {name: CollectSink() for name in ("windows", "paid", "who", "bad")}
    (env.from_source(ScriptedSource(events, EVENTS), BOUND, name="events")
        .key_by("k").window(TumblingEventTimeWindows.of(SIZE))
        .aggregate(n=Agg.count(), total=Agg.sum("v"), name="per-window").sink_to(sinks["windows"], name="windows"))
    bad = OutputTag("bad")
    decoded = (env.from_source(ScriptedSource(orders, ORDERS), name="orders")
               .parse_json("body", "amount int, who string", dead_letter=bad, name="decode"))
    paid = decoded.filter("amount > 0", name="paid-only")
    paid.select("id", "amount", "who").sink_to(sinks["paid"], name="paid")
    paid.select("who").sink_to(sinks["who"], name="who")
    decoded.get_side_output(bad).sink_to(sinks["bad"], name="bad")
    return sinks


def _windows(sink):
    fired = {}
    for r in sink.rows():
        window = (r["k"], r["window_start"], r["window_end"])
        assert window not in fired, f"window {window} emitted twice"
        fired[window] = (r["n"], r["total"])
    return fired


def _bad(sink):
    return sorted((json.loads(r["raw"])["id"] if r["raw"].startswith("{") else r["raw"], bool(r["error"]))
                  for r in sink.rows())


def test_a_stateless_pipeline_of_its_own_runs_beside_a_window_each_as_alone(env):
    """Refused before ("read from unrelated pipelines; execute each as its own job"): the
    window fires the model's windows, the unrelated pipeline's sinks get the model's rows and
    dead letters, each exactly once."""
    events, orders = _events(), _orders()
    sinks = _job(env, events, orders)
    result = env.execute("unrelated", progress=False)
    assert _windows(sinks["windows"]) == _window_model(events)
    good, bad = _orders_model(orders)
    assert sorted((r["id"], r["amount"], r["who"]) for r in sinks["paid"].rows()) == sorted(good)
    assert Counter(r["who"] for r in sinks["who"].rows()) == Counter(w for _, _, w in good)
    assert len(sinks["bad"].rows()) == len(bad) > 0 and all(r["error"] for r in sinks["bad"].rows())
    assert sorted(r["raw"] for r in sinks["bad"].rows()) == sorted(body for _, body in bad)
    assert result.events == sum(map(len, events)) + sum(map(len, orders)) and result.late_dropped == 0


def test_unrelated_stateless_pipelines_alone_run_as_one_job(env):
    """No step holds state: the first pipeline is the query's rest, the other runs beside it."""
    orders, more = _orders(batches=3), _orders(batches=4, per_batch=3)
    first, second = CollectSink(), CollectSink()
    env.from_source(ScriptedSource(orders, ORDERS), name="orders").select("id").sink_to(first, name="first")
    (env.from_source(ScriptedSource(more, ORDERS), name="more").filter("id % 2 = 0", name="even")
        .sink_to(second, name="second"))
    env.execute("two-stateless", progress=False)
    assert sorted(r["id"] for r in first.rows()) == sorted(i for b in orders for i, _ in b)
    assert sorted((r["id"], r["body"]) for r in second.rows()) == sorted(r for b in more for r in b if r[0] % 2 == 0)


def test_a_job_with_an_unrelated_pipeline_stopped_and_run_again_writes_what_one_run_writes(spark, tmp_path):
    """Exactly once across a stop: the halves of both parts equal one uninterrupted run's."""
    events, orders = _events(batches=8), _orders(batches=8)
    total = sum(map(len, events)) + sum(map(len, orders))

    def run(name, max_events):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=str(tmp_path / "ckpt"), parallelism=2, spark=spark)
        sinks = _job(env, events, orders)
        env.execute(name, progress=False, max_events=max_events)
        return {name: sorted(tuple(sorted(r.items())) for r in sink.rows()) for name, sink in sinks.items()}

    whole = run("unrelated-whole", None)
    head = run("unrelated-halves", total // 2)
    tail = run("unrelated-halves", None)
    assert 0 < len(head["paid"]) < len(whole["paid"]) and 0 < len(head["windows"]) < len(whole["windows"])
    for name in whole:
        assert sorted(head[name] + tail[name]) == whole[name], name


class Counting(KeyedProcessFunction):
    """Per key: how many records so far (emitted with each) and their ``amount`` in all."""

    def __init__(self, key):
        self.key = key

    def open(self, ctx):
        self.n, self.total = ctx.get_state(ValueStateDescriptor("n")), ctx.get_state(ValueStateDescriptor("total"))

    def process_element(self, r, ctx):
        n = (self.n.value() or 0) + 1
        self.n.update(n)
        self.total.update((self.total.value() or 0) + (r.get("amount") or 0))
        yield {"key": r[self.key], "n": n}


def test_a_keyed_step_on_processing_time_runs_beside_an_event_time_one_and_savepoints_read_each(spark, tmp_path):
    """Two unrelated pipelines holding state — a keyed step on event time and, beside it, one
    whose stream has no event time (its timers would be processing-time: no watermark) —
    stopped halfway and run again write what one run writes; the savepoint between reads each
    step's own state (Spark numbers the rest's operator first, the unrelated one's after)."""
    events, orders = _events(batches=8), _orders(batches=8)
    total = sum(map(len, events)) + sum(map(len, orders))

    def run(name, max_events):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=str(tmp_path / "ckpt"), parallelism=2, spark=spark)
        counted, per_who, bad = CollectSink(), CollectSink(), CollectSink()
        tag = OutputTag("bad")
        decoded = (env.from_source(ScriptedSource(orders, ORDERS), name="orders")
                   .parse_json("body", "amount int, who string", dead_letter=tag, name="decode"))
        (decoded.key_by("who").process(Counting("who"), "key string, n int", name="per-who")
            .sink_to(per_who, name="per-who-out"))
        decoded.get_side_output(tag).sink_to(bad, name="bad")
        (env.from_source(ScriptedSource(events, EVENTS), BOUND, name="events").key_by("k")
            .process(Counting("k"), "key string, n int", name="per-k").sink_to(counted, name="per-k-out"))
        env.execute(name, progress=False, max_events=max_events)
        return [sorted((r["key"], r["n"]) for r in sink.rows()) for sink in (counted, per_who)], len(bad.rows())

    whole, whole_bad = run("stateful-whole", None)
    head, head_bad = run("stateful-halves", total // 2)
    point = create_savepoint(str(tmp_path / "ckpt" / "stateful-halves"), root=str(tmp_path / "sp"))
    assert sorted(op["name"] for op in point.operators) == ["per-k", "per-who"]
    for step, out in (("per-k", head[0]), ("per-who", head[1])):
        seen = point.read_state(step, spark)
        counts = {k: max(n for kk, n in out if kk == k) for k, _ in out}
        assert {(k, v) for k, st, v in seen.itertuples(index=False, name=None) if st == "n"} == set(counts.items())
    tail, tail_bad = run("stateful-halves", None)
    _, bad = _orders_model(orders)
    who = Counter(body["who"] for b in orders for _, raw in b if (body := _json(raw)) is not None)
    keys = Counter(k for b in events for _, k, _ in b)
    assert whole == [sorted((k, i) for k, n in keys.items() for i in range(1, n + 1)),
                     sorted((k, i) for k, n in who.items() for i in range(1, n + 1))]
    assert 0 < len(head[1]) < len(whole[1]) and whole_bad == len(bad) == head_bad + tail_bad
    assert [sorted(h + t) for h, t in zip(head, tail)] == whole


class BothSides(KeyedCoProcessFunction):
    def open(self, ctx):
        self.seen = ctx.get_state(ValueStateDescriptor("seen"))

    def process_element1(self, r, ctx):
        self.seen.update((self.seen.value() or 0) + 1)
        yield {"key": r["key"], "side": 1}

    def process_element2(self, r, ctx):
        self.seen.update((self.seen.value() or 0) + 1)
        yield {"key": r["key"], "side": 2}


@pytest.mark.slow
def test_beside_a_two_input_step_reading_two_stateful_steps_each_steps_state_reads_back_as_its_own(spark, tmp_path):
    """The rest's operators carry explicit ids (a two-input step reading a keyed step on each
    input: Spark's depth-first walk); the unrelated pipeline's keyed step takes the id after
    theirs, and each step's state reads back from a savepoint as its own."""
    events, orders = _events(batches=3), _orders(batches=3)
    env = StreamEnvironment(master="local[2]", checkpoint_dir=str(tmp_path / "ckpt"), parallelism=2, spark=spark)
    left = env.from_source(ScriptedSource(events, EVENTS), BOUND, name="left-src").key_by("k").process(
        Counting("k"), "key string, n int", name="left")
    right = env.from_source(ScriptedSource(events[:2], EVENTS), BOUND, name="right-src").key_by("k").process(
        Counting("k"), "key string, n int", name="right")
    both = CollectSink()
    left.connect(right).key_by("key", "key").process(BothSides(), "key string, side int", name="both").sink_to(both)
    (env.from_source(ScriptedSource(orders, ORDERS), name="orders").filter("body LIKE '{%'", name="json-only")
        .select("id", "CAST(get_json_object(body, '$.amount') AS INT) AS amount",
                "get_json_object(body, '$.who') AS who", name="decode")
        .key_by("who").process(Counting("who"), "key string, n int", name="per-who").sink_to(CollectSink()))
    env.execute("beside-two-input", progress=False)
    assert Counter(r["side"] for r in both.rows()) == {1: sum(map(len, events)), 2: sum(map(len, events[:2]))}
    point = create_savepoint(str(tmp_path / "ckpt" / "beside-two-input"), root=str(tmp_path / "sp"))
    assert {op["name"]: op["spark operator id"] for op in point.operators} == {"both": 0, "left": 1, "right": 2,
                                                                                "per-who": 3}
    for step, rows in (("left", events), ("right", events[:2])):
        seen = point.read_state(step, spark)
        assert {(k, v) for k, st, v in seen.itertuples(index=False, name=None) if st == "n"} == set(
            Counter(k for b in rows for _, k, _ in b).items())
    seen = point.read_state("per-who", spark)
    who = Counter(body["who"] for b in orders for _, raw in b if (body := _json(raw)) is not None)
    assert {(k, v) for k, st, v in seen.itertuples(index=False, name=None) if st == "n"} == set(who.items())


def _json(raw):
    try:
        return json.loads(raw)
    except ValueError:
        return None


def test_two_unrelated_pipelines_holding_state_are_refused_naming_them(env):
    for name in ("a", "b"):
        (env.from_source(ScriptedSource(_events(batches=1), EVENTS), BOUND, name=f"events-{name}")
            .key_by("k").window(TumblingEventTimeWindows.of(SIZE)).count(name=f"count-{name}")
            .sink_to(CollectSink(), name=f"out-{name}"))
    with pytest.raises(PipelineError, match="step 'count-b'.*unrelated pipelines whose stateful steps both follow a "
                                            r"watermark \('count-a', 'count-b'\).*share one watermark"):
        env.execute("two-stateful", progress=False)


@pytest.mark.slow
def test_an_unrelated_pipeline_beside_a_fan_out_and_a_sql_branch(env):
    """The rest of the job is itself parted — a window and the raw records of one source (a
    fan-out at the source) and a SQL query over it on a branch of its own — and the unrelated
    pipeline runs beside all of them."""
    events, orders = _events(), _orders()
    windows, raw, per_key, paid = CollectSink(), CollectSink(), CollectSink(), CollectSink()
    src = env.from_source(ScriptedSource(events, EVENTS), BOUND, name="events")
    src.key_by("k").window(TumblingEventTimeWindows.of(SIZE)).aggregate(
        n=Agg.count(), total=Agg.sum("v"), name="per-window").sink_to(windows, name="windows")
    src.sink_to(raw, name="raw")
    src.create_view("events")
    env.sql(f"""SELECT k, unix_millis(window.start) AS window_start, unix_millis(window.end) AS window_end,
                       count(*) AS n, sum(v) AS total FROM events GROUP BY k, window(rowtime, '{SIZE} milliseconds')""",
            name="per-key").sink_to(per_key, name="per-key-out")
    (env.from_source(ScriptedSource(orders, ORDERS), name="orders")
        .select("id", "CAST(get_json_object(body, '$.amount') AS INT) AS amount", "get_json_object(body, '$.who') AS who",
                name="decode")
        .filter("amount > 0", name="paid-only").sink_to(paid, name="paid"))
    env.execute("unrelated-beside-parts", progress=False)
    assert _windows(windows) == _window_model(events)
    assert sorted((r["ts"], r["k"], r["v"]) for r in raw.rows()) == sorted(r for b in events for r in b)
    good, _ = _orders_model(orders)
    assert sorted((r["id"], r["amount"], r["who"]) for r in paid.rows()) == sorted(good)
    assert _windows(per_key) == _window_model(events)


def test_the_two_pipelines_example_equals_its_plain_python_figures(load_example):
    example = load_example("two_pipelines")
    got = example.got(example.run())
    assert got == example.expected()
    assert len(got["usage"]) == 5 and got["bad"] == ["cents=30"] and len(got["tariffs"]) == 3
