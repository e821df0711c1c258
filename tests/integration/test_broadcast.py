"""Broadcast state (issue 17): a KeyedBroadcastProcessFunction whose rules change while
events arrive — rule updates racing events in one batch, keyed state and timers beside the
broadcast state, apply_to_keyed_state — checked against the model (tests/flink_model.py:
``broadcast_rules``); batch-split invariance; processing time."""

from __future__ import annotations

import random
from datetime import timedelta

import flink_model as model
import pytest

from ember import BroadcastProcessFunction, CollectSink, KeyedBroadcastProcessFunction, ScriptedSource, WatermarkStrategy
from ember.state.descriptors import MapStateDescriptor, ValueStateDescriptor

pytestmark = pytest.mark.spark

EVENTS, RULES = "ts bigint, k string, v int", "ts bigint, name string, limit int"
OUT = "what string, name string, ts bigint, n int"
BOUND, EXPIRY = 1_000, 3_000
LIMITS = MapStateDescriptor("limits")
ALERTS = ValueStateDescriptor("alerts", default=0)


class RuleCheck(KeyedBroadcastProcessFunction):
    """What model.broadcast_rules computes (``timers``: with event time)."""

    timers = True

    def open(self, ctx):
        self.alerts = ctx.get_state(ALERTS)

    def process_broadcast_element(self, rule, ctx):
        limits = ctx.get_broadcast_state(LIMITS)
        if rule["name"] == "reset":
            ctx.apply_to_keyed_state(ALERTS, lambda key, state: state.clear())
        elif rule["limit"] < 0:
            limits.remove(rule["name"])
        else:
            limits.put(rule["name"], rule["limit"])
        yield ("rule", rule["name"], rule["ts"], len(limits.keys()))

    def process_element(self, event, ctx):
        for name, limit in sorted(ctx.get_broadcast_state(LIMITS).items()):
            if event["v"] > limit:
                n = self.alerts.value() + 1
                self.alerts.update(n)
                if n == 1 and self.timers:
                    ctx.register_event_time_timer(event["ts"] + EXPIRY)
                yield ("alert", f"{ctx.current_key}:{name}", event["ts"], n)

    def on_timer(self, timestamp, ctx):
        yield ("summary", ctx.current_key, timestamp, self.alerts.value())
        self.alerts.clear()


def _streams(seed: int, batches: int = 8) -> tuple[list[list[tuple]], list[list[tuple]]]:
    """Out-of-order events and rules; some rules share a timestamp with an event of the same
    batch (the race: the rule goes first). Timestamps are distinct per key and among rules."""
    rng = random.Random(seed)
    used: set = set()

    def stamp(front: int, owner: str) -> int:
        ts = max(0, front - rng.randint(0, BOUND))
        while (owner, ts) in used:
            ts += 1
        used.add((owner, ts))
        return ts

    events, rules, front = [], [], 1_500
    for _ in range(batches):
        front += rng.randint(200, 1_500)
        batch = [(stamp(front, k), k, rng.randint(0, 20)) for k in rng.choices("abcdefgh", k=rng.randint(0, 12))]
        changes = []
        for _ in range(rng.randint(0, 3)):
            name = rng.choice(["r1", "r2", "r3", "r1", "r2", "reset"])
            limit = rng.choice([-1, rng.randint(3, 18), rng.randint(3, 18)])
            if batch and rng.random() < 0.5:  # the same timestamp as an event of this batch
                ts = rng.choice(batch)[0]
                if ("rules", ts) in used:
                    continue
                used.add(("rules", ts))
            else:
                ts = stamp(front, "rules")
            changes.append((ts, name, limit))
        events.append(batch)
        rules.append(changes)
    rules[0].append((1_400, "r1", 10))
    return events, rules


class RuleCheckWithoutTimers(RuleCheck):
    timers = False


def _run(env, events, rules, strategy, name="rule-check"):
    a = env.from_source(ScriptedSource(events, EVENTS), strategy, name="events")
    b = env.from_source(ScriptedSource(rules, RULES), strategy, name="rules")
    sink = CollectSink()
    a.key_by("k").connect(b.broadcast(LIMITS)).process(RuleCheck() if strategy else RuleCheckWithoutTimers(), OUT, name="check").sink_to(sink)
    result = env.execute(name, progress=False)
    assert (result.counters.get("state_changed_keys", 0) > 0) == (env.config.state_layout == "delta")  # the layout asked
    return sink


def _label(batch_id: int, batches: int) -> int | str:
    return batch_id if batch_id < batches else model.END


@pytest.mark.parametrize("seed,layout", [(5, "blob"), pytest.param(5, "delta", marks=pytest.mark.slow),
                                         pytest.param(6, "blob", marks=pytest.mark.slow)])
def test_rules_racing_events_equal_the_model(spark, tmp_path, seed, layout):
    """Also on the delta state layout (issue 18: apply_to_keyed_state reaches keys stored in earlier batches)."""
    from ember import StreamEnvironment

    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark, state_layout=layout)
    events, rules = _streams(seed)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND), "ts")
    sink = _run(env, events, rules, strategy)
    got = sorted(((_label(bt.batch_id, len(events)), r["what"], r["name"], r["ts"], r["n"])
                  for bt in sink.batches for r in bt.rows), key=repr)
    expected = sorted(model.broadcast_rules(events, rules, BOUND, EXPIRY), key=repr)
    kinds = {e[1] for e in expected}
    assert kinds == {"rule", "alert", "summary"}, kinds
    ties = {ts for batch in rules for ts, _, _ in batch} & {ts for batch in events for ts, _, _ in batch}
    assert ties, "the streams should race a rule and an event at one timestamp"
    assert got == expected
    assert all(type(r["ts"]) is int for r in sink.rows())


class RuleAlerts(BroadcastProcessFunction):
    """RuleCheck on a non-keyed stream: the same rules, alerts without per-key counts."""

    def process_broadcast_element(self, rule, ctx):
        limits = ctx.get_broadcast_state(LIMITS)
        if rule["limit"] < 0:
            limits.remove(rule["name"])
        elif rule["name"] != "reset":
            limits.put(rule["name"], rule["limit"])
        yield ("rule", rule["name"], rule["ts"], len(limits.keys()))

    def process_element(self, event, ctx):
        assert ctx.timestamp == event["ts"]
        for name, limit in sorted(ctx.get_broadcast_state(LIMITS).items()):
            if event["v"] > limit:
                yield ("alert", f"{event['k']}:{name}", event["ts"], 0)


def test_a_non_keyed_stream_checked_against_broadcast_rules_equals_the_model(env):
    """BroadcastProcessFunction: every event against the rules of its moment (a rule before an
    event of the same timestamp), each rule's output once."""
    events, rules = _streams(7)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND), "ts")
    a = env.from_source(ScriptedSource(events, EVENTS), strategy, name="events")
    b = env.from_source(ScriptedSource(rules, RULES), strategy, name="rules")
    sink = CollectSink()
    a.connect(b.broadcast(LIMITS)).process(RuleAlerts(), OUT, name="check").sink_to(sink)
    env.execute("rule-alerts", progress=False)
    got = sorted(((_label(bt.batch_id, len(events)), r["what"], r["name"], r["ts"], r["n"])
                  for bt in sink.batches for r in bt.rows), key=repr)
    expected = sorted(((k, what, name, ts, n if what == "rule" else 0)
                       for k, what, name, ts, n in model.broadcast_rules(events, rules, BOUND, EXPIRY) if what != "summary"),
                      key=repr)
    assert sum(1 for e in expected if e[1] == "alert") > 10 and any(e[1] == "rule" for e in expected)
    ties = {ts for batch in rules for ts, _, _ in batch} & {ts for batch in events for ts, _, _ in batch}
    assert ties, "the streams should race a rule and an event at one timestamp"
    assert got == expected


def _ordered(n_events: int) -> tuple[list[tuple], list[tuple]]:
    """In-order streams (every timestamp distinct), so batching cannot change what they mean."""
    rng = random.Random(11)
    stamps = rng.sample(range(1_000, 60_000), n_events + 12)
    rule_ts, event_ts = sorted(stamps[:12]), sorted(stamps[12:])
    rules = [(ts, rng.choice(["r1", "r2"]), rng.choice([-1, 5, 9, 14])) for ts in rule_ts]
    events = [(ts, rng.choice("abc"), rng.randint(0, 20)) for ts in event_ts]
    return events, rules


def _split(records: list[tuple], parts: int, span: int) -> list[list[tuple]]:
    """``records`` in ``parts`` batches by timestamp (batch i holds [i, i+1) * span / parts)."""
    return [[r for r in records if i * span // parts <= r[0] < (i + 1) * span // parts] for i in range(parts)]


@pytest.mark.parametrize("parts", [pytest.param(1, marks=pytest.mark.slow), 5, pytest.param(17, marks=pytest.mark.slow)])
def test_batch_split_invariance(env, parts):
    """The same in-order streams cut into 1, 5 or 17 micro-batches give the same alerts and rule updates."""
    events, rules = _ordered(60)
    strategy = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(milliseconds=BOUND), "ts")
    sink = _run(env, _split(events, parts, 60_000), _split(rules, parts, 60_000), strategy, f"split-{parts}")
    # which alerts and rule updates there are does not depend on batching; alert counts do
    # (a count resets when its key's timer fires, and the watermark moves per batch)
    got = sorted((r["what"], r["name"], r["ts"]) for r in sink.rows() if r["what"] != "summary")
    expected = sorted(e[1:4] for e in model.broadcast_rules([events], [rules], BOUND, EXPIRY) if e[1] != "summary")
    assert sum(1 for e in expected if e[0] == "alert") > 5
    assert got == expected


def test_processing_time_rules_go_before_the_batch_events(env):
    """Without event time, a batch's rules apply before its events; output of a rule is emitted once."""
    events = [[], [(1, "a", 7), (2, "b", 12)], [(3, "c", 7)]]
    rules = [[(0, "r1", 10)], [(0, "r1", 5)], [(0, "r1", -1)]]
    sink = _run(env, events, rules, None, "rule-check-pt")
    rows = sorted((r["what"], r["name"], r["n"]) for r in sink.rows() if r["what"] != "summary")
    assert rows == [("alert", "a:r1", 1), ("alert", "b:r1", 1), ("rule", "r1", 0), ("rule", "r1", 1), ("rule", "r1", 1)]


def test_fraud_rules_example(spark, load_example):
    """The example's alerts, worked out by hand in its rules' comments; the payment delivered
    twice counts once (the dedupe before the broadcast step), and the audit sink beside the
    broadcast step gets every payment once."""
    example = load_example("fraud_rules")
    alerts, audit = example.run()
    once = sorted({r for b in example.PAYMENTS for r in b})
    assert len(once) < sum(map(len, example.PAYMENTS))
    assert sorted((r["ts"], r["account"], r["amount"], r["country"]) for r in audit.rows()) == once
    got = sorted((b.batch_id, r["account"], r["ts"], r["rule"], r["detail"]) for b in alerts.batches for r in b.rows)
    assert got == [(0, "acc-2", 1_500, "big", "amount 2500 > 2000"), (1, "acc-1", 3_300, "burst3", "4 payments within 10 s"),
                   (2, "acc-1", 6_000, "burst3", "5 payments within 10 s"),
                   (2, "acc-3", 6_000, "big", "amount 1200 > 1000")]  # big tightened at 6 s, before the 6 s payment; withdrawn before 20 s


def test_broadcast_state_survives_a_restart_from_the_checkpoint(spark, tmp_path):
    """The rules a first run read are still there for the events a restarted run reads
    (broadcast state is checkpointed with the buckets' keyed state), and a savepoint's
    ``read_broadcast_state`` reads them back."""
    from ember import StreamEnvironment

    def env():
        return StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark)

    events = [[], [(1, "a", 7)], [(3, "c", 7)]]
    rules = [[(0, "r1", 5)], [], []]
    first = _run(env(), events[:2], rules[:2], None, "restart")
    assert sorted((r["what"], r["name"]) for r in first.rows()) == [("alert", "a:r1"), ("rule", "r1")]
    second = _run(env(), events, rules, None, "restart")  # reads batch 2 only: no rule in it
    assert [(r["what"], r["name"], r["n"]) for r in second.rows()] == [("alert", "c:r1", 1)]
    # a savepoint carries it: read back as the copy every task holds
    import os

    from ember.errors import SavepointError
    from ember.savepoints import create_savepoint

    point = create_savepoint(os.path.join(str(tmp_path), "restart"), root=str(tmp_path / "sp"))
    assert point.read_broadcast_state("check", spark) == {"limits": {"r1": 5}}
    assert sorted(point.read_state("check", spark)["state"]) == ["alerts", "alerts"]  # the keyed state beside it: a's, c's
    with pytest.raises(SavepointError, match="no operator 'nope'|'nope'"):
        point.read_broadcast_state("nope", spark)


def test_a_savepoint_reads_the_broadcast_state_of_a_step_on_the_delta_layout(spark, tmp_path):
    """read_broadcast_state on design B (keyed/delta.py): the copy kept in the bucket's blob value."""
    import os

    from ember import StreamEnvironment
    from ember.savepoints import create_savepoint

    env = StreamEnvironment(master="local[2]", checkpoint_dir=tmp_path, parallelism=2, spark=spark, state_layout="delta")
    events = [[], [(1, "a", 7)]]
    rules = [[(0, "r1", 5), (0, "r2", 9)], [(2, "r2", -1)]]  # r2 set, then removed
    sink = _run(env, events, rules, None, "delta-rules")
    assert sorted((r["what"], r["name"]) for r in sink.rows()) == [("alert", "a:r1"), ("rule", "r1"), ("rule", "r2"), ("rule", "r2")]
    point = create_savepoint(os.path.join(str(tmp_path), "delta-rules"), root=str(tmp_path / "sp"))
    assert point.operators[0].get("state layout") == "delta"
    assert point.read_broadcast_state("check", spark) == {"limits": {"r1": 5}}
