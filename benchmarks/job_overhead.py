"""What every small job pays, whatever its input: query start, micro-batches, stop.

Runs ``--jobs`` small bounded jobs on one SparkSession (three scripted micro-batches of a
few records), in a fresh process per variant, the variants alternating over ``--rounds``:

- ``window``: a keyed 10 s event-time tumbling count (two Python sources: the script and the
  end-of-input row);
- ``stateless``: a Python filter (one Python source);

each once with Spark's Python processes importing pyspark from its ``pyspark.zip``
(``EMBER_SPARK_ZIP_IMPORTS=1``, as before ember.runner.spark.worker_imports) and once from
site-packages (the ``.pth`` that ``make venv`` writes). Reports per variant the median wall
seconds per job (the first job of each process, which also starts Python workers, left out)
and the micro-batches per job; ``--json`` prints one JSON object.

    python benchmarks/job_overhead.py --jobs 5 --rounds 2 --json
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

BATCHES = [[(1000, "a", 1), (3000, "b", 2)], [(9500, "a", 4), (12000, "b", 5)], [(24000, "a", 11)]]


def _child(kind: str, jobs: int) -> None:
    """Run ``jobs`` jobs of ``kind`` on one session; print one JSON line per job."""
    from datetime import timedelta

    from ember import CollectSink, ScriptedSource, StreamEnvironment, TumblingEventTimeWindows, WatermarkStrategy

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = StreamEnvironment(master="local[2]", parallelism=2).spark
    bound = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2), "ts")
    for _ in range(jobs):
        env = StreamEnvironment(master="local[2]", checkpoint_dir=tempfile.mkdtemp(), parallelism=2, spark=spark)
        sink = CollectSink()
        if kind == "window":
            src = env.from_source(ScriptedSource(BATCHES, "ts bigint, k string, v int"), bound, name="events")
            src.key_by("k").window(TumblingEventTimeWindows.of(10_000)).count().sink_to(sink)
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


def _run(kind: str, zips: bool, jobs: int) -> list[dict]:
    env = {**os.environ, KEEP_ZIPS: "1" if zips else "0"}
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--jobs", str(jobs)], env=env,
                         capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5, help="jobs per process (the first is left out)")
    parser.add_argument("--rounds", type=int, default=2, help="processes per variant, alternating")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=["window", "stateless"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.jobs)
        return
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for kind in ("window", "stateless"):
            for zips in (True, False):
                name = f"{kind}/{'zip' if zips else 'site-packages'}"
                runs.setdefault(name, []).extend(_run(kind, zips, args.jobs)[1:])
                print(f"{name}: {len(runs[name])} jobs so far", file=sys.stderr, flush=True)
    report = {
        "jobs_per_process": args.jobs, "rounds": args.rounds,
        "variants": {name: {"median_job_seconds": round(statistics.median(r["seconds"] for r in rs), 3),
                            "batches_per_job": statistics.median(r["batches"] for r in rs), "jobs": len(rs)}
                     for name, rs in runs.items()},
        "verified": all(r["verified"] for rs in runs.values() for r in rs),
    }
    for kind in ("window", "stateless"):
        zip_s = report["variants"][f"{kind}/zip"]["median_job_seconds"]
        site_s = report["variants"][f"{kind}/site-packages"]["median_job_seconds"]
        report[f"{kind}_ratio_zip_to_site"] = round(zip_s / site_s, 2)
    if args.json:
        print(json.dumps(report))
    else:
        for name, v in report["variants"].items():
            print(f"{name:28s} {v['median_job_seconds']:6.2f} s per job, {v['batches_per_job']:.0f} micro-batches")
        print(f"verified: {report['verified']}")


if __name__ == "__main__":
    main()
