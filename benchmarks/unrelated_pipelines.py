"""Two unrelated pipelines as one job against the same two as two jobs, one after the other.

- ``count``: a keyed running count (``GroupingSource`` -> key_by(host_id) -> ``sum("n",
  emit="batch")``, 1,000 keys): the pipeline holding state;
- ``grep``: sentences -> full-string regex filter -> ``CountSink`` (WORKLOADS.md E1): a
  stateless pipeline.

Each variant reads ``--events`` events per source (bounded generators) on one local[2]
session: ``count`` alone, ``grep`` alone, and ``both`` — the two in one job, the grep
pipeline running beside the count in the one streaming query (translators/parts.py). The
variants alternate over ``--rounds``; reported per variant the median wall seconds and events
per second (both sources' events for ``both``), and ``one_job_vs_two`` = the two jobs' summed
median seconds over the one job's (above 1: one job is faster). Every run is verified: each
key's last count equals the generator's, the grep count the generator's matches.

    python benchmarks/unrelated_pipelines.py --events 2000000 --rounds 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ["PYSPARK_PYTHON"] = sys.executable

KEYS = 1_000
PATTERN = r"[a-z]+ [a-z]+ "  # two words and nothing else: a few percent of the sentences


def _run(spark, variant: str, events: int, root: str) -> dict:
    from pyspark.sql import functions as F

    from ember import CollectSink, CountSink, StreamEnvironment
    from ember.connectors.generators import GrepSource, GroupingSource

    env = StreamEnvironment(master="local[2]", checkpoint_dir=root, spark=spark, parallelism=2)
    counts, matches = CollectSink(), CountSink()
    records = GroupingSource(partitions=2, hosts=KEYS, max_events=events)
    sentences = GrepSource(partitions=2, max_events=events)
    if variant in ("count", "both"):
        (env.from_source(records, name="records").select("host_id", "1 AS n", name="ones").key_by("host_id")
            .sum("n", emit="batch", name="running-count").sink_to(counts, name="counts"))
    if variant in ("grep", "both"):
        (env.from_source(sentences, name="sentences").filter(F.col("sentence").rlike(f"^{PATTERN}$"), name="grep")
            .sink_to(matches, name="matches"))
    started = time.monotonic()
    result = env.execute(f"unrelated-{variant}", progress=False)
    seconds = time.monotonic() - started
    verified = True
    if variant in ("count", "both"):
        latest: dict[int, int] = {}
        for row in counts.rows():
            latest[row["host_id"]] = max(latest.get(row["host_id"], 0), row["n"])
        expected = {k: events // KEYS + (1 if k < events % KEYS else 0) for k in range(min(KEYS, events))}
        verified &= latest == expected
    if variant in ("grep", "both"):
        verified &= matches.count == sentences.expected_matches(PATTERN, 0, events)
    return {"variant": variant, "seconds": seconds, "events": result.events, "batches": result.batches,
            "verified": bool(verified), "matches": matches.count if variant != "count" else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2_000_000, help="events per source")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from ember import StreamEnvironment

    spark = StreamEnvironment(master="local[2]", parallelism=2).spark
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ember-unrelated-") as tmp:
        _run(spark, "both", 20_000, os.path.join(tmp, "warm"))  # Python workers started, code paths warm
        for r in range(args.rounds):
            for variant in ("count", "grep", "both") if r % 2 == 0 else ("both", "grep", "count"):
                out = _run(spark, variant, args.events, os.path.join(tmp, f"{variant}-{r}"))
                runs.append(out)
                if not args.json:
                    print(f"round {r + 1} {variant:5}: {out['seconds']:.1f} s, {out['events']:,} events, "
                          f"verified={out['verified']}", flush=True)
    per = {}
    for variant in ("count", "grep", "both"):
        mine = [r for r in runs if r["variant"] == variant]
        seconds = statistics.median(r["seconds"] for r in mine)
        events = statistics.median(r["events"] for r in mine)
        per[variant] = {"seconds": round(seconds, 2), "events_per_second": round(events / seconds),
                        "verified": all(r["verified"] for r in mine), "runs": [round(r["seconds"], 2) for r in mine],
                        "batches": [r["batches"] for r in mine]}
    report = {"events_per_source": args.events, "rounds": args.rounds, "variants": per,
              "one_job_vs_two": round((per["count"]["seconds"] + per["grep"]["seconds"]) / per["both"]["seconds"], 2),
              "verified": all(v["verified"] for v in per.values())}
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0 if report["verified"] else 1


if __name__ == "__main__":
    sys.exit(main())
