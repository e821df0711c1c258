"""``ember bench cep`` end to end on Spark with and without matching in the batch's own call.

The CEP step matches the events its in-batch watermark advance makes due in the batch's own
call (cep/operator.py ``_drain``, 2026-11-27). This runs ``ember bench cep``'s job three ways,
alternating in one Spark session: ``cep`` (as built), ``cep-next-batch`` (the same step with
that drain off: every event waits for a per-key timer, as before) and ``by-hand`` (the
benchmark's hand-written baseline); each run verified against the benchmark's numpy oracle.
Prints events/s per variant (median of ``--rounds``) and, with ``--json``, one JSON line.

    python benchmarks/cep_in_batch.py --duration 20 --rounds 2 --batch 200000
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from typing import Any

from ember.bench import workloads as w
from ember.bench.harness import BenchConfig, bench_session
from ember.cep import CEP, Pattern, SkipStrategy
from ember.cep.operator import CepFunction, SelectFunction


class NextBatch(CepFunction):
    """The CEP step without its in-batch drain: each event waits for its key's timer."""

    whole_batch = False

    def process_batch(self, rt: Any, build: Any, keys: list[Any], columns: list[list[Any]], times: list[int] | None,
                      out: list[Any]) -> bool:
        rt.in_batch_watermark = None
        return super().process_batch(rt, build, keys, columns, times, out)


def _pattern() -> Pattern:
    return (Pattern.begin("open", skip=SkipStrategy.skip_past_last_event()).where(lambda e: e["type"] in w.OPENS)
            .followed_by("close").where(lambda e: e["type"] == w.CLOSE).within(w.CEP_WINDOW_MS))


def _select(m: dict) -> dict:
    return {"address": m["open"][0]["address"], "opened": m["open"][0]["ts"], "closed": m["close"][0]["ts"]}


def _step(variant: str) -> Any:
    if variant == "by-hand":
        return lambda k: k.process(w.FlowByHand(w.CEP_WINDOW_MS), w.FLOW_SCHEMA, name="flows-by-hand")
    if variant == "cep":
        return lambda k: CEP.pattern(k, _pattern()).select(_select, w.FLOW_SCHEMA, name="flows")
    return lambda k: k.process(NextBatch(_pattern(), SelectFunction(_select), "flows"), w.FLOW_SCHEMA, name="flows")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=200_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    variants = ["cep", "cep-next-batch", "by-hand"]
    rates: dict[str, list[float]] = {v: [] for v in variants}
    verified = True
    spark = None
    for r in range(args.rounds):
        for v in variants:
            cfg = BenchConfig(duration_s=args.duration, rounds=1, warmup_s=0, verbose=False, master="local[2]",
                              max_events_per_batch=args.batch, options={}, rate=None)
            spark = spark or bench_session(cfg.master)
            out = w._run_flows(spark, cfg, tempfile.mkdtemp(prefix="ember-cep-ab-"), f"cep-ab-{v}", _step(v))
            rates[v].append(out.events_per_second)
            verified = verified and bool(out.verified)
            print(f"round {r + 1} {v:>14}: {out.events_per_second / 1e3:8.1f} k events/s, verified={out.verified} {out.detail}",
                  flush=True)
    medians = {v: statistics.median(x) for v, x in rates.items()}
    print(f"medians: {', '.join(f'{v} {m / 1e3:.1f} k' for v, m in medians.items())}; cep / cep-next-batch "
          f"{medians['cep'] / medians['cep-next-batch']:.2f}x, cep / by-hand {medians['cep'] / medians['by-hand']:.2f}x")
    if args.json:
        print(json.dumps({"events_per_second": medians, "rounds": rates, "verified": verified, "batch": args.batch,
                          "duration": args.duration}))
    return 0 if verified else 1


if __name__ == "__main__":
    raise SystemExit(main())
