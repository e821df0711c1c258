"""What every small job pays, whatever its input: query start, micro-batches, stop.

Runs ``--jobs`` small bounded jobs on one SparkSession (three scripted micro-batches of a
few records), in a fresh process per variant, the variants alternating over ``--rounds``:

- ``window``: a keyed 10 s event-time tumbling count (two Python sources: the script and the
  end-of-input row);
- ``stateless``: a Python filter (one Python source);
- ``operator``: the same window with a Python aggregate, on Ember's window operator (the
  job's one keyed step: it fires in the batch its records close);

each once with Spark's Python processes importing pyspark from its ``pyspark.zip``
(``EMBER_SPARK_ZIP_IMPORTS=1``, as before ember.runner.spark.worker_imports) and once from
site-packages (the ``.pth`` that ``make venv`` writes) — or, with ``--against SRC``, once on
this checkout and once on the ``src`` directory of another (put first on ``PYTHONPATH``, which
Spark's Python workers inherit). Reports per variant the median wall seconds per job (the
first job of each process, which also starts Python workers, left out) and the micro-batches
per job; ``--json`` prints one JSON object.

    python benchmarks/job_overhead.py --jobs 5 --rounds 2 --json
    python benchmarks/job_overhead.py --kinds operator --against /tmp/before/src --jobs 6 --rounds 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ember.runner.spark.worker_imports import KEEP_ZIPS

KINDS = ("window", "stateless", "operator")
BATCHES = [[(1000, "a", 1), (3000, "b", 2)], [(9500, "a", 4), (12000, "b", 5)], [(24000, "a", 11)]]


def _child(kind: str, jobs: int) -> None:
    """Run ``jobs`` jobs of ``kind`` on one session; print one JSON line per job."""
    from datetime import timedelta

    from ember import AggregateFunction, CollectSink, ScriptedSource, StreamEnvironment, TumblingEventTimeWindows, WatermarkStrategy

    class Count(AggregateFunction):
        def create_accumulator(self):
            return 0

        def add(self, value, acc):
            return acc + 1

        def get_result(self, acc):
            return {"n": acc}

        def merge(self, a, b):
            return a + b

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = StreamEnvironment(master="local[2]", parallelism=2).spark
    bound = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2), "ts")
    for _ in range(jobs):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tempfile.mkdtemp(), parallelism=2, spark=spark)
        sink = CollectSink()
        if kind in ("window", "operator"):
            src = env.from_source(ScriptedSource(BATCHES, "ts bigint, k string, v int"), bound, name="events")
            windows = src.key_by("k").window(TumblingEventTimeWindows.of(10_000))
            (windows.count() if kind == "window" else windows.aggregate(Count(), output_schema="n bigint")).sink_to(sink)
            expected = 4
        else:
            src = env.from_source(ScriptedSource(BATCHES, "ts bigint, k string, v int"), name="events")
            src.filter(lambda r: r["v"] > 1).sink_to(sink)
            expected = 4
        start = time.perf_counter()
        result = env.execute("overhead", progress=False)
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "batches": result.batches, "verified": len(sink.rows()) == expected}),
              flush=True)


def _run(kind: str, zips: bool, jobs: int, pythonpath: str | None = None) -> list[dict]:
    env = {**os.environ, KEEP_ZIPS: "1" if zips else "0"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--jobs", str(jobs)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5, help="jobs per process (the first is left out)")
    parser.add_argument("--rounds", type=int, default=2, help="processes per variant, alternating")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kinds", default="window,stateless", help="comma-separated: window, stateless, operator")
    parser.add_argument("--against", metavar="SRC", help="compare this checkout with another's src directory "
                        "(both importing pyspark from site-packages) instead of zip against site-packages imports")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.jobs)
        return
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if any(k not in KINDS for k in kinds):
        parser.error(f"--kinds: choose among {', '.join(KINDS)}")
    if args.against is not None and not os.path.isdir(os.path.join(args.against, "ember")):
        parser.error(f"--against: {args.against} holds no ember package")
    # (label, zips, PYTHONPATH): zip against site-packages imports, or this checkout against another
    variants = ([("this", False, None), ("against", False, args.against)] if args.against
                else [("zip", True, None), ("site-packages", False, None)])
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for kind in kinds:
            for label, zips, path in variants:
                name = f"{kind}/{label}"
                runs.setdefault(name, []).extend(_run(kind, zips, args.jobs, path)[1:])
                print(f"{name}: {len(runs[name])} jobs so far", file=sys.stderr, flush=True)
    report = {
        "jobs_per_process": args.jobs, "rounds": args.rounds, "against": args.against,
        "variants": {name: {"median_job_seconds": round(statistics.median(r["seconds"] for r in rs), 3),
                            "batches_per_job": statistics.median(r["batches"] for r in rs), "jobs": len(rs)}
                     for name, rs in runs.items()},
        "verified": all(r["verified"] for rs in runs.values() for r in rs),
    }
    first, second = (label for label, _, _ in variants)
    for kind in kinds:
        a = report["variants"][f"{kind}/{first}"]["median_job_seconds"]
        b = report["variants"][f"{kind}/{second}"]["median_job_seconds"]
        key = f"{kind}_ratio_against_to_this" if args.against else f"{kind}_ratio_zip_to_site"
        report[key] = round(b / a, 2) if args.against else round(a / b, 2)
    if args.json:
        print(json.dumps(report))
    else:
        for name, v in report["variants"].items():
            print(f"{name:28s} {v['median_job_seconds']:6.2f} s per job, {v['batches_per_job']:.0f} micro-batches")
        print(f"verified: {report['verified']}")


if __name__ == "__main__":
    main()
