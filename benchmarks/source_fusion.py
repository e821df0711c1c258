"""Source fusion A/B: E4 with the source packing its own records vs a separate packing step.

The keyed step's input crosses from Python into the JVM once per record either way;
without fusion the records then go back into Python (``mapInArrow``) to be packed per
state bucket and return to the JVM packed. With fusion (``fuse_sources=True``, the
default) Ember's Python source packs them itself (docs/design/keyed-state.md).

Runs ``ember bench statemachine`` and ``statemachine-vectorized`` with fusion on and off,
alternating in one process, every run verified against the generator's injected
alerts; prints events/s (median of rounds) per variant and the on/off ratio.

    .venv/bin/python benchmarks/source_fusion.py [--duration 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="statemachine-vectorized,statemachine")
    args = parser.parse_args(argv)

    from ember.bench.harness import BenchConfig, bench_session, run_once
    from ember.bench.suite import WORKLOADS

    spark = bench_session("local[*]")
    results: dict[tuple[str, bool], list[float]] = {}
    verified = True
    names = args.workloads.split(",")
    for name in names:  # discarded warm-up of each side
        for fused in (True, False):
            run_once(WORKLOADS[name][0], spark, BenchConfig(duration_s=8, verbose=False, options={"fuse_sources": fused}), "ember-fusion")
    for i in range(args.rounds):
        for name in names:
            for fused in ((True, False) if i % 2 == 0 else (False, True)):
                cfg = BenchConfig(duration_s=args.duration, verbose=False, options={"fuse_sources": fused})
                out = run_once(WORKLOADS[name][0], spark, cfg, "ember-fusion")
                verified = verified and bool(out.verified)
                results.setdefault((name, fused), []).append(out.events_per_second)
                print(f"round {i + 1}: {name} fused={fused}: {out.events_per_second:,.0f} events/s, verified={out.verified}", flush=True)
    report = {"verified": verified, "duration_s": args.duration, "rounds": args.rounds}
    for name in names:
        on, off = statistics.median(results[(name, True)]), statistics.median(results[(name, False)])
        report[name] = {"fused": round(on), "unfused": round(off), "ratio": round(on / off, 2),
                        "fused_rounds": [round(x) for x in results[(name, True)]],
                        "unfused_rounds": [round(x) for x in results[(name, False)]]}
    print(json.dumps(report))
    return 0 if verified else 1


if __name__ == "__main__":
    raise SystemExit(main())
