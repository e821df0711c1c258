"""Decoding Yahoo JSON events: Ember's decoder against Arrow's reader and Spark's from_json.

The same N Yahoo events as JSON strings, cached in Spark (2 partitions), decoded to the
four fields the pipeline uses, forced with Spark's ``noop`` writer, in one process,
rounds alternating:

- ``ember``: Ember's ``decode_json`` (the compiled single-pass scanner, json_scan.py) in
  ``mapInArrow`` — what ``parse_json`` and ``RedisStreamSource(json_field=...)`` run;
- ``arrow``: the reference decoder alone (Arrow's JSON reader over a whole batch), what
  ``decode_json`` was before the scanner;
- ``spark``: Spark's ``from_json`` with the same schema (what hand-written PySpark does).

Batch queries over cached input, so the figures isolate decoding from sources and
micro-batch overhead. Prints events/s per side (median of rounds) and the ratio.

    .venv/bin/python benchmarks/json_decode.py [--events 2000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

FIELDS = (("ad_id", "string", False), ("event_type", "string", False), ("event_time", "string", False),
          ("user_id", "string", True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from ember.connectors.generators import YahooSource
    from ember.runner.spark.json_decode import decode_json

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "65536").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    source = YahooSource(partitions=1, seed=1)
    texts = []
    for a in range(0, args.events, 500_000):
        seq = np.arange(a, min(args.events, a + 500_000), dtype=np.int64)
        texts.extend(json.dumps(r, separators=(",", ":")) for r in source.records(seq, 1_700_000_000_000))
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(tempfile.mkdtemp(prefix="ember-json-bench-"), "events.parquet")
    pq.write_table(pa.table({"event": pa.array(texts, pa.string())}), path)  # fast to load, unlike createDataFrame
    df = spark.read.parquet(path).repartition(2).cache()
    assert df.count() == args.events
    out = "ad_id string, event_type string, event_time string, user_id string"

    def decoding(reference: bool):
        def run(batches):
            import pyarrow as pa

            from ember.runner.spark import json_decode as d

            for batch in batches:
                texts = batch.column(0)
                if reference:
                    table, _, reasons = d._check_required(*d._reference(texts, FIELDS, d._suspicious(texts)), FIELDS)
                else:
                    table, _, reasons = decode_json(texts, FIELDS)
                assert not reasons
                yield pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], names=table.column_names)

        return run

    sides = {
        "ember": lambda: df.mapInArrow(decoding(False), out),
        "arrow": lambda: df.mapInArrow(decoding(True), out),
        "spark": lambda: df.select(F.from_json("event", out).alias("j")).select("j.*"),
    }
    for plan in sides.values():  # warm-up: Python workers, JIT
        plan().limit(10_000).write.format("noop").mode("overwrite").save()
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(args.rounds):
        for name in (list(sides) if r % 2 == 0 else list(reversed(sides))):
            t0 = time.perf_counter()
            sides[name]().write.format("noop").mode("overwrite").save()
            rates[name].append(args.events / (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in med.items():
        print(f"{k:6} {v / 1e6:5.2f} M events/s  (rounds: {', '.join(f'{x / 1e6:.2f}' for x in rates[k])})")
    print(f"ratio ember / spark from_json: {med['ember'] / med['spark']:.2f}; ember / arrow reader: "
          f"{med['ember'] / med['arrow']:.2f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
