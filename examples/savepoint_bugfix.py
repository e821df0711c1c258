"""Fixing a bug in a running job with a savepoint (docs/savepoints.md walks through it).

Version 1 of a balances job keeps, per account, the balance and the total withdrawn —
but adds withdrawals to the balance instead of subtracting them. While it runs we:

1. stop it with a savepoint (a clean cut: nothing processed twice or lost),
2. inspect the savepoint and read the operator's state as a pandas DataFrame,
3. repair the state (balance - 2 x withdrawn) into a new savepoint,
4. start version 2 (the fixed code) from the repaired savepoint, on 4 state
   partitions instead of 2,

and check the final balances against ones computed directly from the events.

    python examples/savepoint_bugfix.py
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from ember import CollectSink, KeyedProcessFunction, ScriptedSource, StreamEnvironment
from ember.savepoints import create_savepoint
from ember.state import ValueStateDescriptor

ACCOUNTS = [f"acct-{i}" for i in range(6)]
# 20 micro-batches of payments: (event id, account, kind, amount).
BATCHES = [
    [(b * 8 + i, ACCOUNTS[(b * 3 + i) % 6], "withdrawal" if (b + i) % 3 == 0 else "deposit", 10 + (b * 7 + i * 13) % 90)
     for i in range(8)]
    for b in range(20)
]
SCHEMA = "id bigint, account string, kind string, amount bigint"
OUT = "account string, balance bigint, id bigint"


class BalancesV1(KeyedProcessFunction):
    """Version 1: the bug — a withdrawal is added to the balance."""

    def open(self, ctx):
        self.balance = ctx.get_state(ValueStateDescriptor("balance", default=0))
        self.withdrawn = ctx.get_state(ValueStateDescriptor("withdrawn", default=0))

    def process_element(self, p, ctx):
        if p["kind"] == "withdrawal":
            self.withdrawn.update(self.withdrawn.value() + p["amount"])
        self.balance.update(self.balance.value() + p["amount"])  # BUG: withdrawals should subtract
        yield {"account": p["account"], "balance": self.balance.value(), "id": p["id"]}


class BalancesV2(BalancesV1):
    """Version 2: fixed."""

    def process_element(self, p, ctx):
        sign = -1 if p["kind"] == "withdrawal" else 1
        if p["kind"] == "withdrawal":
            self.withdrawn.update(self.withdrawn.value() + p["amount"])
        self.balance.update(self.balance.value() + sign * p["amount"])
        yield {"account": p["account"], "balance": self.balance.value(), "id": p["id"]}


def build(env: StreamEnvironment, fn: KeyedProcessFunction) -> CollectSink:
    payments = env.from_source(ScriptedSource(BATCHES, SCHEMA), None, name="payments")
    sink = CollectSink()
    payments.key_by("account").process(fn, OUT, name="balances").sink_to(sink, name="balances-out")
    return sink


def run(spark: Any = None, work: str | None = None) -> dict[str, Any]:
    work = work or tempfile.mkdtemp(prefix="ember-savepoint-bugfix-")
    checkpoints, savepoints = os.path.join(work, "checkpoints"), os.path.join(work, "savepoints")
    def say(m):
        return (print(f"[example] {m}", flush=True))
    try:
        # 1. Version 1 runs (a micro-batch every 200 ms) ...
        env = StreamEnvironment(master="local[2]", checkpoint_dir=checkpoints, parallelism=2, trigger_interval=200, spark=spark)
        v1_out = build(env, BalancesV1())
        v1 = threading.Thread(target=env.execute, args=("balances",), kwargs={"progress": False})
        v1.start()
        commits = os.path.join(checkpoints, "balances", "commits")
        while not os.path.isdir(commits) or len([f for f in os.listdir(commits) if f.isdigit()]) < 6:
            time.sleep(0.05)
        # ... until someone notices the bug: stop it with a savepoint.
        point = create_savepoint(os.path.join(checkpoints, "balances"), root=savepoints, stop=True, progress=say)
        v1.join()
        say(f"version 1 stopped after {len(v1_out.rows())} payments")

        # 2. Inspect it and read the operator's state.
        spark = env.spark
        print(point.describe(spark))
        state = point.read_state("balances", spark)
        print(state.to_string(index=False))

        # 3. Repair the state into a new savepoint: each balance counted its withdrawals
        #    as deposits, so subtract them twice.
        wide = state.pivot(index="account", columns="state", values="value").reset_index()
        wide["balance"] = wide["balance"] - 2 * wide["withdrawn"]
        repaired = wide.melt(id_vars="account", value_vars=["balance", "withdrawn"], var_name="state", value_name="value")
        fixed = point.write_state("balances", repaired, os.path.join(savepoints, "balances-repaired"), spark)
        say(f"repaired savepoint: {fixed.path}")

        # 4. Version 2 starts from the repaired savepoint, rescaled to 4 state partitions.
        env2 = StreamEnvironment(master="local[2]", checkpoint_dir=checkpoints, parallelism=4, spark=spark)
        v2_out = build(env2, BalancesV2())
        result = env2.execute("balances-v2", progress=False, from_savepoint=fixed.path)
        say(result.summary())

        expected: dict[str, int] = {}
        for batch in BATCHES:
            for _, account, kind, amount in batch:
                expected[account] = expected.get(account, 0) + (-amount if kind == "withdrawal" else amount)
        final: dict[str, tuple[int, int]] = {}
        for r in v2_out.rows():
            if r["id"] > final.get(r["account"], (-1, 0))[0]:
                final[r["account"]] = (r["id"], r["balance"])
        ids = sorted(r["id"] for r in v1_out.rows() + v2_out.rows())
        return {
            "before": len(v1_out.rows()),
            "after": len(v2_out.rows()),
            "payments": sum(len(b) for b in BATCHES),
            "ids_exact": ids == list(range(sum(len(b) for b in BATCHES))),
            "final": {a: b for a, (_, b) in final.items()},
            "expected": expected,
            "partitions": (point.partitions, fixed.partitions),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    out = run()
    ok = out["ids_exact"] and out["final"] == out["expected"]
    print(
        f"\n{out['payments']} payments: {out['before']} by version 1, {out['after']} by version 2 "
        f"(each exactly once: {out['ids_exact']}); state partitions {out['partitions'][0]} -> 4"
    )
    for account in sorted(out["expected"]):
        print(f"  {account}: balance {out['final'].get(account)} (computed from the events: {out['expected'][account]})")
    print("all balances correct" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
