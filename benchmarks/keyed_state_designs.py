"""Keyed-state design measurement (issue 3): a per-key counter kept by Spark.

Design A ("bucket blob"): ``groupBy(bucket).applyInPandasWithState``; each
bucket's state is one Arrow IPC blob of sorted (key, count) columns, merged
with the batch vectorised (numpy: unique + searchsorted). One Python call
per bucket per batch, no per-key call.

    python benchmarks/keyed_state_designs.py KEYS [ROWS_PER_BATCH] [BUCKETS] [SECONDS]

Prints one JSON line: keys, rows/batch, buckets, events/s (rows / batch
processing time, first 2 batches excluded), median batch ms, peak RSS of the
Python workers (MB) and state size on disk.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np
import pandas as pd
import pyarrow as pa

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout  # noqa: E402

KEYS = int(sys.argv[1])
RPB = int(sys.argv[2]) if len(sys.argv) > 2 else 2_000_000
NB = int(sys.argv[3]) if len(sys.argv) > 3 else 64
SECONDS = float(sys.argv[4]) if len(sys.argv) > 4 else 40

spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000000")
    .config("spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")


def _load(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    t = pa.ipc.open_stream(blob).read_all()
    return t.column("k").to_numpy(), t.column("c").to_numpy()


def _dump(keys: np.ndarray, counts: np.ndarray) -> bytes:
    t = pa.table({"k": keys, "c": counts})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def bucket_counter(key, pdfs, state):
    keys, counts = _load(state.get[0]) if state.exists else (np.empty(0, np.int64), np.empty(0, np.int64))
    rss = 0
    for pdf in pdfs:
        u, n = np.unique(pdf["k"].to_numpy(), return_counts=True)
        pos = np.searchsorted(keys, u)
        hit = (pos < len(keys)) & (keys[np.minimum(pos, len(keys) - 1)] == u) if len(keys) else np.zeros(len(u), bool)
        counts = counts.copy()
        counts[pos[hit]] += n[hit]
        if (~hit).any():
            keys = np.concatenate([keys, u[~hit]])
            counts = np.concatenate([counts, n[~hit]])
            order = np.argsort(keys, kind="stable")
            keys, counts = keys[order], counts[order]
    state.update((_dump(keys, counts),))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    yield pd.DataFrame({"b": [key[0]], "n": [len(keys)], "rss": [rss]})


df = (
    spark.readStream.format("rate-micro-batch").option("rowsPerBatch", RPB).option("numPartitions", 2).load()
    .select(F.pmod(F.xxhash64("value"), F.lit(KEYS)).alias("k"))
    .withColumn("b", F.pmod(F.xxhash64("k"), F.lit(NB)))
    .groupBy("b")
    .applyInPandasWithState(bucket_counter, "b long, n long, rss long", "blob binary", "update", GroupStateTimeout.NoTimeout)
)
peak = {"rss": 0, "keys": 0}


def observe(batch, batch_id):
    row = batch.agg(F.max("rss").alias("rss"), F.sum("n").alias("keys")).collect()[0]
    peak["rss"] = max(peak["rss"], int(row["rss"] or 0))
    peak["keys"] = int(row["keys"] or 0)


ckpt = tempfile.mkdtemp(prefix="ember-keyed-design-")
q = df.writeStream.foreachBatch(observe).outputMode("update").option("checkpointLocation", ckpt).start()
time.sleep(SECONDS)
reports = [json.loads(p.json) for p in q.recentProgress]
while q.status["isTriggerActive"]:
    time.sleep(0.01)
q.stop()
steady = reports[2:] if len(reports) > 4 else reports
ms = [r["durationMs"]["triggerExecution"] for r in steady]
rows = sum(r["numInputRows"] for r in steady)
state_bytes = sum(
    os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(ckpt, "state")) for f in fs
)
print(json.dumps({
    "design": "apws-bucket-blob", "keys": KEYS, "rows_per_batch": RPB, "buckets": NB,
    "events_per_second": round(rows / (sum(ms) / 1000)) if ms else 0, "median_batch_ms": statistics.median(ms) if ms else None,
    "batches": len(reports), "keys_in_state": peak["keys"], "worker_peak_rss_mb": peak["rss"],
    "checkpoint_state_mb": round(state_bytes / 2**20, 1),
}))
