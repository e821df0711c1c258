"""The collecting sink's read of a micro-batch: Spark Rows (``collect`` + ``asDict``) against
Arrow (``toArrow().to_pylist()``, what ``CollectSink`` does for the types where both give the
same Python values: translators/sinks.py ``arrow_collectable``). One Spark session, the two
alternating over a cached DataFrame of ``--rows`` rows (an int, two bigints, a string).

    python benchmarks/collect_sink.py --rows 200000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from ember.bench.harness import bench_session
from ember.runner.spark.translators.sinks import arrow_collectable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spark = bench_session("local[2]")
    df = spark.range(args.rows).selectExpr("CAST(id AS INT) AS address", "id * 3 AS opened", "id * 7 AS closed",
                                           "CAST(id AS STRING) AS s").cache()
    df.count()
    assert arrow_collectable(df.schema)
    times: dict[str, list[float]] = {"rows": [], "arrow": []}
    equal = True
    for _ in range(args.rounds):
        started = time.perf_counter()
        by_rows = [r.asDict(recursive=True) for r in df.collect()]
        times["rows"].append(time.perf_counter() - started)
        started = time.perf_counter()
        by_arrow = df.toArrow().to_pylist()
        times["arrow"].append(time.perf_counter() - started)
        equal = equal and by_rows == by_arrow
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.rows:,} rows: Rows {medians['rows']:.2f} s, Arrow {medians['arrow']:.2f} s "
          f"({medians['rows'] / medians['arrow']:.1f}x); equal: {equal}")
    if args.json:
        print(json.dumps({"rows": args.rows, "seconds": times, "medians": medians, "equal": equal}))
    return 0 if equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
