"""Two versions of Ember side by side: does a change (a restructuring, say) move throughput?

Runs ``ember bench <workload> --json`` with each version's source tree first on
``PYTHONPATH``, alternating A-B, B-A, ... per workload, each run in a fresh process
with its own plain-PySpark (or TWS) baseline rounds, and reports per workload the
median events/s of each version, the ratio B/A, and each version's median ratio to
its same-run baseline (the figure BENCHMARKS.md quotes, which absorbs the machine's
drift between runs). Both versions use this interpreter and its installed packages.

    git worktree add /tmp/ember-old <commit>
    python benchmarks/versions_ab.py --a /tmp/ember-old/src --b src --json

Prints one JSON report with ``--json`` (fields: workload, a/b events_per_second
medians, ratio_b_to_a, a/b ratio_to_baseline medians, runs), else a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

WORKLOADS = ("grouping", "statemachine", "window", "countwindow")


def run_once(src: str, workload: str, duration: float, rounds: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src), "PYSPARK_PYTHON": sys.executable}
    cmd = [sys.executable, "-m", "ember.cli", "bench", workload, "--duration", str(duration),
           "--rounds", str(rounds), "--json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} (PYTHONPATH={src}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout[done.stdout.index("{"):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="version A's source tree (the one holding ember/)")
    parser.add_argument("--b", required=True, help="version B's source tree")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--pairs", type=int, default=2, help="A/B pairs per workload (default 2)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per round (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="Ember/baseline rounds per run (default 2)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = []
    for workload in args.workloads.split(","):
        runs: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
        for i in range(args.pairs):
            for side in (("a", "b") if i % 2 == 0 else ("b", "a")):
                started = time.monotonic()
                report = run_once(getattr(args, side), workload, args.duration, args.rounds)
                runs[side].append(report)
                print(f"[ab] {workload} {side}: {report['events_per_second']:,} events/s, "
                      f"ratio to baseline {report.get('ratio_to_baseline')}, verified={report.get('verified')} "
                      f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
        eps = {s: statistics.median(r["events_per_second"] for r in rs) for s, rs in runs.items()}
        ratios = {s: [r["ratio_to_baseline"] for r in rs if r.get("ratio_to_baseline")] for s, rs in runs.items()}
        base = {s: round(statistics.median(v), 3) if v else None for s, v in ratios.items()}  # None: no baseline (pipeline)
        out.append({
            "workload": workload,
            "a_events_per_second": round(eps["a"]), "b_events_per_second": round(eps["b"]),
            "ratio_b_to_a": round(eps["b"] / eps["a"], 3),
            "a_ratio_to_baseline": base["a"], "b_ratio_to_baseline": base["b"],
            "verified": all(r.get("verified") for rs in runs.values() for r in rs),
            "runs": {s: [r["round_events_per_second"] for r in rs] for s, rs in runs.items()},
        })
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, "duration_s": args.duration, "rounds": args.rounds,
                          "pairs": args.pairs, "workloads": out}, indent=1))
    else:
        print(f"{'workload':14} {'A events/s':>12} {'B events/s':>12} {'B/A':>6} {'A/base':>7} {'B/base':>7}  verified")
        for w in out:
            print(f"{w['workload']:14} {w['a_events_per_second']:>12,} {w['b_events_per_second']:>12,} {w['ratio_b_to_a']:>6} "
                  f"{str(w['a_ratio_to_baseline']):>7} {str(w['b_ratio_to_baseline']):>7}  {w['verified']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
