"""Max sustainable throughput: the highest open-loop input rate at which lag stays bounded.

Draining a backlog as fast as possible (``ember bench`` at unbounded rate) measures
capacity, not what a job keeps up with: under an open-loop rate the source admits
what is due, and the job sustains the rate when its backlog (events due but not yet
admitted, reported as ``lag`` in every progress report) stays bounded. A rate is
*sustained* when, past the first third of the run (start-up), the backlog after
every batch is at most ``bound_s`` seconds of input. The search brackets the rate
between the last sustained and the first unsustained probe and halves the bracket
``steps`` times, starting from the drain rate measured in the same process.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from ember.bench.harness import BenchConfig, RunOutcome, run_once

__all__ = ["sustained", "find_max_rate"]


def sustained(outcome: RunOutcome, rate: float, bound_s: float) -> tuple[bool, int]:
    """Whether the run kept its backlog within ``bound_s`` seconds of input past its
    first third, and the largest backlog there (events)."""
    lags = [r.get("lag") for r in outcome.progress if int(r.get("numInputRows") or 0) > 0]
    steady = [int(lag) for lag in lags[len(lags) // 3:] if lag is not None]
    if len(steady) < 3 or len(steady) < len(lags[len(lags) // 3:]):
        return False, -1
    worst = max(steady)
    return worst <= rate * bound_s, int(worst)


def find_max_rate(
    name: str,
    run: Callable[[Any, BenchConfig, str], RunOutcome],
    spark: Any,
    cfg: BenchConfig,
    steps: int = 5,
    bound_s: float = 2.0,
) -> dict[str, Any]:
    """The drain rate and the max sustainable rate of workload ``name``."""
    def attempt(rate: float | None) -> RunOutcome:
        # "drain" tells a workload that runs open loop by default (yahoo-redis) to run unbounded.
        options = {**cfg.options, "drain": rate is None}
        return run_once(run, spark, BenchConfig(**{**cfg.__dict__, "rate": rate, "verbose": False, "options": options}),
                        f"ember-maxrate-{name}")

    def log(msg: str) -> None:
        if cfg.verbose:
            print(f"[ember max-rate] {msg}", file=sys.stderr, flush=True)

    log(f"{name}: draining at unbounded rate for {cfg.duration_s:g} s")
    drain = attempt(None)
    log(f"  drain: {drain.events_per_second:,.0f} events/s, verified={drain.verified}")
    drained = round(drain.events_per_second)
    lo, hi = 0.0, 1.2 * drained
    rate = 0.6 * drained
    trials = []
    for i in range(steps):
        out = attempt(rate)
        ok, worst = sustained(out, rate, bound_s)
        trials.append({"rate": round(rate), "sustained": ok, "max_backlog_events": worst,
                       "events_per_second": round(out.events_per_second), "verified": out.verified})
        log(f"  {i + 1}/{steps}: {rate:,.0f} events/s -> {'sustained' if ok else 'NOT sustained'} "
            f"(largest backlog {worst:,} events), verified={out.verified}")
        lo, hi = (rate, hi) if ok else (lo, rate)
        rate = (lo + hi) / 2
    return {
        "workload": name,
        "drain_events_per_second": drained,
        "max_sustainable_events_per_second": round(lo),
        "backlog_bound_s": bound_s,
        "trials": trials,
        "verified": bool(drain.verified) and all(t["verified"] for t in trials),
    }
