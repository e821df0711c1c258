"""Fraud rules that change while the job runs (Flink's broadcast state pattern).

Payments ``(ts, account, amount, country)`` are checked against rules that arrive on a
second stream ``(ts, rule, kind, threshold)``: a ``max_amount`` rule flags a payment above
its threshold, a ``burst`` rule flags an account's payment once it has made more than
``threshold`` payments in 10 s of event time (keyed state and an event-time timer), and a
rule with a negative threshold is withdrawn. The rules stream is broadcast: every task keeps
the same copy of the rules in broadcast state, written by ``process_broadcast_element``,
read by ``process_element``. A rule applies to the payments stamped at or after its own
timestamp (in the micro-batch it arrives in, records go in timestamp order, a rule first).

Payments arrive at least once (an upstream retries): a keyed ``process`` step before the check
forwards each payment's first delivery only, for a minute of event time. The broadcast step
reads that stateful step's output as any chained step does (docs/design/dataflow.md), and an
audit sink reads it too: the broadcast step then runs as a lane of the fan-out after the
dedupe, the rules joining it there.

    python examples/fraud_rules.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from datetime import timedelta

from ember import (
    CollectSink,
    KeyedBroadcastProcessFunction,
    KeyedProcessFunction,
    ScriptedSource,
    StreamEnvironment,
    WatermarkStrategy,
)
from ember.state.descriptors import MapStateDescriptor, ValueStateDescriptor

# (event time ms, account, amount, country), in micro-batches.
PAYMENTS = [
    [(1_000, "acc-1", 90, "DE"), (1_500, "acc-2", 2_500, "FR")],
    [(3_000, "acc-1", 40, "DE"), (3_200, "acc-1", 35, "DE"), (3_300, "acc-1", 20, "DE"), (4_000, "acc-2", 700, "FR")],
    [(6_000, "acc-3", 1_200, "NL"), (6_000, "acc-1", 10, "DE"), (3_200, "acc-1", 35, "DE")],  # 3 200: delivered again
    [(20_000, "acc-2", 3_000, "FR")],
]
# (event time ms, rule, kind, threshold): -1 withdraws a rule.
RULES = [
    [(0, "big", "max_amount", 2_000)],
    [(2_000, "burst3", "burst", 3)],  # from 2 s on: more than 3 payments in 10 s is suspicious
    [(6_000, "big", "max_amount", 1_000)],  # tightened at 6 s: the 6 s payment of 1 200 is flagged
    [(15_000, "big", "max_amount", -1)],  # withdrawn at 15 s: the 3 000 at 20 s passes
]
PAYMENT_SCHEMA = "ts bigint, account string, amount int, country string"
RULE_SCHEMA = "ts bigint, rule string, kind string, threshold int"
ALERT_SCHEMA = "account string, ts bigint, rule string, detail string"

RULE_BOOK = MapStateDescriptor("rules")  # rule name -> (kind, threshold): broadcast state
RECENT = ValueStateDescriptor("recent", default=0)  # per account: payments in the current 10 s burst window
BURST_WINDOW_MS = 10_000
SEEN = ValueStateDescriptor("seen")  # per (account, ts): a delivery of this payment went through
REDELIVERY_MS = 60_000  # how long a payment's deliveries are remembered (event time)


class FirstDelivery(KeyedProcessFunction):
    """Forwards the first delivery of each payment (keyed by account and timestamp)."""

    def open(self, ctx):
        self.seen = ctx.get_state(SEEN)

    def process_element(self, payment, ctx):
        if self.seen.value() is None:
            self.seen.update(True)
            ctx.register_event_time_timer(payment["ts"] + REDELIVERY_MS)
            yield payment

    def on_timer(self, timestamp, ctx):
        self.seen.clear()


class FraudCheck(KeyedBroadcastProcessFunction):
    def open(self, ctx):
        self.recent = ctx.get_state(RECENT)

    def process_broadcast_element(self, rule, ctx):
        rules = ctx.get_broadcast_state(RULE_BOOK)
        if rule["threshold"] < 0:
            rules.remove(rule["rule"])
        else:
            rules.put(rule["rule"], (rule["kind"], rule["threshold"]))

    def process_element(self, payment, ctx):
        count = self.recent.value() + 1
        self.recent.update(count)
        if count == 1:  # the account's burst window starts: count until it ends
            ctx.register_event_time_timer(payment["ts"] + BURST_WINDOW_MS)
        for name, (kind, threshold) in sorted(ctx.get_broadcast_state(RULE_BOOK).items()):
            if kind == "max_amount" and payment["amount"] > threshold:
                yield (ctx.current_key, payment["ts"], name, f"amount {payment['amount']} > {threshold}")
            elif kind == "burst" and count > threshold:
                yield (ctx.current_key, payment["ts"], name, f"{count} payments within {BURST_WINDOW_MS // 1000} s")

    def on_timer(self, timestamp, ctx):
        self.recent.clear()


def run() -> tuple[CollectSink, CollectSink]:
    """The job's alerts and its audit trail (each payment once)."""
    root = tempfile.mkdtemp(prefix="ember-fraud-")
    try:
        env = StreamEnvironment(master="local[2]", checkpoint_dir=root, parallelism=2)
        bound = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1), "ts")
        payments = env.from_source(ScriptedSource(PAYMENTS, PAYMENT_SCHEMA), bound, name="payments")
        rules = env.from_source(ScriptedSource(RULES, RULE_SCHEMA), bound, name="rules")
        alerts, audit = CollectSink(), CollectSink()
        once = payments.key_by("account", "ts").process(FirstDelivery(), PAYMENT_SCHEMA, name="first-delivery")
        (once.key_by("account").connect(rules.broadcast(RULE_BOOK))
         .process(FraudCheck(), ALERT_SCHEMA, name="fraud-check")
         .sink_to(alerts))
        once.sink_to(audit, name="audit")
        env.execute("fraud-rules", progress=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return alerts, audit


def main() -> int:
    alerts, audit = run()
    delivered = sum(len(b) for b in PAYMENTS)
    print(f"audit: {len(audit.rows())} payments of {delivered} deliveries (each payment once)")
    print("alerts (payments checked against rules that change at run time, broadcast state):")
    for b in alerts.batches:
        for r in sorted(b.rows, key=lambda r: (r["ts"], r["account"])):
            print(f"  batch {b.batch_id}: {r['account']} at {r['ts']:>6} ms: rule {r['rule']!r}: {r['detail']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
